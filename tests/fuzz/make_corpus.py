"""Write the fuzz seed corpus (tests/fuzz/corpus/NAME/) with the reference
writers: numpy, safetensors (+torch when installed), netCDF4 and scipy.
Run once with the project's .venv; the files are committed. Keep them small."""
import json, os, sys, tempfile
import numpy as np

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")

def out(target, name):
    d = os.path.join(root, target)
    os.makedirs(d, exist_ok=True)
    return os.path.join(d, name)

rng = np.random.default_rng(0)

# npy: dtypes, orders, versions
for i, (dt, shape, order) in enumerate([
        ("<f4", (3, 4), "C"), (">i2", (5,), "C"), ("<f8", (2, 3, 2), "F"), ("|b1", (7,), "C"),
        ("<c8", (2, 2), "C"), ("<M8[ns]", (3,), "C"), (">m8[s]", (2,), "C"), ("<f2", (4, 1), "F"),
        ("|u1", (), "C"), ("|S3", (2,), "C"), ("<u8", (0, 3), "C")]):
    a = np.zeros(shape, dtype=dt)
    if a.dtype.kind in "fiuc":
        a = (rng.standard_normal(shape) * 10).astype(dt)
    np.save(out("npy", f"seed-{i:02d}.npy"), np.asarray(a, order=order))
with open(out("npy", "seed-v2.npy"), "wb") as f:
    np.lib.format.write_array(f, np.arange(6, dtype="<i4").reshape(2, 3), version=(2, 0))
with open(out("npy", "seed-v3.npy"), "wb") as f:
    np.lib.format.write_array(f, np.arange(6, dtype="<i4"), version=(3, 0))

# safetensors: numpy flavour, and torch flavour for bf16 / fp8
from safetensors.numpy import save_file
save_file({"w": rng.standard_normal((4, 3)).astype("f4"), "b": np.arange(3, dtype="i8"),
           "e": np.zeros((0, 2), "f2"), "m": np.array([True, False])},
          out("safetensors", "seed-numpy.safetensors"), metadata={"format": "np", "note": "caf\u00e9"})
save_file({"x": np.arange(4, dtype="u1")}, out("safetensors", "seed-small.safetensors"))
try:
    import torch
    from safetensors.torch import save_file as tsave
    t = {"bf": torch.arange(6, dtype=torch.float32).reshape(2, 3).to(torch.bfloat16),
         "f8a": torch.arange(4, dtype=torch.float32).to(torch.float8_e4m3fn),
         "f8b": torch.arange(4, dtype=torch.float32).to(torch.float8_e5m2),
         "c": torch.ones(2, dtype=torch.complex64)}
    tsave(t, out("safetensors", "seed-torch.safetensors"), metadata={"format": "pt"})
except ImportError:
    print("torch missing: no torch-flavoured safetensors seed", file=sys.stderr)

# netCDF classic: netCDF4 in all three formats, and scipy
import netCDF4
for fmt, tag in [("NETCDF3_CLASSIC", "cdf1"), ("NETCDF3_64BIT_OFFSET", "cdf2"), ("NETCDF3_64BIT_DATA", "cdf5")]:
    p = out("netcdf", f"seed-{tag}.nc")
    with netCDF4.Dataset(p, "w", format=fmt) as nc:
        nc.createDimension("time", None); nc.createDimension("x", 3); nc.createDimension("c", 4)
        nc.title = "seed"; nc.setncattr("ints", np.array([1, 2], "i4")); nc.setncattr("nan", np.float32("nan"))
        v = nc.createVariable("v", "f4", ("time", "x"), fill_value=np.float32(-1)); v.units = "m"
        s = nc.createVariable("s", "i2", ("time",)); s[0:3] = [1, 2, 3]
        v[0:3] = np.arange(9).reshape(3, 3)
        k = nc.createVariable("k", "f8", ("x",)); k[:] = [0.5, 1.5, 2.5]
        ch = nc.createVariable("name", "S1", ("x", "c")); ch[:] = np.array([list(b"abcd")] * 3, "S1")
        if tag == "cdf5":
            u = nc.createVariable("u", "u8", ("x",)); u[:] = [1, 2, 2**63]
with netCDF4.Dataset(out("netcdf", "seed-single-record.nc"), "w", format="NETCDF3_CLASSIC") as nc:
    nc.createDimension("t", None)
    b = nc.createVariable("b", "i1", ("t",)); b[0:5] = np.arange(5)
from scipy.io import netcdf_file
with netcdf_file(out("netcdf", "seed-scipy.nc"), "w") as nc:
    nc.createDimension("t", None); nc.createDimension("y", 2)
    nc.history = b"scipy"
    v = nc.createVariable("z", "i4", ("t", "y")); v[:] = np.arange(6).reshape(3, 2)

