"""Plan.read_rows (python/ferry/ext/rows.c): rows of several arrays planned in one call — a
chunked HDF5 variable and a netCDF-3 one, both of ferry's own Dataset, side by side — read
what numpy indexing gives, go where their offsets say, and a refused call adds nothing."""
import numpy as np
import pytest

import ferry

T, H, W = 9, 6, 10


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """An HDF5 variable (gzip + shuffle, chunks of one step and half the grid, the chunks of step 4
    never written: fill -3) and a netCDF-3 variable (ferry's Dataset), opened by ferry.xarray's store."""
    h5py = pytest.importorskip("h5py")
    xr = pytest.importorskip("xarray")
    pytest.importorskip("scipy")
    fx = pytest.importorskip("ferry.xarray")
    d = tmp_path_factory.mktemp("rows")
    rng = np.random.default_rng(5)
    a = rng.integers(-1000, 1000, (T, H, W)).astype("<i4")
    with h5py.File(d / "a.h5", "w") as f:
        v = f.create_dataset("a", shape=a.shape, dtype="<i4", chunks=(1, 3, 5), shuffle=True, compression="gzip",
                             fillvalue=-3)
        v[0:4] = a[0:4]               # step 4 never written: its chunks absent, read as the fill
        v[5:] = a[5:]
    with h5py.File(d / "a.h5", "r") as f:
        a = f["a"][()]
        origins = []
        f["a"].id.chunk_iter(lambda i: origins.append(i.chunk_offset[0]))
    assert 4 not in origins and (a[4] == -3).all()
    b = rng.standard_normal((T, H, W)).astype("f4")
    xr.Dataset({"b": (("t", "y", "x"), b)}).to_netcdf(d / "b.nc", engine="scipy", format="NETCDF3_64BIT")
    sa, sb = fx.FerryStore(str(d / "a.h5")), fx.FerryStore(str(d / "b.nc"))
    assert sa.specs["a"].kind == "ferry" and sb.specs["b"].kind == "ferry"
    yield (sa, a), (sb, b)
    sa.close()
    sb.close()


def _rows_plan(stores, rows, sel_yx):
    """Both arrays' rows in one call into one slab (R, 2, h, w) int32/float32 bytes, as
    XarrayDataset lays a row's channels out; returns the plan and the slab."""
    (sa, _), (sb, _) = stores
    (ys, ye, yst), (xs, xe, xst) = sel_yx
    h, w = len(range(ys, ye, yst)), len(range(xs, xe, xst))
    R, plane = len(rows), h * w * 4
    slab = np.full(R * 2 * h * w, 0x7F7F7F7F, "<u4")
    dst = (slab.ctypes.data, slab.nbytes, -1)
    offs = np.array([[r * 2 * plane + k * plane for k in range(2)] for r in range(R)], np.int64).reshape(-1)
    plan = ferry.Plan()
    srcs = [sa._row_source(sa.specs["a"]), sb._row_source(sb.specs["b"])]
    sels = [[(0, 1, 1), (ys, ye, yst), (xs, xe, xst)]] * 2
    n = plan.read_rows(srcs, sels, np.asarray(rows, np.int64), [dst, dst], offs)
    assert n == R * 2 * plane
    return plan, slab.reshape(R, 2, h, w)


@pytest.mark.parametrize("rows,sel_yx", [([7, 0, 3, 3, 4], ((0, 6, 1), (0, 10, 1))),
                                         ([4, 8, 1], ((1, 5, 2), (3, 10, 3))),
                                         ([2], ((0, 6, 1), (4, 6, 1)))])
def test_rows_of_two_arrays_in_one_call(stores, rows, sel_yx):
    (_, a), (_, b) = stores
    plan, slab = _rows_plan(stores, rows, sel_yx)
    ferry.default_context().run(plan)
    key = (np.asarray(rows),) + tuple(slice(*t) for t in sel_yx)
    np.testing.assert_array_equal(slab[:, 0].view("<i4"), a[key])     # fills of the absent chunks too
    np.testing.assert_array_equal(slab[:, 1].view("<f4"), b[key])


