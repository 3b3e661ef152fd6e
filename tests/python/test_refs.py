"""kerchunk reference sets (virtual datasets) read by ferry's C parser (src/formats/refs.c).

The references are written by kerchunk itself (SingleHdf5ToZarr over netCDF-4 files that
netCDF4-python and h5netcdf write here, NetCDF3ToZarr over a classic file), and what
engine="ferry" reads from them must equal what engine="netcdf4" reads from the original
file. Damaged reference sets fail with a FerryError naming the JSON, the key and the target."""
import base64
import json
import os
import shutil

import numpy as np
import pytest

ferry = pytest.importorskip("ferry")
xr = pytest.importorskip("xarray")
pytest.importorskip("netCDF4")
kerchunk_hdf = pytest.importorskip("kerchunk.hdf")
from ferry import FerryError  # noqa: E402
from ferry import _ferry  # noqa: E402


def _dataset():
    rng = np.random.default_rng(0)
    t = rng.standard_normal((6, 5, 8)).astype("f4")
    t[0, 0, 0] = -9.0   # the fill value: masked by both readers
    return xr.Dataset(
        {"t": (("time", "lat", "lon"), t, {"units": "K", "long_name": "temperature"}),
         "q": (("lat", "lon"), rng.integers(0, 1000, (5, 8)).astype("i4"), {"units": "1"}),
         "w": (("time",), np.arange(6, dtype="f8") / 4.0)},
        coords={"time": ("time", np.arange(6, dtype="i8"), {"units": "hours since 2000-01-01", "calendar": "standard"}),
                "lat": np.linspace(-60, 60, 5), "lon": np.arange(8.0)},
        attrs={"title": "refs test", "source": "ferry"})


def _refs(nc, inline):
    with open(nc, "rb") as f:
        return kerchunk_hdf.SingleHdf5ToZarr(f, os.path.basename(nc), inline_threshold=inline).translate()


def _write(path, refs):
    with open(path, "w") as f:
        json.dump(refs, f)
    return str(path)


@pytest.fixture
def nc4(tmp_path):
    p = str(tmp_path / "a.nc")
    _dataset().to_netcdf(p, engine="netcdf4", encoding={
        "t": {"zlib": True, "shuffle": True, "chunksizes": (2, 5, 3), "_FillValue": -9.0},   # edge chunks
        "q": {"contiguous": True}})
    return p


def _identical(refs_json, original, **kw):
    got = xr.open_dataset(refs_json, engine="ferry", **kw)
    want = xr.open_dataset(original, engine="netcdf4")
    try:
        xr.testing.assert_identical(got.load(), want.load())
    finally:
        got.close()
        want.close()


@pytest.mark.parametrize("inline", [0, 100, 500])
def test_netcdf4_refs_equal_the_file(tmp_path, nc4, inline):
    j = _write(tmp_path / "refs.json", _refs(nc4, inline))
    assert _ferry.format_detect(j) == "refs"
    _identical(j, nc4)


def test_refs_encoding_equals_the_zarr_engine_over_the_references(tmp_path, nc4, monkeypatch):
    """engine="zarr" over kerchunk's reference filesystem is the reference engine of a reference
    set: the same chunks, codecs (netCDF-4's shuffle and zlib as filters) and fills."""
    pytest.importorskip("zarr")
    pytest.importorskip("fsspec")
    j = _write(tmp_path / "refs.json", _refs(nc4, 100))
    monkeypatch.chdir(tmp_path)   # fsspec resolves the references' relative paths from here
    ref = xr.open_dataset("reference://", engine="zarr",
                          backend_kwargs={"consolidated": False, "storage_options": {"fo": j}})
    got = xr.open_dataset(j, engine="ferry")
    xr.testing.assert_identical(got.load(), ref.load())
    for v in ref.variables:
        a, b = ref[v].encoding, got[v].encoding
        assert set(a) == set(b), (v, a, b)
        for k in a:
            assert a[k] == b[k] or (a[k] != a[k] and b[k] != b[k]), (v, k, a[k], b[k])
    assert got["t"].encoding["filters"][-1].codec_id == "zlib"


