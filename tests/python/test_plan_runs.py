"""Plan.read_file_runs: N plain reads of one file in one call (the loaders' batch of token
windows or row runs). Checked byte for byte against numpy slicing of the same file, and every
bad argument is refused before anything is added to the plan."""
import numpy as np
import pytest

import ferry
from ferry import _ferry


@pytest.fixture
def blob(tmp_path):
    rng = np.random.default_rng(7)
    data = rng.integers(0, 256, size=(1 << 20) + 13, dtype=np.uint8)
    p = tmp_path / "runs.bin"
    data.tofile(p)
    return str(p), data


def test_runs_match_numpy_slicing(ctx, blob):
    path, data = blob
    rng = np.random.default_rng(1)
    f = ferry.File(ctx, path)
    for n, dtype in ((1, np.int64), (257, np.int64), (300, np.uint64)):
        lens = rng.integers(0, 5000, size=n)
        offs = rng.integers(0, len(data) - lens)            # every run inside the file
        doffs = np.concatenate(([0], np.cumsum(lens)[:-1]))
        dst = np.full(int(lens.sum()) + 8, 0xEE, np.uint8)
        plan = ferry.Plan()
        assert plan.read_file_runs(f, offs.astype(dtype), lens.astype(dtype), dst, doffs.astype(dtype)) == n
        assert len(plan) == n and plan.file_bytes == lens.sum()
        assert ctx.run(plan) == lens.sum()
        want = np.concatenate([data[o:o + l] for o, l in zip(offs, lens)])
        assert np.array_equal(dst[:len(want)], want)
        assert (dst[len(want):] == 0xEE).all()
    f.close()


def test_scalar_length_and_scattered_destination(ctx, blob):
    """One int length for every run (fixed windows); destinations out of order."""
    path, data = blob
    f = ferry.File(ctx, path)
    w = 8193
    offs = np.array([0, len(data) - w, 4096, 12345, 4096], np.int64)
    order = np.array([3, 0, 4, 1, 2], np.int64)
    dst = np.zeros(len(offs) * w, np.uint8)
    plan = ferry.Plan()
    plan.read_file_runs(f, offs, w, dst, order * w)
    ctx.run(plan)
    for j, o in zip(order, offs):
        assert np.array_equal(dst[j * w:(j + 1) * w], data[o:o + w])
    f.close()


def test_empty_runs_add_nothing(ctx, blob):
    f = ferry.File(ctx, blob[0])
    plan = ferry.Plan()
    e = np.zeros(0, np.int64)
    assert plan.read_file_runs(f, e, e, bytearray(10), e) == 0
    assert len(plan) == 0
    f.close()


def _refused(plan, exc, *args, match=None):
    with pytest.raises(exc, match=match):
        plan.read_file_runs(*args)
    assert len(plan) == 0                                   # all checked before any is added


def test_bad_runs_are_refused_naming_file_and_run(ctx, blob):
    path, _ = blob
    f = ferry.File(ctx, path)
    plan = ferry.Plan()
    dst = np.zeros(1000, np.uint8)
    offs = np.array([0, 10, 20], np.int64)
    d0 = np.array([0, 100, 200], np.int64)
    # run 2 does not fit the destination
    with pytest.raises(ferry.FerryError) as ei:
        plan.read_file_runs(f, offs, np.array([100, 100, 801], np.int64), dst, d0)
    assert ei.value.code == _ferry.EINVAL and "runs.bin" in str(ei.value) and "run 2" in str(ei.value)
    assert len(plan) == 0
    # dst offset past the end
    _refused(plan, ferry.FerryError, f, offs, 1, dst, np.array([0, 1, 1001], np.int64), match="run 2")
    # negative values in int64 arrays
    _refused(plan, ferry.FerryError, f, np.array([0, -1, 0], np.int64), 10, dst, d0, match="run 1.*negative")
    _refused(plan, ferry.FerryError, f, offs, np.array([10, 10, -5], np.int64), dst, d0, match="run 2")
    _refused(plan, ferry.FerryError, f, offs, 10, dst, np.array([-8, 0, 0], np.int64), match="run 0")
    # offset + length past the largest file offset (overflow)
    big = np.array([0, 2**63 - 5, 0], np.uint64)
    _refused(plan, ferry.FerryError, f, big, 10, dst, d0, match="run 1.*largest file offset")
    _refused(plan, ferry.FerryError, f, np.array([2**64 - 1], np.uint64), 1, dst, np.zeros(1, np.int64),
             match="run 0")
    # lengths that differ in count
    _refused(plan, ValueError, f, offs, np.array([1, 2], np.int64), dst, d0)
    _refused(plan, ValueError, f, offs, 1, dst, d0[:2])
    # not int64/uint64 contiguous 1-D arrays
    _refused(plan, TypeError, f, offs.astype(np.int32), 1, dst, d0)
    _refused(plan, TypeError, f, offs.astype(np.float64), 1, dst, d0)
    _refused(plan, TypeError, f, np.zeros(6, np.int64)[::2], 1, dst, d0)
    _refused(plan, TypeError, f, offs.reshape(3, 1), 1, dst, d0)
    _refused(plan, TypeError, f, [0, 10, 20], 1, dst, d0)
    _refused(plan, TypeError, f, offs, 1, dst, 0)                      # dst_offsets is no scalar
    _refused(plan, OverflowError, f, offs, -1, dst, d0)                 # scalar length < 0
    # a read-only destination
    _refused(plan, ValueError, f, offs, 1, bytes(1000), d0)
    f.close()
    _refused(plan, ValueError, f, offs, 1, dst, d0)                     # closed file


def test_runs_keep_file_and_destination_alive(ctx, blob):
    """The plan holds the file and destination (as read_file does): dropping the caller's
    references before the run is safe."""
    import gc
    path, data = blob
    plan = ferry.Plan()
    dst = np.zeros(64, np.uint8)
    plan.read_file_runs(ferry.File(ctx, path), np.array([5, 500], np.int64), 32, dst,
                        np.array([32, 0], np.int64))
    gc.collect()
    ctx.run(plan)
    assert dst[:32].tobytes() == data[500:532].tobytes() and dst[32:].tobytes() == data[5:37].tobytes()
