"""XarrayDataset's batches per read when batches_per_read=None: on a GPU the engine says how large a
job of the data should be (Context.job_bytes, ferry_plan_job_bytes), from a plan of one row that is
never run. netCDF-4 deflate and Zarr zstd ask for 2.5 GiB a job (nvCOMP's decoders fill the GPU
only with thousands of chunks at once): here the most, 64 batches, three groups in flight (two
in the engine); netCDF-3
(nothing to decode) keeps 1 and the prefetch's depth. Runs on the stand-in driver and nvCOMP (tests/cudasim) as on a GPU: only the plan is made,
with the runtime's device set to CUDA device 0; the batches of a real GPU are checked in
test_xarray_dataset_gpu.py."""
import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")
xr = pytest.importorskip("xarray")

from ferry.torch import XarrayDataset  # noqa: E402
from ferry.xarray import FerryBackendEntrypoint  # noqa: E402
from step_files import write_step_chunked  # noqa: E402

T, H, W = 12, 33, 48


def _files(tmp_path, fmt):
    rng = np.random.default_rng(3)
    ds = xr.Dataset({"t2m": (("time", "lat", "lon"), rng.normal(280, 10, (T, H, W)).astype(np.float32)),
                     "sp": (("time", "lat", "lon"), rng.normal(1e5, 50, (T, H, W)).astype(np.float32))},
                    coords={"time": pd.date_range("2001-01-01", periods=T, freq="h")})
    p = str(tmp_path / f"g.{fmt}")
    if fmt == "nc3":
        ds.to_netcdf(p, engine="scipy")
    else:
        write_step_chunked(ds, p, fmt)
    return p


def _group_on_cuda(ds, depth=None):
    """ds._read_group on a runtime whose device is CUDA device 0 (the probe plan only); with
    `depth`, also the groups in flight it allows for that many asked: (group, depth)."""
    rt = ds._runtime(torch.device("cpu"), False, 1)
    if rt.ctx.cuda_device_count() == 0:
        pytest.skip("no CUDA driver (real or stand-in)")
    if "loaded" not in (rt.ctx.nvcomp_status or ""):
        pytest.skip("nvCOMP not loaded: " + (rt.ctx.nvcomp_status or "?"))
    cpu = rt.device
    rt.device = torch.device("cuda", 0)
    try:
        g = ds._read_group(rt)
        return g if depth is None else (g, ds._read_depth(rt, depth))
    finally:
        rt.device = cpu


@pytest.mark.parametrize("fmt,want", [("nc4", 64), ("nc3", 1), ("zarr", 64)])
def test_auto_group_follows_the_engine(tmp_path, fmt, want):
    p = _files(tmp_path, fmt)
    src = xr.open_dataset(p, engine=FerryBackendEntrypoint, device="cpu")
    ds = XarrayDataset(src, ["t2m", "sp"], batch_size=2, device="cpu")
    assert ds.batch_group == 1                 # until a GPU iteration resolves it
    # 2 variables x 2 steps x 33 x 48 float32 a batch: 2.5 GiB is far more than 64 batches; such
    # groups are three in flight (the one handed out and two in the engine, at most two of
    # them submitted at once), whatever prefetch asks; prefetch=0 keeps no read-ahead
    assert _group_on_cuda(ds, depth=5) == (want, 3 if want > 1 else 5)
    assert ds.batch_group == want
    if want > 1:
        assert _group_on_cuda(ds, depth=1) == (want, 1)
    rt = ds._runtime(torch.device("cpu"), False, 1)
    rt.device = torch.device("cuda", 0)
    try:
        assert ds._engine_jobs(rt) == (2 if want > 1 else None)
    finally:
        rt.device = torch.device("cpu")
    # the user's value is kept; on the CPU the automatic one is 1
    ds3 = XarrayDataset(src, ["t2m", "sp"], batch_size=2, device="cpu", batches_per_read=3)
    assert _group_on_cuda(ds3) == 3
    assert XarrayDataset(src, ["t2m", "sp"], batch_size=2, device="cpu")._read_group(
        ds._runtime(torch.device("cpu"), False, 1)) == 1


def test_auto_group_beside_a_model_that_fills_the_device(tmp_path, monkeypatch):
    """The stand-in's device nearly full (FERRY_CUDASIM_MEM: what is allocated plus a little): the
    group comes from ferry_plan_budget, which counts the groups and their decode buffers against
    the free memory less what it keeps for the model (64 MiB at least): with 320 MiB free the
    2.5 GiB it asks is far more than 64 batches, so 64, two in the engine; with 64 MiB free not
    even one batch a read fits, and the dataset says so (what it needs, how to lower it) before it
    allocates anything, instead of the model's next allocation failing."""
    import ctypes
    import ferry
    try:
        count = ctypes.CDLL("libcuda.so.1").cudasim_count
    except (OSError, AttributeError):
        pytest.skip("needs the stand-in driver (tests/cudasim)")
    count.restype, count.argtypes = ctypes.c_long, [ctypes.c_char_p, ctypes.c_int]
    src = xr.open_dataset(_files(tmp_path, "zarr"), engine=FerryBackendEntrypoint, device="cpu")
    ds = XarrayDataset(src, ["t2m", "sp"], batch_size=2, device="cpu")
    monkeypatch.setenv("FERRY_CUDASIM_MEM", str(max(1, count(b"device_live", 0)) + (320 << 20)))
    assert _group_on_cuda(ds, depth=5) == (64, 3)
    small = XarrayDataset(src, ["t2m", "sp"], batch_size=2, device="cpu")
    monkeypatch.setenv("FERRY_CUDASIM_MEM", str(max(1, count(b"device_live", 0)) + (64 << 20)))
    with pytest.raises(ferry.FerryError, match=r"needs \d+ MiB at least .* decode on the CPU"):
        _group_on_cuda(small)
