"""Damaged files: ferry refuses whatever the reference reader refuses (issue 15.0b, 16.4).

For each format a small file (or store) is written by the reference library,
then one bit at a time is flipped (seeded; most flips land in the header or
metadata, where damage changes meaning) and the file is read whole by ferry
and by the reference reader. Per variable:
  - the reference refuses            -> ferry refuses (a FerryError, never data)
  - both read                        -> the values are bit-for-bit equal
  - ferry refuses, the reference reads -> allowed (stricter), counted
  - a variable one side has and the other lacks -> a failure (nothing silently
    dropped, nothing invented)
Every error ferry raises must be a FerryError. The figures are printed (run
with -s) and collected in SWEEP for the report."""
import json
import os
import random
import time
import warnings

import numpy as np
import pytest

import ferry

FLIPS = 300
SWEEP = {}


class Refused(Exception):
    pass


def native(a):
    a = np.asarray(a)
    if a.dtype.byteorder not in "=|":
        a = a.astype(a.dtype.newbyteorder("="))
    return a


def same(a, b):
    a, b = native(a), native(b)
    if a.shape != b.shape or a.dtype.itemsize != b.dtype.itemsize or a.dtype.kind != b.dtype.kind:
        return False
    return np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()


def ferry_read_all(path):
    """{name: array or Refused}, or Refused for the whole file; other exceptions propagate."""
    try:
        f = ferry.open(path)
    except ferry.FerryError as e:
        return Refused(str(e))
    out = {}
    for n in list(f):
        try:
            out[n] = np.asarray(f[n].read())
        except ferry.FerryError as e:
            out[n] = Refused(str(e))
    f.close()
    return out


def compare(ref, got, stats, where, pristine=None, damaged=None):
    """Apply the rules above; stats counts outcomes; returns a list of failures.
    pristine: the undamaged values; damaged: the array whose own file took the
    flip (None: a file of the whole store). Where the reference refuses the
    whole store (zarr-python opens a group all or nothing), ferry may still
    read an array that the flip did not touch, if its values are the pristine
    ones: one array's damage is not its neighbours' (ferry keeps them readable
    by design); the damaged array itself must be refused."""
    bad = []
    if isinstance(ref, Exception):
        stats["ref_refused"] += 1
        read = [] if isinstance(got, Exception) else [n for n, v in got.items() if not isinstance(v, Exception)]
        wrong = [n for n in read if damaged is None or n == damaged or pristine is None or n not in pristine
                 or not same(pristine[n], got[n])]
        if not read:
            stats["both_refused"] += 1
        elif not wrong:
            stats["both_refused"] += 1
            stats["ferry_read_untouched_neighbour"] += 1
        else:
            bad.append(f"{where}: reference refused ({ref!r:.120}) but ferry read {wrong}")
            stats["ferry_read_ref_refused"] += 1
        return bad
    if isinstance(got, Exception):
        stats["ferry_stricter"] += 1
        if os.environ.get("FERRY_DAMAGE_VERBOSE"):
            print(f"stricter: {where}: {got}")
        return bad
    for n in sorted(set(ref) | set(got)):
        r, g = ref.get(n, KeyError), got.get(n, KeyError)
        if r is KeyError or g is KeyError:
            bad.append(f"{where}: variable {n!r} only in {'ferry' if r is KeyError else 'the reference'}")
            stats["ferry_read_ref_refused" if r is KeyError else "dropped"] += 1
        elif isinstance(r, Exception):
            stats["ref_refused"] += 1
            if isinstance(g, Exception):
                stats["both_refused"] += 1
            else:
                bad.append(f"{where}: {n}: reference refused ({r!r:.120}) but ferry read it")
                stats["ferry_read_ref_refused"] += 1
        elif isinstance(g, Exception):
            stats["ferry_stricter"] += 1
            if os.environ.get("FERRY_DAMAGE_VERBOSE"):
                print(f"stricter: {where}: {n}: {g}")
        elif same(r, g):
            stats["both_read_equal"] += 1
        else:
            bad.append(f"{where}: {n}: values differ (reference {native(r).dtype}{native(r).shape}, "
                       f"ferry {native(g).dtype}{native(g).shape})")
            stats["differ"] += 1
    return bad


