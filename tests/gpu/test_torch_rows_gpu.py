"""ArrayDataset's row plan into device memory: a shuffled batch drawn from several shards
reaches the engine in batch order (Plan.read_files_runs), so each packed staging buffer holds
rows adjacent in the batch and goes to the device as plain copies, with no scatter kernel
(a kernel on the engine's streams competes with the training step for the SMs). The plan is
built by the dataset's own _plan_rows into a device array ferry allocates, so this runs on the
simulated driver (tests/cudasim, which counts kernel launches) as well as on a GPU, where
the bytes are checked and the launch count is not visible."""
import ctypes

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ferry_arrays  # noqa: E402
from ferry import _ferry as F  # noqa: E402
from ferry import torch as ft  # noqa: E402


def _sim_count():
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        fn = lib.cudasim_count
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_long
    fn.argtypes = [ctypes.c_char_p, ctypes.c_int]
    return lambda what: fn(what.encode(), 0)


def test_shuffled_rows_of_four_shards_need_no_scatter_kernel(ctx, tmp_path):
    rng = np.random.default_rng(11)
    row = (5, 10001)                           # 50,005-byte rows: odd sizes and offsets
    parts = [rng.integers(0, 256, (n,) + row, dtype=np.uint8) for n in (48, 31, 48, 40)]
    paths = []
    for i, a in enumerate(parts):
        paths.append(str(tmp_path / f"s{i}.npy"))
        np.save(paths[-1], a)
    ref = np.concatenate(parts)
    ds = ft.ArrayDataset(paths, batch_size=128, shuffle=True, seed=3, device="cpu")
    field = ds._fields[0]
    rt = ft._Runtime(ctx, torch.device("cpu"))     # the handle cache; the destination is ferry's
    ids = ft.epoch_order(len(ref), 3, 0)[:128]
    assert len(np.unique(np.searchsorted(field.starts, ids, side="right"))) == 4
    dst = ferry_arrays.full(ctx, (len(ids),) + row, np.uint8)
    ptr = dst.__cuda_array_interface__["data"][0]
    count = _sim_count()
    before = count("launches") if count else 0
    plan, handles = F.Plan(), []
    ft._plan_rows(rt, plan, field, ids, ptr, dst.nbytes, 0, handles)
    ctx.run(plan)
    np.testing.assert_array_equal(ferry_arrays.to_numpy(ctx, dst, np.uint8), ref[ids])
    if count:
        assert count("launches") - before == 0, "rows in batch order need no scatter kernel"
    rt.close()
