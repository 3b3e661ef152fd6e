"""The C planner seen from Python: _ferry.normalize_selection against numpy's
own indexing, and ferry_plan_layout (Plan.layout) on HDF5 chunk tables h5py
writes, including chunks stored with a filter skipped and tables that lie."""
import random

import numpy as np
import pytest

import ferry
from ferry import _ferry


def _gather(a, triples, squeeze):
    """What a plan of (triples, squeeze) reads from a, as numpy would give it."""
    if triples is None:
        return a
    out = a[tuple(slice(*t) for t in triples)]
    return out.reshape([n for i, n in enumerate(out.shape) if i not in squeeze])


def _random_key(rng, shape):
    key = []
    for n in shape:
        r = rng.randrange(5)
        if r == 0 and n:
            key.append(rng.randrange(-n, n))
        elif r == 1:
            key.append(slice(rng.randrange(-n - 2, n + 3), rng.randrange(-n - 2, n + 3), rng.randrange(1, 5)))
        elif r == 2:
            key.append(slice(None, rng.randrange(-n - 1, n + 2)))
        elif r == 3:
            key.append(np.int64(rng.randrange(n)) if n else slice(None))
        else:
            key.append(slice(None))
    if key and rng.random() < 0.3:   # an Ellipsis in place of a run of whole axes
        i = rng.randrange(len(key))
        j = rng.randrange(i, len(key) + 1)
        key[i:j] = [Ellipsis]
    elif rng.random() < 0.3:         # fewer indices than axes
        key = key[:rng.randrange(len(key) + 1)]
    return tuple(key)


def test_normalize_selection_is_numpy_indexing():
    rng = random.Random(7)
    for _ in range(400):
        shape = tuple(rng.randrange(0, 6) for _ in range(rng.randrange(0, 4)))
        a = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
        key = _random_key(rng, shape)
        triples, out_shape, squeeze = _ferry.normalize_selection(shape, key)
        want = a[key]
        got = _gather(a, triples, squeeze)
        np.testing.assert_array_equal(got, want, err_msg=f"{shape} {key}")
        assert tuple(n for i, n in enumerate(out_shape) if i not in squeeze) == want.shape
        assert all(t[2] > 0 and 0 <= t[0] <= t[1] <= max(n, 0) for t, n in zip(triples, shape))


def test_normalize_selection_forms_and_errors():
    assert _ferry.normalize_selection((4, 5), None) == (None, (4, 5), ())
    assert _ferry.normalize_selection((4, 5), [(1, 3), (0, 5, 2)]) == ([(1, 3, 1), (0, 5, 2)], (2, 3), ())
    assert _ferry.normalize_selection((4, 5), -1) == ([(3, 4, 1), (0, 5, 1)], (1, 5), (0,))
    assert _ferry.normalize_selection((4,), slice(3, 1)) == ([(0, 0, 1)], (0,), ())
    assert ferry.normalize_selection((1, Ellipsis), (4, 5, 6))[0] == [(1, 2, 1), (0, 5, 1), (0, 6, 1)]
    for bad, exc in ((slice(None, None, -1), IndexError), (4, IndexError), (-5, IndexError),
                     ((0, 0, 0), IndexError), ((Ellipsis, Ellipsis), IndexError), (1.5, TypeError),
                     ("a", TypeError)):
        with pytest.raises(exc):
            _ferry.normalize_selection((4,), bad)


def _h5_file(tmp_path):
    h5py = pytest.importorskip("h5py")
    rng = np.random.default_rng(3)
    data = rng.integers(0, 1000, (9, 10)).astype("<i4")
    p = tmp_path / "masked.h5"
    with h5py.File(p, "w") as f:
        d = f.create_dataset("v", shape=data.shape, dtype="<i4", chunks=(4, 5), shuffle=True, compression="gzip",
                             fillvalue=-3)
        d[0:4, :] = data[0:4]
        # chunk (4, 5) stored shuffled but NOT deflated: HDF5 filter 1 (deflate)
        # skipped, filter mask 0b10
        block = np.full((4, 5), 0, "<i4")
        block[:, :] = data[4:8, 5:10]
        shuffled = block.view(np.uint8).reshape(-1, 4).T.copy().tobytes()
        d.id.write_direct_chunk((4, 5), shuffled, filter_mask=0b10)
    return p, data


def test_hdf5_chunk_with_a_skipped_filter(tmp_path):
    h5py = pytest.importorskip("h5py")
    p, data = _h5_file(tmp_path)
    with h5py.File(p, "r") as f:
        ref = f["v"][()]
        masks = []
        f["v"].id.chunk_iter(lambda i: masks.append(i.filter_mask))
    assert sorted(masks) == [0, 0, 2]
    np.testing.assert_array_equal(ref[4:8, 5:10], data[4:8, 5:10])
    fx = pytest.importorskip("ferry.xarray")
    store = fx.FerryStore(str(p))
    s = store.specs["v"]
    assert s.kind == "ferry"   # the C parser's chunk table, filter masks included
    rng = random.Random(1)
    for _ in range(60):
        key = tuple(slice(rng.randrange(0, n), rng.randrange(0, n + 2), rng.randrange(1, 4)) for n in ref.shape)
        np.testing.assert_array_equal(store.read("v", key), ref[key])
    store.close()


def test_lying_chunk_tables_raise(tmp_path):
    p = tmp_path / "chunks.bin"
    p.write_bytes(bytes(range(200)))
    u64 = lambda *v: np.array(v, dtype=np.uint64)  # noqa: E731
    out = np.empty((4, 4), "<u4")
    with pytest.raises(ferry.FerryError, match="not on the grid"):
        _ferry.chunk_table((4, 4), (2, 2), u64(0, 1), u64(0), u64(16))
    with pytest.raises(ferry.FerryError, match="the same chunk"):
        _ferry.chunk_table((4, 4), (2, 2), u64(2, 2, 2, 2), u64(0, 16), u64(16, 16))
    with pytest.raises(ValueError):
        _ferry.chunk_table((4, 4), (2, 2), u64(0), u64(0), u64(16))      # origins of 1 axis for 2
    past_end = _ferry.chunk_table((4, 4), (2, 2), u64(0, 0), u64(190), u64(16))
    with pytest.raises(ferry.FerryError, match="outside the 200-byte file") as e:
        ferry.Plan().layout(out, (4, 4), (2, 2), 4, table=past_end, path=str(p), file_size=200, label="v")
    assert e.value.code == _ferry.EFORMAT
    short = _ferry.chunk_table((4, 4), (2, 2), u64(0, 0), u64(0), u64(8))
    with pytest.raises(ferry.FerryError, match="an uncompressed chunk is exactly 16"):
        ferry.Plan().layout(out, (4, 4), (2, 2), 4, table=short, path=str(p), file_size=200)
    with pytest.raises(ValueError, match="another shape"):
        ferry.Plan().layout(out, (4, 6), (2, 2), 4, table=short, path=str(p))
    # a true table: what the file holds, absent chunks filled
    good = _ferry.chunk_table((4, 4), (2, 2), u64(2, 2), u64(16), u64(16))
    plan = ferry.Plan()
    assert plan.layout(out, (4, 4), (2, 2), 4, table=good, path=str(p), file_size=200,
                       fill=np.uint32(7).tobytes()) == 64
    ferry.default_context().run(plan)
    want = np.full((4, 4), 7, "<u4")
    want[2:4, 2:4] = np.frombuffer(bytes(range(16, 32)), "<u4").reshape(2, 2)
    np.testing.assert_array_equal(out, want)
