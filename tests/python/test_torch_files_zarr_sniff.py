"""ArrayDataset(samples="files") tells a Zarr store from a directory of sample
files with the C library's sniffer (ferry_format_detect), not its own look for
zarr.json / .zarray (issue 10 item 3): a v2 group store, whose root has only
.zgroup, is one sample like a v2 array store or a v3 store, not a directory
with "no .npy or .safetensors files"."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
zarr = pytest.importorskip("zarr")

from ferry import torch as ft  # noqa: E402


@pytest.mark.parametrize("zf", [2, 3])
def test_zarr_group_store_is_one_sample(tmp_path, zf):
    p = tmp_path / "g.zarr"
    g = zarr.open_group(str(p), mode="w", zarr_format=zf)
    a = g.create_array("x", shape=(4, 3), dtype="f4")
    a[:] = np.arange(12, dtype="f4").reshape(4, 3)
    for spec in (p, p / "x"):                    # the group store, and its array
        ds = ft.ArrayDataset(fields={"x": str(spec)}, samples="files", batch_size=1)
        assert len(ds) == 1
        got = next(iter(ds))["x"]
        assert torch.equal(got[0], torch.arange(12, dtype=torch.float32).reshape(4, 3))