def sweep(name, target, files, ref_read, header_bytes, seed, owner=lambda p: None, flips=FLIPS):
    """Flip FLIPS single bits across `files` (paths) of `target` (the file or store ferry opens); header_bytes(path) -> how many
    leading bytes are metadata (80% of the flips land there)."""
    rng = random.Random(seed)
    stats = dict.fromkeys(["flips", "ref_refused", "both_refused", "ferry_read_ref_refused", "ferry_stricter",
                           "both_read_equal", "differ", "dropped", "ferry_read_untouched_neighbour"], 0)
    failures = []
    pristine = ref_read()
    originals = {p: open(p, "rb").read() for p in files}
    meta = [p for p in files if header_bytes(p) >= len(originals[p])]
    for i in range(flips):
        p = rng.choice(meta) if meta and rng.random() < 0.6 else rng.choice(files)
        data = bytearray(originals[p])
        hb = min(header_bytes(p), len(data))
        pos = rng.randrange(hb) if hb and rng.random() < 0.8 else rng.randrange(len(data))
        bit = rng.randrange(8)
        data[pos] ^= 1 << bit
        with open(p, "wb") as fh:
            fh.write(data)
        t0 = time.perf_counter()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    ref = ref_read()
                except Exception as e:   # noqa: BLE001 — any refusal of the reference counts
                    ref = e
            got = ferry_read_all(target)
            failures += compare(ref, got, stats, f"{name} flip {i}: {os.path.relpath(p, os.path.dirname(target))} byte {pos} "
                                f"bit {bit}", pristine, owner(p))
        finally:
            with open(p, "wb") as fh:
                fh.write(originals[p])
        if os.environ.get("FERRY_DAMAGE_VERBOSE") and time.perf_counter() - t0 > 0.05:
            print(f"slow: {name} flip {i} byte {pos} bit {bit}: {time.perf_counter() - t0:.2f} s")
        stats["flips"] += 1
    SWEEP[name] = stats
    print(f"\n{name}: {stats}")
    assert not failures, "\n".join(failures[:20])
    assert stats["ferry_read_ref_refused"] == 0 and stats["differ"] == 0 and stats["dropped"] == 0


# ---- npy -------------------------------------------------------------------------------------

def test_npy_bit_flips(tmp_path):
    p = str(tmp_path / "x.npy")
    np.save(p, np.arange(12, dtype="<f4").reshape(3, 4))
    t = str(tmp_path / "t.npy")
    np.save(t, np.array(["2020-01-01", "NaT"], dtype="datetime64[s]"))
    for path in (p, t):
        hlen = 10 + int.from_bytes(open(path, "rb").read()[8:10], "little")
        sweep(f"npy-{os.path.basename(path)}", path, [path],
              lambda path=path: {os.path.basename(path)[:-4]: np.load(path, allow_pickle=False)},
              lambda _p, h=hlen: h, seed=1)


def test_npy_invalid_datetime_unit_refused_at_open(tmp_path):
    p = str(tmp_path / "d.npy")
    np.save(p, np.zeros(2, dtype="datetime64[s]"))
    b = open(p, "rb").read().replace(b"<M8[s]", b"<M8[q]")
    open(p, "wb").write(b)
    with pytest.raises(Exception):
        np.load(p)
    with pytest.raises(ferry.FerryError, match="M8"):
        ferry.open(p)


# ---- safetensors ---------------------------------------------------------------------------