def test_h5netcdf_refs_equal_the_file(tmp_path):
    pytest.importorskip("h5netcdf")
    p = str(tmp_path / "h.nc")
    _dataset().to_netcdf(p, engine="h5netcdf", encoding={"t": {"zlib": True, "shuffle": True,
                                                               "chunksizes": (3, 5, 4)}})
    j = _write(tmp_path / "h.json", _refs(p, 100))
    _identical(j, p)


def test_netcdf3_refs_equal_the_file(tmp_path):
    n3 = pytest.importorskip("kerchunk.netCDF3")
    pytest.importorskip("scipy")
    p = str(tmp_path / "c.nc")
    _dataset().to_netcdf(p, engine="scipy")
    j = _write(tmp_path / "c.json", n3.NetCDF3ToZarr(p, inline_threshold=0).translate())
    _identical(j, p)


def test_embedded_strings_read_through_zarr_python(tmp_path):
    """kerchunk embeds netCDF-4's variable-length strings inline (dtype |O, filter vlen-utf8),
    which the engine has no type for: zarr-python reads those inline bytes; the rest goes through
    the engine. A string variable with a chunk in another file is not read from Python (its file
    would escape the parser's checks): reading it fails naming it."""
    pytest.importorskip("zarr")
    p = str(tmp_path / "s.nc")
    xr.Dataset({"t": (("x",), np.arange(3.0)), "name": (("x",), np.array(["a", "bb", "ccc"], dtype=object))}
               ).to_netcdf(p, engine="netcdf4")
    refs = _refs(p, 0)
    assert json.loads(refs["refs"]["name/.zarray"])["dtype"] == "|O"
    j = _write(tmp_path / "s.json", refs)
    _identical(j, p)
    refs["refs"]["name/0"] = ["s.nc", 0, 10]
    j2 = _write(tmp_path / "s2.json", refs)
    with pytest.raises(FerryError, match=r"s2\.json.*name/\.zarray.*not supported"):
        xr.open_dataset(j2, engine="ferry").load()
    got = xr.open_dataset(j2, engine="ferry", drop_variables=["name"])   # the rest stays readable
    np.testing.assert_array_equal(got["t"].values, [0.0, 1.0, 2.0])


def test_version0_and_ferry_open_read(tmp_path, nc4):
    refs = _refs(nc4, 0)["refs"]   # version 0: the references alone
    j = _write(tmp_path / "v0.json", refs)
    _identical(j, nc4)
    want = xr.open_dataset(nc4, engine="netcdf4", mask_and_scale=False)
    np.testing.assert_array_equal(ferry.read(j, "t"), want["t"].values)
    with ferry.open(j) as f:
        assert f.format == "refs"
        np.testing.assert_array_equal(f["q"][1:3, ::2], want["q"].values[1:3, ::2])
    want.close()


def test_version1_templates_and_gen(tmp_path):
    """gen entries and templates as kerchunk's spec writes them: one raw file of 4 chunks."""
    a = np.arange(4 * 6, dtype="<f4").reshape(4, 6)
    raw = tmp_path / "data" / "chunks.bin"
    raw.parent.mkdir()
    raw.write_bytes(b"HEAD" + a.tobytes())
    zarray = {"shape": [4, 6], "chunks": [1, 6], "dtype": "<f4", "fill_value": None, "order": "C",
              "filters": None, "compressor": None, "zarr_format": 2, "dimension_separator": "."}
    refs = {"version": 1,
            "templates": {"d": "data", "f": "chunks.bin"},
            "gen": [{"key": "a/{{i}}.0", "url": "{{d}}/{{f}}", "offset": "{{4 + i * 24}}", "length": "24",
                     "dimensions": {"i": {"stop": 3}}}],
            "refs": {".zgroup": json.dumps({"zarr_format": 2}),
                     "a/.zarray": json.dumps(zarray),
                     "a/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["y", "x"]}),
                     "a/3.0": ["{{d}}/{{f}}", 4 + 3 * 24, 24]}}
    j = _write(tmp_path / "g.json", refs)
    np.testing.assert_array_equal(ferry.read(j, "a"), a)
    refs["gen"][0]["offset"] = "{{ foo(i) }}"
    _write(tmp_path / "bad.json", refs)
    with pytest.raises(FerryError, match=r"bad\.json.*template field"):
        ferry.read(str(tmp_path / "bad.json"), "a")


