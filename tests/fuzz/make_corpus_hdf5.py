"""Write the HDF5 / netCDF-4 seed corpus (tests/fuzz/corpus/hdf5/) with the
reference writers: h5py (default and libver="latest" layouts), netCDF4 and
h5netcdf. Run once with the project's .venv; the files are committed and
tests/c/test_hdf5.c reads seed-h5py.h5, so keep its contents as they are.
Keep every file small (a few KiB)."""
import os
import numpy as np
import h5py

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "hdf5")
os.makedirs(root, exist_ok=True)
out = lambda name: os.path.join(root, name)


def compact(f, name, data):
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_layout(h5py.h5d.COMPACT)
    sid = h5py.h5s.create_simple(data.shape)
    did = h5py.h5d.create(f.id, name.encode(), h5py.h5t.py_create(data.dtype), sid, dcpl=dcpl)
    did.write(h5py.h5s.ALL, h5py.h5s.ALL, data)


# default h5py: superblock 0, v1 object headers, symbol-table groups, v1 B-tree chunks
with h5py.File(out("seed-h5py.h5"), "w") as f:
    f["c"] = np.arange(12, dtype=">i4").reshape(3, 4)
    f.create_dataset("z", data=np.arange(60, dtype="<f4").reshape(3, 4, 5) / 2, chunks=(2, 3, 5),
                     compression="gzip", shuffle=True, fletcher32=True)
    compact(f, "cp", np.array([1.5, -2.0, 3.25]))
    f.attrs["title"] = "seed"
    f.attrs["n"] = np.int16(-7)
    f.attrs["v"] = np.array([0.5, 1.5], ">f8")
    f.attrs.create("fixed", np.bytes_(b"abc"))
    g = f.create_group("g")
    g["s"] = np.array([b"ab", b"cd"], "S2")

# libver="latest": superblock 3, v2 headers, link messages, v4 layouts
with h5py.File(out("seed-latest.h5"), "w", libver="latest") as f:
    f.create_dataset("fixed", data=np.arange(24, dtype="<i2").reshape(4, 6), chunks=(2, 4), compression="gzip")
    f.create_dataset("single", data=np.arange(6, dtype="<f8"), chunks=(6,))
    f.create_dataset("bt2", data=np.arange(20, dtype="<u4").reshape(4, 5), chunks=(3, 2), maxshape=(None, None))
    f.create_dataset("earr", data=np.arange(10, dtype="<i8"), chunks=(4,), maxshape=(None,))
    for i in range(10):
        f.attrs[f"a{i}"] = i
    g = f.create_group("many")
    for i in range(12):
        g[f"v{i:02d}"] = np.full(2, i, "<i4")

# netCDF-4: dimension scales, an unlimited dimension, a child group, text
import netCDF4
with netCDF4.Dataset(out("seed-nc4.nc"), "w") as nc:
    nc.createDimension("time", None)
    nc.createDimension("x", 3)
    nc.title = "nc4 seed"
    t = nc.createVariable("time", "f8", ("time",))
    t[:] = [0.0, 1.0]
    v = nc.createVariable("v", "i2", ("time", "x"), zlib=True, fill_value=-1)
    v.units = "m"
    v[:] = np.arange(6).reshape(2, 3)
    s = nc.createVariable("name", str, ("x",))
    s[:] = np.array(["a", "bb", "ccc"], object)
    g = nc.createGroup("sub")
    w = g.createVariable("w", "f4", ("x",))
    w[:] = [1, 2, 3]

import h5netcdf
with h5netcdf.File(out("seed-h5netcdf.nc"), "w") as f:
    f.dimensions = {"y": 2, "x": 3}
    v = f.create_variable("a", ("y", "x"), "f4", chunks=(1, 3), compression="gzip")
    v[:] = np.arange(6, dtype="f4").reshape(2, 3)
    v.attrs["long_name"] = "a seed"

# numpy's bool and complex as h5py stores them, an enumeration, fill values
with h5py.File(out("seed-types.h5"), "w", libver="latest") as f:
    f["b"] = np.array([True, False])
    f.create_dataset("c", data=(np.arange(6) * (1 - 2j)).astype(">c8"), chunks=(4,), fillvalue=1 + 1j)
    f.create_dataset("e", data=np.array([0, 1], "i1"), dtype=h5py.enum_dtype({"A": 0, "B": 1}, "i1"))
    f.create_dataset("never", shape=(3,), dtype=">i2", fillvalue=-4)
    f.attrs.create("vs", ["x", "yy"], dtype=h5py.string_dtype())

with h5py.File(out("seed-userblock.h5"), "w", userblock_size=512) as f:
    f["x"] = np.arange(5, dtype=">f4")

# soft links (followed) and hdf5plugin's lz4 and bitshuffle framings
with h5py.File(out("seed-links-filters.h5"), "w") as f:
    f["x"] = np.arange(6, dtype="<i2")
    f["alias"] = h5py.SoftLink("/x")
    f.create_group("g")["up"] = h5py.SoftLink("/x")
    try:
        import hdf5plugin
        f.create_dataset("lz4", data=np.arange(40, dtype="<f4"), chunks=(20,), **hdf5plugin.LZ4(nbytes=32))
        f.create_dataset("bs", data=np.arange(43, dtype="<i4"), chunks=(43,), **hdf5plugin.Bitshuffle())
    except ImportError:
        pass

# variable-length strings (netCDF-4 "string", h5py.string_dtype()): contiguous and chunked
# with filters, a fill value over unwritten elements, an unwritten chunk, "" and non-ASCII
# text; tests/c/test_hdf5.c reads seed-strings.nc, so keep its contents as they are
with netCDF4.Dataset(out("seed-strings.nc"), "w") as nc:
    nc.createDimension("x", 4)
    nc.createDimension("y", 3)
    nc.createDimension("t", None)
    s = nc.createVariable("s", str, ("x",))
    s[:] = np.array(["a", "", "h\u00e9llo \u2713", "zz"], object)
    z = nc.createVariable("z", str, ("x", "y"), zlib=True, shuffle=True, chunksizes=(2, 2))
    z[:] = np.array([[f"r{i}c{j}" * (i + j) for j in range(3)] for i in range(4)], object)
    m = nc.createVariable("m", str, ("x",), fill_value="N/A")
    m[0] = "first"
    m[2] = "third"
    t = nc.createVariable("t", str, ("t",), chunksizes=(2,))
    t[0] = "t0"
    t[5] = "t5"                      # chunk 1 (elements 2, 3) never written: the fill ("")
with h5py.File(out("seed-strings.nc"), "a") as f:
    f.create_dataset("h", data=np.array(["\u03b1", "", "\u03b2 \u03b3", "d", "e"], object), dtype=h5py.string_dtype())