def test_safetensors_bit_flips(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    p = str(tmp_path / "m.safetensors")
    st.save_file({"w": np.arange(16, dtype="<f4").reshape(4, 4), "b": np.arange(3, dtype="<i8"),
                  "m": np.ones((2, 2), dtype="u1"), "h": np.full((64,), 7, "<f2")}, p, metadata={"k": "v"})
    n = 8 + int.from_bytes(open(p, "rb").read()[:8], "little")
    sweep("safetensors", p, [p], lambda: dict(st.load_file(p)), lambda _p: n, seed=2)


def test_safetensors_header_length_flip_is_refused(tmp_path):
    """A flipped bit in the length field moves the data start: safetensors
    refuses the file; ferry must refuse it, not return every tensor shifted."""
    st = pytest.importorskip("safetensors.numpy")
    p = str(tmp_path / "m.safetensors")
    st.save_file({"a": np.arange(64, dtype="<f4"), "b": np.arange(64, dtype="<f4")}, p)
    raw = bytearray(open(p, "rb").read())
    for bit in range(16):
        d = bytearray(raw)
        d[bit // 8] ^= 1 << (bit % 8)
        open(p, "wb").write(d)
        with pytest.raises(Exception):
            st.load_file(p)
        with pytest.raises(ferry.FerryError):
            f = ferry.open(p)
            [f[k].read() for k in f]


# ---- netCDF-3 ------------------------------------------------------------------------------

def nc3_files(tmp_path):
    """Classic and 64-bit-offset files written by netCDF4 (scipy writes 0-d
    variables over the record block: netCDF4 refuses its files, so does ferry)."""
    import netCDF4
    out = []
    for fmt in ("NETCDF3_CLASSIC", "NETCDF3_64BIT_OFFSET"):
        p = str(tmp_path / f"{fmt}.nc")
        with netCDF4.Dataset(p, "w", format=fmt) as f:
            f.history = "bit flips"
            f.createDimension("time", None)
            f.createDimension("x", 3)
            t = f.createVariable("time", "i4", ("time",))
            t[:] = [0, 1]
            v = f.createVariable("temp", "f4", ("time", "x"))
            v[:] = np.arange(6, dtype="f4").reshape(2, 3)
            v.units = "K"
            c = f.createVariable("x", "f8", ("x",))
            c[:] = [10.0, 20.0, 30.0]
            s = f.createVariable("s", "i2", ())
            s.assignValue(5)
        out.append(p)
    return out


def nc3_header_len(p):
    """Bytes before the first variable's data (the lowest data offset)."""
    with ferry.open(p) as f:
        return min(f[n].info["data_offset"] for n in f)


def test_netcdf3_bit_flips(tmp_path):
    netCDF4 = pytest.importorskip("netCDF4")
    scipy_netcdf = pytest.importorskip("scipy.io")
    for p in nc3_files(tmp_path):
        hl = nc3_header_len(p)

        def ref(p=p):
            # both reference readers: damage either refuses is damage
            with netCDF4.Dataset(p) as d:
                d.set_auto_maskandscale(False)
                got = {n: np.array(v[...]) for n, v in d.variables.items()}
            with scipy_netcdf.netcdf_file(p, "r", mmap=False, maskandscale=False) as f:
                for n, v in f.variables.items():
                    if n not in got or not same(got[n], np.array(v.data)):
                        raise ValueError(f"scipy and netCDF4 disagree on {n}")
            return got
        sweep(f"netcdf3-{os.path.basename(p)}", p, [p], ref, lambda _p, h=hl: h, seed=3, flips=200)


# ---- Zarr ----------------------------------------------------------------------------------

def zarr_store(tmp_path, fmt):
    zarr = pytest.importorskip("zarr")
    numcodecs = pytest.importorskip("numcodecs")
    store = str(tmp_path / f"z{fmt}.zarr")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g = zarr.open_group(store, mode="w", zarr_format=fmt)
        if fmt == 2:
            a = g.create_array("a", shape=(6, 4), chunks=(3, 4), dtype="<i4", compressors=numcodecs.Zlib(level=1),
                               fill_value=-1)
            b = g.create_array("b", shape=(5,), chunks=(2,), dtype="<f8", compressors=None, fill_value=0.5)
        else:
            from zarr.codecs import BytesCodec, Crc32cCodec, ZstdCodec
            a = g.create_array("a", shape=(6, 4), chunks=(3, 4), dtype="int32", serializer=BytesCodec(),
                               compressors=[ZstdCodec(level=1), Crc32cCodec()], fill_value=-1)
            b = g.create_array("b", shape=(5,), chunks=(2,), dtype="float64", compressors=None, fill_value=0.5)
        a[:] = np.arange(24, dtype="i4").reshape(6, 4)
        b[:4] = np.arange(4.0)    # the last chunk missing: a fill
        if fmt == 2:
            zarr.consolidate_metadata(store)
    return store


def zarr_ref(store):
    """Per array: its values, or the exception zarr-python raised reading it."""
    import zarr
    g = zarr.open_group(store, mode="r")
    out = {}
    for n in g.array_keys():
        try:
            out[n] = np.asarray(g[n][...])
        except Exception as e:   # noqa: BLE001
            out[n] = e
    return out


@pytest.mark.parametrize("fmt", [2, 3])
def test_zarr_bit_flips(tmp_path, fmt):
    store = zarr_store(tmp_path, fmt)
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(store) for f in fs)
    metas = {".zarray", ".zattrs", ".zgroup", ".zmetadata", "zarr.json"}
    files.sort(key=lambda p: os.path.basename(p) not in metas)   # any file: the path gives the store
    sweep(f"zarr-v{fmt}", store, files, lambda: zarr_ref(store),
          lambda p: os.path.getsize(p) if os.path.basename(p) in metas else 0, seed=4 + fmt,
          owner=lambda p: (os.path.relpath(p, store).split(os.sep) + [None])[0] if os.sep in os.path.relpath(p, store)
          else None)


# ---- shapes numpy cannot hold (issue 16.6) ----------------------------------------------

@pytest.mark.parametrize("shape", [[0, 2**62, 2**62], [0, 2**63 - 1], [2**40, 2**40]])
def test_shapes_numpy_cannot_hold_are_ferry_errors(tmp_path, shape):
    """A zero-size array with a huge dimension: numpy raises ValueError ("array is
    too big"), safetensors' own parser accepts it; ferry refuses it at open with
    a FerryError naming the file, in every format."""
    import struct
    st = str(tmp_path / "t.safetensors")
    h = json.dumps({"t": {"dtype": "F32", "shape": shape, "data_offsets": [0, 0]}}).encode()
    open(st, "wb").write(struct.pack("<Q", len(h)) + h)
    z = str(tmp_path / "z.zarr")
    os.makedirs(z)
    json.dump({"zarr_format": 2, "shape": shape, "chunks": [1] * len(shape), "dtype": "<f4", "fill_value": 0,
               "order": "C", "filters": None, "compressor": None}, open(os.path.join(z, ".zarray"), "w"))
    npy = str(tmp_path / "n.npy")
    hd = "{'descr': '<f4', 'fortran_order': False, 'shape': %s, }" % (tuple(shape),)
    hd = hd + " " * (118 - len(hd)) + "\n"
    open(npy, "wb").write(b"\x93NUMPY\x01\x00" + len(hd).to_bytes(2, "little") + hd.encode())
    for p in (st, z, npy):
        with pytest.raises(ferry.FerryError, match="overflows") as ei:
            ferry.read(p)
        assert p in str(ei.value)
