"""Lookups by name are constant time (issue 16.10).

f[name] for every variable was a linear search each: 153 s for a
100,000-tensor safetensors file, 28 s for a 40,000-variable netCDF file, and
a 40,000-array consolidated Zarr store took 23 s to open, 7 s more with a
dimension name per array (on a loaded CI machine).
The bounds below are ~50x what the hashed lookups take and ~10x below the
quadratic times, so they fail on the old code and not on a busy machine."""
import json
import os
import time

import numpy as np
import pytest

import ferry
from ferry import _ferry as F


def _time_all_lookups(path):
    t0 = time.perf_counter()
    f = ferry.open(path)
    names = list(f)
    ds = f._ds
    for i, n in enumerate(names):
        assert ds.find(n) == i
    t1 = time.perf_counter()
    for n in names:
        f[n]
    t2 = time.perf_counter()
    return f, names, t1 - t0, t2 - t1


def test_100k_tensor_safetensors(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    p = str(tmp_path / "many.safetensors")
    st.save_file({f"layer.{i}.w": np.full((2,), i, dtype="<f4") for i in range(100_000)}, p)
    f, names, t_find, t_vars = _time_all_lookups(p)
    assert len(names) == 100_000
    assert t_find < 5.0, f"open + 100,000 finds took {t_find:.2f} s"
    assert t_vars < 15.0, f"100,000 f[name] took {t_vars:.2f} s"
    np.testing.assert_array_equal(f["layer.77777.w"].read(), [77777.0, 77777.0])
    with pytest.raises(KeyError):
        f["layer.100000.w"]


def test_40k_variable_netcdf(tmp_path):
    netcdf_file = pytest.importorskip("scipy.io").netcdf_file
    p = str(tmp_path / "many.nc")
    with netcdf_file(p, "w", version=2) as g:
        g.createDimension("x", 2)
        for i in range(40_000):
            g.createVariable(f"v{i}", "f4", ("x",))[:] = i
    f, names, t_find, t_vars = _time_all_lookups(p)
    assert len(names) == 40_000
    assert t_find < 3.0 and t_vars < 8.0, (t_find, t_vars)
    np.testing.assert_array_equal(f["v39999"].read(), [39999.0, 39999.0])


def test_40k_array_consolidated_zarr_v2(tmp_path):
    """Consolidated metadata in the layout zarr-python writes (by hand: 40,000
    arrays through zarr-python would take minutes)."""
    s = str(tmp_path / "many.zarr")
    os.makedirs(s)
    arr = {"zarr_format": 2, "shape": [2], "chunks": [2], "dtype": "<f4", "fill_value": 1.5, "order": "C",
           "filters": None, "compressor": None}
    md = {".zgroup": {"zarr_format": 2}}
    for i in range(40_000):
        md[f"v{i}/.zarray"] = arr
        md[f"v{i}/.zattrs"] = {"_ARRAY_DIMENSIONS": [f"x{i}"], "i": i}   # a dimension each: 7 s in build_dims
    with open(os.path.join(s, ".zmetadata"), "w") as fh:
        json.dump({"zarr_consolidated_format": 1, "metadata": md}, fh)
    with open(os.path.join(s, ".zgroup"), "w") as fh:
        json.dump({"zarr_format": 2}, fh)
    f, names, t_find, t_vars = _time_all_lookups(s)
    assert len(names) == 40_000
    assert t_find < 4.0 and t_vars < 8.0, (t_find, t_vars)
    assert f["v12345"].attrs["i"] == 12345
    assert len(f.dims) == 40_000 and f.dims["x39999"]["size"] == 2
    np.testing.assert_array_equal(f["v12345"].read(), [1.5, 1.5])
