"""netCDF classic files written by netCDF4-python (NETCDF3_CLASSIC,
NETCDF3_64BIT_OFFSET, NETCDF3_64BIT_DATA) and scipy.io.netcdf_file, read by
ferry into host memory and compared bit for bit with the writer's own reader
(raw values: no masking, no scaling) — whole variables and seeded-random
selections; dimensions and typed attributes compared too."""
import json
import math
import random

import numpy as np
import pytest

from selections import random_selection

F = pytest.importorskip("ferry._ferry")


def read(ctx, ds, name, sel=None, native=True):
    info = ds.variables()[ds.find(name)]
    dt = np.dtype(info["typestr"])
    if native and dt.byteorder == ">":
        dt = dt.newbyteorder("=")
    shape = info["shape"] if sel is None else tuple(len(range(*s)) for s in sel)
    out = np.empty(shape, dtype=dt)
    plan = F.Plan()
    assert plan.read(ds, name, out, selection=sel, native=native) == out.nbytes
    if out.nbytes:
        ctx.run(plan)
    return out


def same_bits(got, want):
    want = np.array(want, order="C")
    assert got.shape == want.shape
    if want.dtype.byteorder == ">" and got.dtype.byteorder != ">":
        want = want.astype(want.dtype.newbyteorder("="))
    assert got.tobytes() == want.tobytes()


CLASSIC_TYPES = ["i1", "S1", "i2", "i4", "f4", "f8"]
CDF5_TYPES = CLASSIC_TYPES + ["u1", "u2", "u4", "i8", "u8"]


def values(rng, dt, shape):
    dt = np.dtype(dt)
    if dt.kind == "S":
        return rng.integers(97, 123, size=shape, dtype=np.uint8).view("S1")
    if dt.kind == "f":
        return (rng.standard_normal(shape) * 100).astype(dt)
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max, size=shape, dtype=dt, endpoint=True)


def write_netcdf4(path, fmt, rng):
    netCDF4 = pytest.importorskip("netCDF4")
    types = CDF5_TYPES if fmt == "NETCDF3_64BIT_DATA" else CLASSIC_TYPES
    nrec = 7
    with netCDF4.Dataset(path, "w", format=fmt) as nc:
        nc.set_fill_off()
        nc.createDimension("time", None)
        nc.createDimension("y", 5)
        nc.createDimension("x", 6)
        nc.createDimension("one", 1)
        nc.title = "ferry test"
        nc.setncattr("numbers", np.array([1.5, -2.25, np.nan, np.inf], "f8"))
        nc.setncattr("count", np.int32(42))
        for t in types:
            if t != "S1":
                nc.setncattr(f"attr_{t}", np.array([0, 1, 2], dtype=t))
        for t in types:
            fixed = nc.createVariable(f"fix_{t}", t, ("y", "x"))
            fixed[:] = values(rng, t, (5, 6))
            rec = nc.createVariable(f"rec_{t}", t, ("time", "y", "x"))
            rec.long_name = f"record {t}"
            rec[0:nrec] = values(rng, t, (nrec, 5, 6))
            rec1 = nc.createVariable(f"rec1_{t}", t, ("time",))
            rec1[0:nrec] = values(rng, t, (nrec,))
        sc = nc.createVariable("scalar", "f8", ())
        sc.assignValue(2.5)
        fv = nc.createVariable("with_fill", "f4", ("x",), fill_value=np.float32(-999.0))
        fv.scale_factor = np.float32(0.5)
        fv[:] = np.arange(6, dtype="f4")
        odd = nc.createVariable("odd", "i2", ("time", "one"))   # 2 bytes per record: padded to 4
        odd[0:nrec] = np.arange(nrec, dtype="i2").reshape(nrec, 1)
    return types, nrec


def reference(path):
    netCDF4 = pytest.importorskip("netCDF4")
    out = {}
    with netCDF4.Dataset(path) as nc:
        nc.set_auto_maskandscale(False)
        nc.set_auto_chartostring(False)
        for name, v in nc.variables.items():
            out[name] = (np.asarray(v[...]), {k: v.getncattr(k) for k in v.ncattrs()})
        gatts = {k: nc.getncattr(k) for k in nc.ncattrs()}
        dims = {k: (len(d), d.isunlimited()) for k, d in nc.dimensions.items()}
    return out, gatts, dims


def check_attrs(got_json, want):
    got = json.loads(got_json)
    assert set(got) == set(want)
    for k, w in want.items():
        g = got[k]
        if isinstance(w, str):
            assert g == w
            continue
        w = np.atleast_1d(np.asarray(w))
        assert np.dtype(g["type"]).newbyteorder("=") == w.dtype.newbyteorder("=")
        gv = [float(x) if isinstance(x, str) else x for x in g["value"]]
        assert len(gv) == len(w)
        for a, b in zip(gv, w.tolist()):
            if isinstance(b, float) and math.isnan(b):
                assert math.isnan(a)
            else:
                assert a == b