# JSON: safetensors headers, Zarr metadata, and edge cases
docs = {
    "seed-st-header.json": '{"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}}',
    "seed-zarray.json": json.dumps({"zarr_format": 2, "shape": [10, 10], "chunks": [5, 5], "dtype": "<f8",
                                    "compressor": {"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 1},
                                    "fill_value": "NaN", "order": "C", "filters": None}),
    "seed-zarr3.json": json.dumps({"zarr_format": 3, "node_type": "array", "shape": [4], "data_type": "float32",
                                   "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2]}},
                                   "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
                                   "fill_value": 0, "attributes": {"a": [1, 2.5e-3, -0.0, True]}}),
    "seed-escapes.json": '["\\u00e9\\ud83d\\ude00", "a\\"b\\\\c\\/\\b\\f\\n\\r\\t", 18446744073709551615, -9223372036854775808, 1e308, null, false]',
    "seed-utf8.json": '{"\u00e9t\u00e9": "\u2603", "k": {}}',
}
for name, text in docs.items():
    with open(out("json", name), "w", encoding="utf-8") as f:
        f.write(text)

# pickle: the reader that runs nothing (torch.distributed.checkpoint's .metadata and plain values)
import collections
import pickle
with open(out("pickle", "seed-proto2.pickle"), "wb") as f:
    f.write(pickle.dumps({"a": [1, 2, (3, 4.5)], "b": b"xy", "c": None, "d": True, "e": 2**70, "f": -3}, protocol=2))
with open(out("pickle", "seed-proto5.pickle"), "wb") as f:
    f.write(pickle.dumps([collections.OrderedDict(x=1), {1, 2}, frozenset([3]), "\u00e9" * 300], protocol=5))
with open(out("pickle", "seed-global.pickle"), "wb") as f:
    f.write(pickle.dumps(collections.OrderedDict, protocol=2))
try:
    import tempfile
    import torch
    import torch.distributed.checkpoint as dcp
    with tempfile.TemporaryDirectory() as t:
        dcp.save({"w": torch.arange(10.0)}, storage_writer=dcp.FileSystemWriter(t))
        with open(os.path.join(t, ".metadata"), "rb") as src, open(out("pickle", "seed-torch-dcp.metadata"), "wb") as f:
            f.write(src.read())
except ImportError:
    pass

total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs)
print(f"corpus: {total} bytes")

# blosc: header and bstarts damage c-blosc refuses (issue 36.2), from a
# numcodecs frame of several blocks: blocksize past nbytes, the delta flag,
# typesize 0, a stored frame longer than its data, a bstarts entry pointing
# at another block's streams, an empty frame with trailing bytes
import numcodecs
frame = bytearray(numcodecs.Blosc("lz4", 5, numcodecs.Blosc.SHUFFLE, blocksize=256).encode(
    np.arange(256, dtype="<i4")))
def damaged(name, edit):
    b = bytearray(frame)
    edit(b)
    with open(out("blosc", "damaged_" + name), "wb") as f:
        f.write(bytes(b))
damaged("blocksize_past_nbytes", lambda b: b.__setitem__(slice(8, 12), (4096).to_bytes(4, "little")))
damaged("delta_flag", lambda b: b.__setitem__(2, b[2] | 0x08))
damaged("typesize_0", lambda b: b.__setitem__(3, 0))
damaged("bstart_repeated", lambda b: b.__setitem__(slice(20, 24), b[16:20]))
with open(out("blosc", "damaged_memcpyed_longer"), "wb") as f:
    f.write(bytes([2, 1, 3, 1]) + (4).to_bytes(4, "little") + (4).to_bytes(4, "little") +
            (24).to_bytes(4, "little") + bytes(8))
with open(out("blosc", "damaged_empty_trailing"), "wb") as f:
    f.write(bytes([2, 1, 3, 1]) + bytes(8) + (20).to_bytes(4, "little") + bytes(4))
# url (fuzz_url.c): first byte 0 = a URL, 1 = response header lines, 2 = an error body
for name, data in [
        ("s3_key", b"\x00s3://my-bucket/dir/a b+c.npy"), ("gs", b"\x00gs://pub/era5/t.nc"),
        ("https", b"\x00https://h.example:8443/a/b.npy?x=1#f"), ("file", b"\x00file:///tmp/a%20b.npy"),
        ("userinfo", b"\x00http://user:pw@h/x"),
        ("headers_206", b"\x01HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 0-65535/800128\r\n"
                        b"Content-Length: 65536\r\nETag: \"v1\"\r\nLast-Modified: Mon, 07 Dec 2026 13:00:00 GMT\r\n"),
        ("headers_416", b"\x01HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */0\r\n"
                        b"Content-Range: bytes 5-3/2\r\nContent-Length: -1\r\n"),
        ("body_slowdown", b"\x02<?xml version=\"1.0\"?><Error><Code>SlowDown</Code>"
                          b"<Message>Please reduce your request rate.</Message></Error>"),
        ("body_partial", b"\x02<Error><Code>NoSuchKey</Code>\x01\xff")]:
    with open(out("url", name), "wb") as f:
        f.write(data)

