"""npy files written by numpy itself (np.save / write_array), read by ferry's
parser and engine into host memory, compared bit for bit with np.load —
whole arrays and seeded-random selections, every fixed-size dtype, both byte
orders, C and Fortran order, format versions 1, 2 and 3."""
import json
import random
import zlib

import numpy as np
import pytest

from selections import random_selection

F = pytest.importorskip("ferry._ferry")


def native(dt):
    dt = np.dtype(dt)
    return dt.newbyteorder("=") if dt.byteorder not in "=|" else dt


def read(ctx, ds, var=0, sel=None, native_order=True, stored_order=False, shape=None):
    info = ds.variables()[var if isinstance(var, int) else ds.find(var)]
    dt = np.dtype(info["typestr"])
    if native_order:
        dt = native(dt)
    if shape is None:
        shape = info["shape"] if sel is None else tuple(len(range(*s)) for s in sel)
    out = np.empty(shape, dtype=dt)
    plan = F.Plan()
    placed = plan.read(ds, var, out, selection=sel, native=native_order, stored_order=stored_order)
    assert placed == out.nbytes
    if out.nbytes:
        assert ctx.run(plan) >= 0
    return out


def same_bits(a, b):
    a = np.ascontiguousarray(a)
    b = np.ascontiguousarray(b)
    assert a.shape == b.shape
    assert a.dtype.itemsize == b.dtype.itemsize
    assert a.tobytes() == b.tobytes()


DTYPES = ["|b1", "|i1", "|u1", "<i2", ">i2", "<u2", ">u2", "<i4", ">i4", "<u4", "<i8", ">i8", "<u8", ">u8",
          "<f2", ">f2", "<f4", ">f4", "<f8", ">f8", "<c8", ">c8", "<c16", ">c16",
          "<M8[ns]", ">M8[ns]", "<M8[D]", "<m8[s]", ">m8[us]", "|S1", "|S5", "|V4", "<U3", ">U2"]


def sample(dt, shape, rng):
    dt = np.dtype(dt)
    n = int(np.prod(shape))
    raw = rng.integers(0, 256, size=n * dt.itemsize, dtype=np.uint8)
    if dt.kind == "b":
        raw = raw % 2
    if dt.kind == "U":  # valid code points only
        return np.array(["".join(chr(65 + int(x) % 26) for x in raw[i:i + 2]) for i in range(n)],
                        dtype=dt).reshape(shape)
    return raw.view(dt).reshape(shape)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("order", ["C", "F"])
def test_every_dtype_whole_and_random_selections(tmp_path, ctx, dt, order):
    rng = np.random.default_rng(zlib.crc32(f"{dt}{order}".encode()))
    shape = (7, 5, 3)
    a = np.asarray(sample(dt, shape, rng), order=order)
    p = tmp_path / "a.npy"
    np.save(p, a)
    ref = np.load(p)
    ds = F.Dataset(ctx, str(p))
    assert ds.format == "npy"
    (v,) = ds.variables()
    assert v["typestr"] == np.lib.format.dtype_to_descr(a.dtype)
    assert v["shape"] == shape
    assert v["fortran_order"] == (order == "F" and not a.flags.c_contiguous)
    want = ref.astype(native(ref.dtype))
    same_bits(read(ctx, ds), want)
    # as stored (no byteswap)
    same_bits(read(ctx, ds, native_order=False), np.ascontiguousarray(ref))
    r = random.Random(str((dt, order)))
    for _ in range(12):
        sel = random_selection(r, shape)
        same_bits(read(ctx, ds, sel=sel), want[tuple(slice(*s) for s in sel)])
    ds.close()


def test_fortran_stored_order(tmp_path, ctx):
    a = np.asfortranarray(np.arange(24, dtype="<i4").reshape(2, 3, 4))
    p = tmp_path / "f.npy"
    np.save(p, a)
    ds = F.Dataset(ctx, str(p))
    out = read(ctx, ds, stored_order=True, shape=(24,))
    assert out.tobytes() == a.tobytes(order="F")
    same_bits(read(ctx, ds), a)


@pytest.mark.parametrize("version", [(1, 0), (2, 0), (3, 0)])
def test_format_versions(tmp_path, ctx, version):
    a = np.arange(60, dtype=">f8").reshape(3, 4, 5)
    p = tmp_path / "v.npy"
    with open(p, "wb") as f:
        np.lib.format.write_array(f, a, version=version)
    ds = F.Dataset(ctx, str(p))
    same_bits(read(ctx, ds), np.load(p).astype("=f8"))


@pytest.mark.parametrize("shape", [(), (0,), (4, 0, 2), (1,), (1, 1, 1, 1, 1, 1, 1, 1, 1, 1)])
def test_edge_shapes(tmp_path, ctx, shape):
    a = np.arange(int(np.prod(shape)), dtype="<f4").reshape(shape)
    p = tmp_path / "e.npy"
    np.save(p, a)
    ds = F.Dataset(ctx, str(p))
    same_bits(read(ctx, ds), np.load(p))