def test_refused_calls_add_nothing(stores):
    (sa, _), (sb, _) = stores
    la = sa._row_source(sa.specs["a"])
    out = np.zeros(2 * H * W, "<i4")
    dst = (out.ctypes.data, out.nbytes, -1)
    plan = ferry.Plan()
    whole = [[(0, 1, 1), (0, H, 1), (0, W, 1)]]
    with pytest.raises(IndexError, match=r"row 1: index 9 outside the 9 of a"):
        plan.read_rows([la], whole, np.array([0, 9], np.int64), [dst], np.array([0, H * W * 4], np.int64))
    with pytest.raises(ValueError, match="do not fit"):       # the second row would pass the end
        plan.read_rows([la], whole, np.array([0, 1], np.int64), [dst], np.array([0, H * W * 4 + 4], np.int64))
    with pytest.raises(ValueError, match="dst_offsets"):
        plan.read_rows([la], whole, np.array([0, 1], np.int64), [dst], np.array([0], np.int64))
    with pytest.raises(ValueError, match="one each"):
        plan.read_rows([la, la], whole, np.array([0], np.int64), [dst], np.array([0, 0], np.int64))
    with pytest.raises(TypeError, match="not a layout"):
        plan.read_rows(["a"], whole, np.array([0], np.int64), [dst], np.array([0], np.int64))
    with pytest.raises(TypeError, match="int64"):
        plan.read_rows([la], whole, np.array([0.0]), [dst], np.array([0], np.int64))
    assert len(plan) == 0
    # None: the whole of the other dimensions
    assert plan.read_rows([la], [None], np.array([1, 0], np.int64), [dst], np.array([0, H * W * 4], np.int64)) \
        == 2 * H * W * 4


def test_the_same_plan_as_one_call_a_row(stores):
    """What XarrayDataset planned before, one Plan.layout / Plan.read a row and array: the same
    extents (count and file bytes) and, run, the same bytes."""
    (sa, a), (sb, b) = stores
    rows, sel_yx = [6, 2, 2, 8], ((1, 6, 1), (0, 10, 2))
    plan, slab = _rows_plan(stores, rows, sel_yx)
    h, w = slab.shape[2:]
    plane = h * w * 4
    loop = np.full(slab.size, 0x7F7F7F7F, "<u4")
    one = ferry.Plan()
    tail = [tuple(t) for t in sel_yx]
    for r, t in enumerate(rows):
        for k, (st, name) in enumerate(((sa, "a"), (sb, "b"))):
            dst = (loop.ctypes.data + (r * 2 + k) * plane, plane, -1)
            st._plan_triples(one, st.specs[name], [(t, t + 1, 1)] + tail, dst)
    assert len(one) == len(plan) and one.file_bytes == plan.file_bytes
    ferry.default_context().run(plan)
    ferry.default_context().run(one)
    np.testing.assert_array_equal(loop.reshape(slab.shape), slab)


def _runs_reference(starts, nrows, ids):
    """numpy's answer: shard by searchsorted, runs broken where a row does not follow its
    neighbour in the same shard."""
    k = np.searchsorted(starts, ids, side="right") - 1
    local = ids - starts[k]
    brk = np.flatnonzero((np.diff(ids) != 1) | (np.diff(k) != 0)) + 1
    lo = np.concatenate(([0], brk)) if len(ids) else np.zeros(0, np.int64)
    hi = np.concatenate((brk, [len(ids)])) if len(ids) else np.zeros(0, np.int64)
    return np.stack([k[lo], local[lo], hi - lo, lo]).astype(np.int64)


def test_row_runs_match_numpy_and_refuse_bad_rows():
    """_ferry.row_runs (ferry_row_runs, the runs ArrayDataset plans a batch's rows as) gives
    numpy's runs over shards, empty shards included; a row outside the set is an IndexError
    naming it, bad shard starts a ValueError."""
    from ferry import _ferry
    rng = np.random.default_rng(3)
    starts = np.array([0, 5, 5, 12, 30], np.int64)     # shard 1 empty
    nrows = 41
    for ids in (np.arange(41, dtype=np.int64), rng.permutation(41).astype(np.int64),
                np.array([3, 4, 5, 6, 11, 12, 40], np.int64), np.zeros(0, np.int64),
                np.sort(rng.choice(41, 20, replace=False)).astype(np.int64)):
        out = np.empty((4, len(ids)), np.int64)
        n = _ferry.row_runs(starts, nrows, ids, out)
        assert np.array_equal(out[:, :n], _runs_reference(starts, nrows, ids))
    out = np.empty((4, 2), np.int64)
    with pytest.raises(IndexError, match="position 1 is row 41, outside"):
        _ferry.row_runs(starts, nrows, np.array([0, 41], np.int64), out)
    with pytest.raises(ValueError, match="shard 2 starts at row 4"):
        _ferry.row_runs(np.array([0, 5, 4], np.int64), nrows, np.array([0, 1], np.int64), out)
