"""kerchunk reference sets read into device memory: chunks of an HDF5 file
(shuffle + deflate, netCDF-4's layout, written by h5py) named by a reference
set built here from h5py's chunk_iter, as kerchunk's SingleHdf5ToZarr writes
it (filters [shuffle, zlib], no compressor), plus inline base64 chunks (which
the reader holds in an in-memory file); decode="gpu" and "cpu" equal h5py's
data byte for byte. Skips with the reason where there is no GPU or h5py."""
import base64
import json
import zlib

import numpy as np
import pytest

import ferry_arrays
from ferry import _ferry as F

h5py = pytest.importorskip("h5py", reason="h5py is not installed")


def make_set(tmp_path):
    rng = np.random.default_rng(5)
    a = (rng.standard_normal((50, 37)) * 100).astype("<f4")
    path = tmp_path / "t.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("t2m", data=a, chunks=(16, 10), compression="gzip", compression_opts=4, shuffle=True)
    refs = {".zgroup": json.dumps({"zarr_format": 2}),
            "t2m/.zarray": json.dumps({"zarr_format": 2, "shape": [50, 37], "chunks": [16, 10], "dtype": "<f4",
                                       "fill_value": None, "order": "C", "compressor": None,
                                       "filters": [{"id": "shuffle", "elementsize": 4}, {"id": "zlib", "level": 4}]}),
            "t2m/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["y", "x"]})}
    with h5py.File(path, "r") as f:
        f["t2m"].id.chunk_iter(lambda i: refs.__setitem__(
            f"t2m/{i.chunk_offset[0] // 16}.{i.chunk_offset[1] // 10}", ["t.h5", i.byte_offset, i.size]))
    b = np.arange(20, dtype="<i2")
    refs["b/.zarray"] = json.dumps({"zarr_format": 2, "shape": [20], "chunks": [20], "dtype": "<i2",
                                    "fill_value": 0, "order": "C", "compressor": {"id": "zlib"}, "filters": None})
    refs["b/0"] = "base64:" + base64.b64encode(zlib.compress(b.tobytes())).decode()
    j = tmp_path / "refs.json"
    j.write_text(json.dumps({"version": 1, "refs": refs}))
    return str(j), {"t2m": a, "b": b}


@pytest.mark.parametrize("decode", ["gpu", "cpu"])
def test_refs_to_device(ctx, tmp_path, decode):
    if decode == "gpu" and not ctx.nvcomp_status.startswith("loaded"):
        pytest.skip("nvCOMP not loaded: " + ctx.nvcomp_status)
    j, want = make_set(tmp_path)
    ds = F.Dataset(ctx, j)
    assert ds.format == "refs"
    for name, a in want.items():
        i = [v["name"] for v in ds.variables()].index(name)
        for sel in (None, ((3, 47, 2), (1, 36, 5)) if a.ndim == 2 else ((2, 19, 3),)):
            shape = a.shape if sel is None else tuple(len(range(*s)) for s in sel)
            dst = ferry_arrays.full(ctx, shape, a.dtype)
            plan = F.Plan()
            plan.read(ds, i, dst, selection=sel, native=True)
            ctx.run(plan, decode=decode)
            got = ferry_arrays.to_numpy(ctx, dst, a.dtype)
            ref = a if sel is None else a[tuple(slice(*s) for s in sel)]
            assert got.tobytes() == np.ascontiguousarray(ref).tobytes(), (name, sel, decode)
    ds.close()
