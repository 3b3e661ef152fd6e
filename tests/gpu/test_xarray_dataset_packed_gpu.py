"""XarrayDataset's float32 batches of packed variables (int16 with scale_factor/add_offset and a
fill) on the GPU equal xarray's decode cast to float32 bit for bit: the device scales in the
type xarray's coders scale in (float64 for float64 attributes), then casts (issue 38 item 15).
Skips without a CUDA device for torch, or without scipy (the writer)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
xr = pytest.importorskip("xarray")
pytest.importorskip("scipy")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device for torch", allow_module_level=True)

from ferry.torch import XarrayDataset  # noqa: E402
from ferry.xarray import FerryBackendEntrypoint  # noqa: E402

ENGINE = "ferry" if "ferry" in xr.backends.list_engines() else FerryBackendEntrypoint


@pytest.mark.parametrize("attr_type", ["float64", "float32"])
def test_packed_float32_on_gpu_equals_xarray_cast(tmp_path, attr_type):
    rng = np.random.default_rng(3)
    t2m = rng.normal(280, 10, (8, 33, 48))
    t2m[2, 1, 1] = np.nan
    ds = xr.Dataset({"t2m": (("time", "lat", "lon"), t2m)},
                    coords={"time": np.arange(8), "lat": np.arange(33.0), "lon": np.arange(48.0)})
    p = str(tmp_path / "packed.nc")
    sc, off = np.dtype(attr_type).type(0.013), np.dtype(attr_type).type(279.37)
    ds.to_netcdf(p, engine="scipy", encoding={"t2m": {"dtype": "int16", "scale_factor": sc, "add_offset": off,
                                                      "_FillValue": -32767}})
    want = xr.open_dataset(p, engine="scipy")["t2m"].values.astype(np.float32)
    got = XarrayDataset(xr.open_dataset(p, engine=ENGINE), ["t2m"], batch_size=4, shuffle=False,
                        device="cuda:0", dtype=torch.float32, return_time=True)
    seen = 0
    for b in got:
        assert b["x"].device.type == "cuda"
        for k, t in enumerate(b["time"].cpu().numpy()):
            np.testing.assert_array_equal(b["x"][k, 0].cpu().numpy(), want[int(t)])
            seen += 1
    assert seen == 8