def test_inline_chunks_and_missing_keys(tmp_path):
    """Inline chunks (text and base64) decode like stored ones; an absent key is the fill value."""
    import zlib
    a = np.arange(8, dtype="<i2")
    zarray = {"shape": [12], "chunks": [8], "dtype": "<i2", "fill_value": 7, "order": "C", "filters": None,
              "compressor": {"id": "zlib", "level": 1}, "zarr_format": 2}
    refs = {".zgroup": '{"zarr_format": 2}', "v/.zarray": json.dumps(zarray),
            "v/.zattrs": '{"_ARRAY_DIMENSIONS": ["n"]}',
            "v/0": "base64:" + base64.b64encode(zlib.compress(a.tobytes())).decode()}
    j = _write(tmp_path / "i.json", refs)
    np.testing.assert_array_equal(ferry.read(j, "v"), np.r_[a, [7, 7, 7, 7]])


# ---------------------------------------------------------------------------
# damage: FerryError naming the reference set, the key and the target
# ---------------------------------------------------------------------------
def _first_ref(refs):
    return next(k for k, v in refs["refs"].items() if isinstance(v, list) and k.startswith("t/"))


def test_offset_past_the_file(tmp_path, nc4):
    refs = _refs(nc4, 0)
    k = _first_ref(refs)
    refs["refs"][k] = ["a.nc", os.path.getsize(nc4) - 10, 100]
    j = _write(tmp_path / "past.json", refs)
    with pytest.raises(FerryError, match=rf"past\.json.*{k}.*a\.nc.*past the end"):
        xr.open_dataset(j, engine="ferry").load()


def test_missing_target(tmp_path, nc4):
    refs = _refs(nc4, 0)
    k = _first_ref(refs)
    refs["refs"][k][0] = "gone.nc"
    j = _write(tmp_path / "gone.json", refs)
    with pytest.raises(FerryError, match=rf"gone\.json.*{k}.*gone\.nc.*No such file"):
        ferry.read(j, "t")


def test_bad_base64(tmp_path, nc4):
    refs = _refs(nc4, 500)
    k = next(k for k, v in refs["refs"].items() if isinstance(v, str) and v.startswith("base64:"))
    refs["refs"][k] = "base64:AAA*AAA="
    j = _write(tmp_path / "b64.json", refs)
    with pytest.raises(FerryError, match=rf"b64\.json.*{k}.*base64"):
        ferry.open(j)


