"""One file per chunk into GPU memory (issue 14): a Zarr store's uncompressed
chunk files go through packed staging (several chunk files per staging buffer
and copy) like plain extents, absent chunks get the fill value through the
same staging buffers, compared with zarr-python's read. Skips without a GPU
or zarr."""
import os

import numpy as np
import pytest

zarr = pytest.importorskip("zarr", reason="zarr-python is not installed")

import ferry_arrays  # noqa: E402
from ferry import _ferry as F  # noqa: E402


def make_store(tmp_path, nt, ny, nx, fill, drop):
    p = str(tmp_path / "s.zarr")
    g = zarr.open_group(p, mode="w", zarr_format=3)
    a = g.create_array("v", shape=(nt, ny, nx), chunks=(1, ny, nx), dtype="float32", compressors=None,
                       fill_value=fill)
    data = np.random.default_rng(nt).standard_normal((nt, ny, nx)).astype(np.float32)
    for t in range(nt):
        if t not in drop:
            a[t] = data[t]
    return p, np.asarray(zarr.open_array(p + "/v", mode="r")[...])


@pytest.mark.parametrize("nt,ny,nx", [(64, 16, 24), (24, 181, 360)])
def test_chunk_files_to_gpu_packed_with_fills(ctx, tmp_path, nt, ny, nx):
    ctx = F.Context(threads=2)   # two workers: packs of about a quarter of the bytes each
    drop = {0, 5, 6, nt - 1}
    p, want = make_store(tmp_path, nt, ny, nx, -7.25, drop)
    assert not os.path.exists(p + "/v/c/5/0/0")
    ds = F.Dataset(ctx, p)
    dst = ferry_arrays.full(ctx, (nt, ny, nx), np.float32)
    plan = F.Plan()
    plan.read(ds, "v", dst, None, True)
    ctx.reset_stats()
    ctx.run(plan)
    staged = ctx.stats()["staged"]["ops"]
    ds.close()
    got = ferry_arrays.to_numpy(ctx, dst, np.float32)
    assert got.tobytes() == want.tobytes()
    # packs of chunk files, not one staged copy per chunk file (before: nt ops)
    assert 1 <= staged < nt // 2, staged
    ctx.close()