@pytest.mark.parametrize("fmt", ["NETCDF3_CLASSIC", "NETCDF3_64BIT_OFFSET", "NETCDF3_64BIT_DATA"])
def test_netcdf4_writer(tmp_path, ctx, fmt):
    rng = np.random.default_rng(len(fmt))
    p = str(tmp_path / "t.nc")
    types, nrec = write_netcdf4(p, fmt, rng)
    ref, gatts, dims = reference(p)
    ds = F.Dataset(ctx, p)
    assert ds.format == "netcdf3"
    check_attrs(ds.attrs, gatts)
    assert json.loads(ds.dims) == {k: {"size": n, "unlimited": u} for k, (n, u) in dims.items()}
    infos = {v["name"]: v for v in ds.variables()}
    assert set(infos) == set(ref)
    r = random.Random(fmt)
    for name, (want, vatts) in ref.items():
        info = infos[name]
        assert info["shape"] == want.shape, name
        check_attrs(info["attrs"], vatts)
        if info["typestr"] == "|S1":
            assert info["dtype"] == "S1"
        else:
            assert info["typestr"][0] in "|>"
        got = read(ctx, ds, name)
        same_bits(got, want)
        same_bits(read(ctx, ds, name, native=False), want.astype(np.dtype(info["typestr"])))
        for _ in range(8):
            sel = random_selection(r, want.shape)
            same_bits(read(ctx, ds, name, sel), want[tuple(slice(*s) for s in sel)])
    assert json.loads(infos["with_fill"]["fill"]) == -999.0
    assert json.loads(infos["rec_f4"]["dims"]) == ["time", "y", "x"]
    assert infos["rec_f4"]["chunks"] == (1, 5, 6)


@pytest.mark.parametrize("version", [1, 2])
def test_scipy_writer(tmp_path, ctx, version):
    netcdf_file = pytest.importorskip("scipy.io").netcdf_file
    p = str(tmp_path / "s.nc")
    rng = np.random.default_rng(version)
    with netcdf_file(p, "w", version=version) as nc:
        nc.history = b"written by scipy"
        nc.createDimension("t", None)
        nc.createDimension("lat", 4)
        nc.createDimension("lon", 3)
        temp = nc.createVariable("temp", "f4", ("t", "lat", "lon"))
        temp.units = b"K"
        temp[:] = rng.standard_normal((9, 4, 3)).astype("f4")
        lat = nc.createVariable("lat", "f8", ("lat",))
        lat[:] = np.linspace(-90, 90, 4)
        flag = nc.createVariable("flag", "i1", ("t",))
        flag[:] = np.arange(9, dtype="i1")
    with netcdf_file(p, "r", mmap=False) as nc:
        ref = {k: v[:].copy() for k, v in nc.variables.items()}
    ds = F.Dataset(ctx, p)
    assert json.loads(ds.attrs) == {"history": "written by scipy"}
    assert json.loads(ds.dims)["t"] == {"size": 9, "unlimited": True}
    r = random.Random(version)
    for name, want in ref.items():
        same_bits(read(ctx, ds, name), want)
        for _ in range(8):
            sel = random_selection(r, want.shape)
            same_bits(read(ctx, ds, name, sel), want[tuple(slice(*s) for s in sel)])


def test_single_record_variable_is_unpadded(tmp_path, ctx):
    netcdf_file = pytest.importorskip("scipy.io").netcdf_file
    p = str(tmp_path / "one.nc")
    with netcdf_file(p, "w") as nc:
        nc.createDimension("t", None)
        v = nc.createVariable("b", "i2", ("t",))
        v[:] = np.arange(11, dtype="i2")
    ds = F.Dataset(ctx, p)
    (info,) = ds.variables()
    assert info["data_bytes"] == 22          # contiguous: records not padded
    same_bits(read(ctx, ds, "b"), np.arange(11, dtype="i2"))
    same_bits(read(ctx, ds, "b", [(3, 11, 4)]), np.arange(11, dtype="i2")[3::4])


def test_many_records_few_bytes_each(tmp_path, ctx):
    """A record variable whose records are small and far apart: the plan reads
    only its bytes, and the result matches."""
    netCDF4 = pytest.importorskip("netCDF4")
    p = str(tmp_path / "r.nc")
    with netCDF4.Dataset(p, "w", format="NETCDF3_64BIT_OFFSET") as nc:
        nc.createDimension("time", None)
        nc.createDimension("x", 2000)
        big = nc.createVariable("big", "f8", ("time", "x"))
        small = nc.createVariable("small", "i4", ("time",))
        big[0:300] = np.ones((300, 2000))
        small[0:300] = np.arange(300, dtype="i4")
    ds = F.Dataset(ctx, p)
    plan = F.Plan()
    out = np.empty(300, "=i4")
    plan.read(ds, "small", out)
    assert plan.file_bytes < 300 * 4 * 8      # never the whole 4.8 MB
    ctx.run(plan)
    assert (out == np.arange(300)).all()


def test_malformed_files_raise_with_path(tmp_path, ctx):
    netCDF4 = pytest.importorskip("netCDF4")
    p = tmp_path / "ok.nc"
    with netCDF4.Dataset(str(p), "w", format="NETCDF3_CLASSIC") as nc:
        nc.createDimension("x", 4)
        v = nc.createVariable("v", "f4", ("x",))
        v[:] = np.arange(4)
    data = p.read_bytes()
    for cut in [2, 7, 30, len(data) - 1]:
        q = tmp_path / f"cut{cut}.nc"
        q.write_bytes(data[:cut])
        with pytest.raises(F.FerryError) as e:
            F.Dataset(ctx, str(q), format="netcdf3")
        assert str(q) in str(e.value) and "byte" in str(e.value)