def test_bad_json(tmp_path, nc4):
    text = json.dumps(_refs(nc4, 0))
    j = tmp_path / "cut.json"
    j.write_text(text[: len(text) // 2])
    with pytest.raises(FerryError, match=r"cut\.json: byte \d+: JSON"):
        xr.open_dataset(str(j), engine="ferry")


def test_bad_reference_shape(tmp_path, nc4):
    refs = _refs(nc4, 0)
    k = _first_ref(refs)
    refs["refs"][k] = ["a.nc", 10]
    j = _write(tmp_path / "shape.json", refs)
    with pytest.raises(FerryError, match=rf"shape\.json.*{k}.*\[url, offset, length\]"):
        ferry.open(j)


def test_files_outside_are_refused_unless_allowed(tmp_path, nc4):
    sub = tmp_path / "sub"
    sub.mkdir()
    refs = _refs(nc4, 0)
    refs["refs"] = {k: (["../a.nc"] + v[1:] if isinstance(v, list) else v) for k, v in refs["refs"].items()}
    j = _write(sub / "up.json", refs)
    with pytest.raises(FerryError, match=r"up\.json.*a\.nc.*outside the reference set's directory"):
        xr.open_dataset(j, engine="ferry").load()
    _identical(j, nc4, allow_outside=True)
    abs_refs = _refs(nc4, 0)
    abs_refs["refs"] = {k: ([nc4] + v[1:] if isinstance(v, list) else v) for k, v in abs_refs["refs"].items()}
    j2 = _write(sub / "abs.json", abs_refs)
    with pytest.raises(FerryError, match="outside"):
        ferry.read(j2, "t")
    np.testing.assert_array_equal(ferry.Dataset(ferry.default_context(), j2, allow_outside=True).format, "refs")


def test_symlink_leading_out_is_refused(tmp_path, nc4):
    sub = tmp_path / "sub"
    sub.mkdir()
    os.symlink(nc4, sub / "a.nc")
    j = _write(sub / "link.json", _refs(nc4, 0))
    with pytest.raises(FerryError, match="outside"):
        ferry.read(j, "t")


def _parquet(refs, out, engine, record_size, monkeypatch):
    """kerchunk's own Parquet writer (kerchunk.df.refs_to_dataframe, through fsspec's
    LazyReferenceMapper), with the Parquet library `engine` (fsspec's default: fastparquet)."""
    pytest.importorskip(engine)
    kdf = pytest.importorskip("kerchunk.df")
    from fsspec.implementations.reference import LazyReferenceMapper
    d = LazyReferenceMapper.__init__.__defaults__
    monkeypatch.setattr(LazyReferenceMapper.__init__, "__defaults__", d[:-1] + (engine,))
    kdf.refs_to_dataframe(refs, str(out), record_size=record_size)
    return str(out)


@pytest.mark.parametrize("engine", ["fastparquet", "pyarrow"])
@pytest.mark.parametrize("inline,record_size", [(0, 100_000), (100, 4)])
def test_parquet_references_equal_the_file(tmp_path, nc4, monkeypatch, engine, inline, record_size):
    """A Parquet reference set (a directory: .zmetadata and <array>/refs.N.parq) read with
    pyarrow and handed to the C parser as JSON: equal to netcdf4 on the file, relative paths
    resolving beside the directory as a JSON set's do beside the JSON; small records (several
    files an array) and inline chunks (the raw column) too."""
    pytest.importorskip("pyarrow")
    d = _parquet(_refs(nc4, inline), tmp_path / "refs.parq", engine, record_size, monkeypatch)
    assert _ferry.format_detect(d) == "refs"
    if record_size == 4:
        assert len([f for f in os.listdir(os.path.join(d, "t")) if f.endswith(".parq")]) > 1
    _identical(d, nc4)
    _identical(d + "/", nc4)
    want = xr.open_dataset(nc4, engine="netcdf4", mask_and_scale=False)
    with ferry.open(d) as f:
        assert f.format == "refs"
        np.testing.assert_array_equal(f["t"][1:5, ::2], want["t"].values[1:5, ::2])
    np.testing.assert_array_equal(ferry.read(d, "q"), want["q"].values)
    want.close()


def test_parquet_references_strings_and_outside(tmp_path, monkeypatch):
    """Embedded strings (inline chunks zarr-python reads) and targets outside the
    directory, refused unless allow_outside, as in JSON sets."""
    pytest.importorskip("pyarrow")
    pytest.importorskip("zarr")
    sub = tmp_path / "data"
    sub.mkdir()
    p = str(sub / "s.nc")
    xr.Dataset({"t": (("x",), np.arange(3.0)), "name": (("x",), np.array(["a", "bb", "ccc"], dtype=object))}
               ).to_netcdf(p, engine="netcdf4")
    d = _parquet(_refs(p, 0), sub / "s.parq", "pyarrow", 1000, monkeypatch)
    _identical(d, p)
    refs = _refs(p, 0)
    refs["refs"] = {k: (["../data/s.nc"] + v[1:] if isinstance(v, list) else v) for k, v in refs["refs"].items()}
    other = tmp_path / "other"
    other.mkdir()
    out = _parquet(refs, other / "o.parq", "pyarrow", 1000, monkeypatch)
    with pytest.raises(FerryError, match="outside"):
        xr.open_dataset(out, engine="ferry").load()
    _identical(out, p, allow_outside=True)


def test_parquet_references_need_pyarrow(tmp_path, nc4, monkeypatch):
    import subprocess
    import sys
    d = _parquet(_refs(nc4, 0), tmp_path / "refs.parq", "fastparquet" if _has("fastparquet") else "pyarrow",
                 1000, monkeypatch)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = ("import sys; sys.modules['pyarrow'] = None; sys.modules['pyarrow.parquet'] = None\n"
            "import xarray as xr, ferry\n"
            "try:\n"
            f"    xr.open_dataset({d!r}, engine='ferry')\n"
            "except ferry.FerryError as e:\n"
            "    assert 'pip install pyarrow' in str(e) and 'refs.parq' in str(e), e\n"
            "    print('ok')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=os.path.join(root, "python")))
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr


def _has(mod):
    try:
        __import__(mod)
        return True
    except ImportError:
        return False


def test_parquet_references_refused_by_the_c_library(tmp_path):
    """The C library reads JSON: a Parquet directory opened without its JSON is refused naming
    what reads it; a damaged table is an error naming the file."""
    d = tmp_path / "refs.parq"
    (d / "t").mkdir(parents=True)
    (d / ".zmetadata").write_text('{"metadata": {".zgroup": {"zarr_format": 2}, "t/.zarray": {"shape": [4], '
                                  '"chunks": [2], "dtype": "<f4", "fill_value": null, "order": "C", '
                                  '"filters": null, "compressor": null, "zarr_format": 2}}, "record_size": 10}')
    (d / "t" / "refs.0.parq").write_bytes(b"PAR1")
    assert _ferry.format_detect(str(d)) == "refs"
    with pytest.raises(FerryError, match="Parquet references.*pyarrow"):
        _ferry.Dataset(ferry.default_context(), str(d))
    if _has("pyarrow"):
        with pytest.raises(FerryError, match=r"refs\.0\.parq: not a readable Parquet file"):
            ferry.open(str(d))
    # a consolidated Zarr store is no Parquet reference set
    z = tmp_path / "plain.zarr"
    z.mkdir()
    (z / ".zgroup").write_text('{"zarr_format": 2}')
    (z / ".zmetadata").write_text('{"zarr_consolidated_format": 1, "metadata": {".zgroup": {"zarr_format": 2}}}')
    assert _ferry.format_detect(str(z)) == "zarr"


def test_remote_targets(tmp_path, nc4, monkeypatch):
    from rangeserver import RangeServer, ferry_reads_urls
    if not ferry_reads_urls():
        pytest.skip("ferry was built without libcurl")
    monkeypatch.setenv("FERRY_REMOTE_RETRY_SECONDS", "20")
    s = RangeServer().start()
    try:
        url = s.put("a.nc", open(nc4, "rb").read())
        refs = _refs(nc4, 0)
        refs["refs"] = {k: ([url] + v[1:] if isinstance(v, list) else v) for k, v in refs["refs"].items()}
        j = _write(tmp_path / "remote.json", refs)
        _identical(j, nc4)
        assert s.gets()   # the chunks came from the server (a small object: from its first range)
        # the reference set itself remote: its relative targets are URLs beside it
        jurl = s.put("refs.json", json.dumps(_refs(nc4, 0)).encode())
        want = xr.open_dataset(nc4, engine="netcdf4", mask_and_scale=False)
        np.testing.assert_array_equal(ferry.read(jurl, "t"), want["t"].values)
        local = _refs(nc4, 0)
        k = _first_ref(local)
        local["refs"][k] = [nc4] + local["refs"][k][1:]
        jurl = s.put("local.json", json.dumps(local).encode())
        with pytest.raises(FerryError, match="local file named by a remote reference set"):
            ferry.read(jurl, "t")
        local["refs"][k] = ["file://" + os.path.abspath(nc4)] + local["refs"][k][1:]   # the same as a file:// URL
        jurl = s.put("local2.json", json.dumps(local).encode())
        with pytest.raises(FerryError, match="local file named by a remote reference set"):
            ferry.read(jurl, "t")
    finally:
        s.stop()


def test_copy_moves_with_its_files(tmp_path, nc4):
    """Relative targets resolve against the JSON's directory, not the working directory."""
    d = tmp_path / "moved"
    d.mkdir()
    shutil.copy(nc4, d / "a.nc")
    j = _write(d / "refs.json", _refs(nc4, 0))
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        _identical(os.path.relpath(j), nc4)
    finally:
        os.chdir(cwd)


def test_a_template_that_renders_too_long_is_refused(tmp_path, nc4):
    """Templates cannot turn a small JSON into gigabytes: a rendered key or URL is bounded."""
    refs = _refs(nc4, 1)
    refs["templates"] = {"u": "x" * 5000}
    k = _first_ref(refs)
    refs["refs"][k] = ["{{u}}" * 4] + refs["refs"][k][1:]
    j = _write(tmp_path / "long.json", refs)
    with pytest.raises(FerryError, match="renders to more than 16384 bytes"):
        ferry.read(j, "t")


def test_parquet_references_dimension_separator_and_hostile_names(tmp_path, nc4, monkeypatch):
    """A .zarray with dimension_separator "/" numbers its chunks t/i/j (read equal, not as
    fill values); an array named outside the set ('../x') and a huge shape are FerryErrors
    (naming .zmetadata, or the reference bound), not reads elsewhere or Python's own exceptions."""
    import json as _json
    pytest.importorskip("pyarrow")
    d = _parquet(_refs(nc4, 0), tmp_path / "refs.parq", "pyarrow", 1000, monkeypatch)
    zm = os.path.join(d, ".zmetadata")
    with open(zm) as f:
        met = _json.load(f)
    orig = _json.dumps(met)
    za = met["metadata"]["t/.zarray"]
    za = za if isinstance(za, dict) else _json.loads(za)
    za["dimension_separator"] = "/"
    met["metadata"]["t/.zarray"] = _json.dumps(za)
    with open(zm, "w") as f:
        _json.dump(met, f)
    want = xr.open_dataset(nc4, engine="netcdf4", mask_and_scale=False)
    np.testing.assert_array_equal(ferry.read(d, "t"), want["t"].values)
    want.close()
    for key, value in (("../x/.zarray", _json.dumps(za)),
                       ("t/.zarray", _json.dumps(dict(za, shape=[10 ** 400] + za["shape"][1:])))):
        met = _json.loads(orig)
        met["metadata"][key] = value
        with open(zm, "w") as f:
            _json.dump(met, f)
        with pytest.raises(FerryError, match=r"\.zmetadata: \.\./x|more than \d+ chunk references"):
            ferry.read(d, "t")


def test_parquet_references_at_a_url_are_refused_saying_what_to_do(tmp_path, nc4, monkeypatch):
    """At a URL the C library cannot list a directory to tell a Parquet set from a consolidated
    Zarr store: it opens .zmetadata as a store's and, finding record_size, says what it is and
    what to do, naming the URL (not a complaint about consolidated metadata)."""
    pytest.importorskip("pyarrow")
    from rangeserver import RangeServer, ferry_reads_urls
    if not ferry_reads_urls():
        pytest.skip("ferry was built without libcurl")
    monkeypatch.setenv("FERRY_REMOTE_RETRY_SECONDS", "20")
    d = _parquet(_refs(nc4, 0), tmp_path / "r.parq", "pyarrow", 1000, monkeypatch)
    s = RangeServer().start()
    try:
        for root, _, files in os.walk(d):
            for f in files:
                full = os.path.join(root, f)
                s.put(os.path.relpath(full, tmp_path), open(full, "rb").read())
        url = f"http://127.0.0.1:{s.port}/r.parq"
        with pytest.raises(FerryError, match=r"r\.parq/\.zmetadata.*Parquet reference set.*JSON"):
            ferry.read(url, "t")
    finally:
        s.stop()