# list (fuzz_list.c): first byte even = a ListObjectsV2 XML page, odd = a GCS JSON list page (prefix "p/")
for name, data in [
        ("s3_page", b"\x00<?xml version=\"1.0\"?><ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
                    b"<IsTruncated>true</IsTruncated><Contents><Key>p/a&amp;b</Key><Size>12</Size></Contents>"
                    b"<CommonPrefixes><Prefix>p/c/</Prefix></CommonPrefixes>"
                    b"<NextContinuationToken>t1</NextContinuationToken></ListBucketResult>"),
        ("s3_entities", b"\x00<ListBucketResult><Contents><Key>p/&#x263A;&#0;&bogus;</Key><Size>1</Size></Contents>"
                        b"</ListBucketResult>"),
        ("gcs_page", b"\x01{\"nextPageToken\":\"CgRh\",\"prefixes\":[\"p/c/\"],"
                     b"\"items\":[{\"name\":\"p/zarr.json\",\"size\":\"42\"}]}")]:
    with open(out("list", name), "wb") as f:
        f.write(data)

# sniff: heads of the kinds the sniffer names (the files are small by hand:
# tests/fuzz/corpus/sniff/ holds a torch.save zip head, HDF5's signature,
# text, UTF-8 cut mid-sequence, an npy and a blosc frame)

# refs (fuzz_refs.c): kerchunk reference sets, version 0 and 1, inline chunks
# (text and base64, compressed and not), templates and gen entries
import base64, zlib
za = lambda shape, chunks, dt, comp=None, filters=None, fill=None: json.dumps(
    {"zarr_format": 2, "shape": shape, "chunks": chunks, "dtype": dt, "fill_value": fill, "order": "C",
     "compressor": comp, "filters": filters, "dimension_separator": "."})
v = np.arange(6, dtype="<f4")
refs_seeds = {
    "seed-v1-inline.json": {"version": 1, "refs": {
        ".zgroup": '{"zarr_format":2}', ".zattrs": '{"title":"x"}',
        "v/.zarray": za([6], [4], "<f4", fill="NaN"), "v/.zattrs": '{"_ARRAY_DIMENSIONS":["n"]}',
        "v/0": "base64:" + base64.b64encode(v[:4].tobytes()).decode(),
        "v/1": "base64:" + base64.b64encode(np.r_[v[4:], [0, 0]].astype("<f4").tobytes()).decode(),
        "c/.zarray": za([3], [3], "<i2", filters=[{"id": "shuffle", "elementsize": 2}, {"id": "zlib", "level": 1}]),
        "c/.zattrs": '{"_ARRAY_DIMENSIONS":["m"]}',
        "c/0": "base64:" + base64.b64encode(zlib.compress(np.array([1, 2, 3], "<i2").view("u1").reshape(3, 2).T.tobytes())).decode(),
        "t/.zarray": za([2], [2], "|u1"), "t/.zattrs": '{"_ARRAY_DIMENSIONS":["k"]}', "t/0": "ab"}},
    "seed-v0.json": {".zgroup": '{"zarr_format":2}', "a/.zarray": za([2, 2], [1, 2], ">i4", fill=0),
                     "a/.zattrs": '{"_ARRAY_DIMENSIONS":["y","x"]}',
                     "a/0.0": "base64:AAAAAQAAAAI=", "a/1.0": ["data.bin", 0, 8]},
    "seed-gen.json": {"version": 1, "templates": {"u": "data.bin"},
                      "gen": [{"key": "g/{{i}}", "url": "{{u}}", "offset": "{{(i + 1) * 8 // 2}}", "length": "4",
                               "dimensions": {"i": {"start": 0, "stop": 3, "step": 1}}},
                              {"key": "h/{{j}}", "url": "{{u}}", "dimensions": {"j": [0, 2]}}],
                      "refs": {".zgroup": '{"zarr_format":2}', "g/.zarray": za([3], [1], "<u4"),
                               "h/.zarray": za([4], [2], "<u2", comp={"id": "zstd", "level": 1}),
                               "sub/.zgroup": '{"zarr_format":2}', "sub/x/.zarray": za([], [], "<f8", fill=1.5),
                               "sub/x/0": "base64:AAAAAAAA+D8="}},
}
for name, doc in refs_seeds.items():
    with open(out("refs", name), "w") as f:
        json.dump(doc, f)