def test_larger_array_runs_and_placements(tmp_path, ctx):
    """Columns, strided rows and blocks of an array big enough that some
    selections become one read per row and others one placed read."""
    a = np.random.default_rng(1).standard_normal((700, 900)).astype(">f4")
    p = tmp_path / "big.npy"
    np.save(p, a)
    ds = F.Dataset(ctx, str(p))
    want = np.load(p).astype("=f4")
    for sel in [[(0, 700, 1), (5, 6, 1)], [(3, 700, 5), (0, 900, 1)], [(10, 20, 1), (100, 900, 3)],
                [(0, 700, 7), (0, 900, 450)], [(699, 700, 1), (899, 900, 1)]]:
        same_bits(read(ctx, ds, sel=sel), want[tuple(slice(*s) for s in sel)])
    r = random.Random(5)
    for _ in range(20):
        sel = random_selection(r, a.shape)
        same_bits(read(ctx, ds, sel=sel), want[tuple(slice(*s) for s in sel)])


def test_name_and_info(tmp_path, ctx):
    p = tmp_path / "weights.npy"
    np.save(p, np.zeros((2, 2), "<u2"))
    ds = F.Dataset(ctx, str(p))
    (v,) = ds.variables()
    assert v["name"] == "weights"
    assert v["dtype"] == "u2"
    assert v["data_bytes"] == 8
    with open(p, "rb") as f:
        f.seek(v["data_offset"])
        assert f.read() == b"\0" * 8
    assert json.loads(ds.attrs) == {}
    assert ds.find("weights") == 0


def test_malformed_files_raise_with_path(tmp_path, ctx):
    p = tmp_path / "t.npy"
    np.save(p, np.arange(10, dtype="<i8"))
    data = p.read_bytes()
    for cut in [3, 9, 40, len(data) - 1]:
        q = tmp_path / f"cut{cut}.npy"
        q.write_bytes(data[:cut])
        with pytest.raises(F.FerryError) as e:
            F.Dataset(ctx, str(q), format="npy")
        assert str(q) in str(e.value)
    q = tmp_path / "obj.npy"
    np.save(q, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(F.FerryError) as e:
        F.Dataset(ctx, str(q))
    assert e.value.code == F.EUNSUPPORTED
    q = tmp_path / "rec.npy"
    np.save(q, np.zeros(3, dtype=[("a", "<f4"), ("b", "<i2")]))
    with pytest.raises(F.FerryError) as e:
        F.Dataset(ctx, str(q))
    assert e.value.code == F.EUNSUPPORTED


def test_large_fortran_array_reads_whole_columns(tmp_path, ctx):
    """A Fortran-order array larger than one placed read: one extent per
    stored column (contiguous in the file), scattered into C order; never one
    extent per element."""
    a = np.asfortranarray(np.random.default_rng(7).standard_normal((3000, 2000)).astype(">f4"))
    p = tmp_path / "fbig.npy"
    np.save(p, a)
    ds = F.Dataset(ctx, str(p))
    out = np.empty(a.shape, "=f4")
    plan = F.Plan()
    plan.read(ds, 0, out)
    assert len(plan) <= 2000
    assert plan.file_bytes == a.nbytes
    ctx.run(plan)
    same_bits(out, np.load(p).astype("=f4"))
    sel = [(10, 2990, 3), (7, 2000, 11)]
    same_bits(read(ctx, ds, sel=sel), a[10:2990:3, 7:2000:11].astype("=f4"))


def test_plans_read_only_what_is_touched(tmp_path, ctx):
    a = np.arange(1000 * 1000, dtype="<i4").reshape(1000, 1000)
    p = tmp_path / "t.npy"
    np.save(p, a)
    ds = F.Dataset(ctx, str(p))
    for sel, max_extents, max_bytes in [
            ([(0, 1000, 1), (0, 1000, 1)], 1, a.nbytes),          # whole: one read
            ([(10, 20, 1), (0, 1000, 1)], 1, 10 * 4000),          # rows: one read
            ([(0, 4, 1), (5, 6, 1)], 1, 64 << 10),                # a small column: one placed read
            ([(0, 1000, 1), (5, 6, 1)], 1000, 1000 * 4)]:         # a long column: one small read per row
        out = np.empty(tuple(len(range(*s)) for s in sel), "<i4")
        plan = F.Plan()
        plan.read(ds, 0, out, selection=sel)
        assert len(plan) <= max_extents
        assert plan.file_bytes <= max_bytes
        ctx.run(plan)
        same_bits(out, a[tuple(slice(*s) for s in sel)])
