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
import ferry.torch.runtime as ft_runtime  # noqa: E402
import ferry.torch.sources as ft_sources  # noqa: E402


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
    rt = ft_runtime._Runtime(ctx, torch.device("cpu"))     # the handle cache; the destination is ferry's
    ids = ft.epoch_order(len(ref), 3, 0)[:128]
    assert len(np.unique(np.searchsorted(field.starts, ids, side="right"))) == 4
    dst = ferry_arrays.full(ctx, (len(ids),) + row, np.uint8)
    ptr = dst.__cuda_array_interface__["data"][0]
    count = _sim_count()
    before = count("launches") if count else 0
    plan, handles = F.Plan(), []
    ft_sources._plan_rows(rt, plan, field, ids, ptr, dst.nbytes, 0, handles)
    ctx.run(plan)
    np.testing.assert_array_equal(ferry_arrays.to_numpy(ctx, dst, np.uint8), ref[ids])
    if count:
        assert count("launches") - before == 0, "rows in batch order need no scatter kernel"
    rt.close()


def test_token_windows_of_three_files_need_no_scatter_kernel(ctx, tmp_path):
    """A TokenDataset read over several token files keeps batch order too."""
    rng = np.random.default_rng(12)
    L = 2047                                            # 4 KiB windows of uint16 tokens
    toks = [rng.integers(0, 60000, n, dtype=np.uint16) for n in (L * 40 + 1, L * 25 + 1, L * 33 + 1)]
    for i, t in enumerate(toks):
        t.tofile(tmp_path / f"t{i}.bin")
    ds = ft.TokenDataset(str(tmp_path / "t*.bin"), seq_len=L, batch_size=64, device="cpu", seed=2)
    field = ds._fields[0]
    rt = ft_runtime._Runtime(ctx, torch.device("cpu"))
    ids = np.asarray(ds._order(0).take(np.arange(64, dtype=np.int64)), dtype=np.int64)
    k = np.searchsorted(field.starts, ids, side="right") - 1
    assert len(np.unique(k)) == 3
    dst = ferry_arrays.full(ctx, (64, L + 1), np.uint16)

    class Dev:                  # the dataset's allocation, replaced by ferry's device array
        _staging = {}

        def _alloc(self, rt, shape, dtype, *staging):
            return _Wrap(dst)

    class G:
        handles = []
    count = _sim_count()
    before = count("launches") if count else 0
    plan = F.Plan()
    field.read(Dev(), rt, plan, ids, G())
    ctx.run(plan)
    want = np.stack([toks[kk][(i - field.starts[kk]) * L:(i - field.starts[kk]) * L + L + 1]
                     for kk, i in zip(k, ids)])
    np.testing.assert_array_equal(ferry_arrays.to_numpy(ctx, dst, np.uint16), want)
    if count:
        assert count("launches") - before == 0, "windows in batch order need no scatter kernel"
    rt.close()


class _Wrap:
    """A ferry device array seen through the three tensor attributes the field's read uses."""
    def __init__(self, a):
        self.a, self.is_cuda = a, True
        self.device = torch.device("cuda", 0) if torch.cuda.is_available() else type("D", (), {"index": 0})()

    def data_ptr(self):
        return self.a.__cuda_array_interface__["data"][0]
