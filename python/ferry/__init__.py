"""ferry — move array data between files and GPU or host memory, fast.

    import ferry
    x = ferry.read("a.npy")                         # numpy array, read by the engine
    x = ferry.read("m.safetensors", "w", device=0)  # cupy array (or ferry.Array: DLPack) on cuda:0
    f = ferry.open("era5.nc"); f.variables; f["t2m"][0:10]
    xs = ferry.read_many([("a.npy", None, None), ("b.nc", "t", (slice(0, 4),))])   # one plan
    ferry.stats()                                   # which path ran, bytes, seconds

The heavy lifting is in C (ferry._ferry, include/ferry.h); this module only
turns Python arguments into plans. numpy is needed; cupy and torch are used
when present and imported lazily.
"""
from __future__ import annotations

import functools
import json
import math
import os
import sys
import threading
from typing import Any, Iterable, Sequence

from . import _checks, _ferry, _nogpu, _parquet_refs, _progress
from ._ferry import PATHS, Array, Context, Dataset, FerryError, File, Job, Plan

__version__: str = _ferry.__version__

__all__ = [
    "FerryError", "Context", "Dataset", "File", "Plan", "Job", "Array", "PATHS",
    "empty", "read", "open", "read_many", "stats", "reset_stats", "default_context",
    "parse_device", "parse_size", "__version__",
]

_lock = threading.Lock()


def _wheel_lib_dirs() -> None:
    """Tell the library where the CUDA wheels keep libnvrtc (nvidia/cu13/lib or
    nvidia/cuda_nvrtc/lib, which torch brings; used when the build embedded no nvcc
    fatbin) and libnvcomp (nvidia/libnvcomp/lib64): they are not on the loader's path.
    Found by name, nothing imported and the user's environment left alone;
    FERRY_NVRTC and FERRY_NVCOMP still come first."""
    import glob
    import importlib.util
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return
    bases = list(getattr(spec, "submodule_search_locations", None) or [])
    nvrtc = sorted((p for b in bases for p in glob.glob(os.path.join(b, "*", "lib", "libnvrtc.so.*"))),
                   key=os.path.basename, reverse=True)
    if nvrtc:
        _ferry.nvrtc_search_dir(os.path.dirname(nvrtc[0]))
    nvcomp = [d for b in bases for d in [os.path.join(b, "libnvcomp", "lib64")] if os.path.isdir(d)]
    if nvcomp:
        _ferry.nvcomp_search_dir(nvcomp[0])


_wheel_lib_dirs()


def default_context() -> Context:
    """The process-wide Context (created on first use; FERRY_* variables apply)."""
    return _ferry.default_context()


def stats(ctx: Context | None = None) -> dict:
    """Statistics of the default (or given) context: bytes, ops and seconds per
    path; "kernels": the GPU kernel image in use ("embedded fatbin", or "none":
    device data is then byteswapped on the CPU)."""
    d = (ctx or default_context()).stats()
    d["kernels"] = _ferry.kernels_source()
    return d


def parse_size(s) -> int:
    """Bytes of a size, as the C library reads every size (ferry_size_parse):
    "8M" = "8MiB" = 8·2²⁰, "5GB" = 5·10⁹ (as Hugging Face reads it); ints pass."""
    return _ferry.size_parse(s)


def reset_stats(ctx: Context | None = None) -> None:
    (ctx or default_context()).reset_stats()


# ---------------------------------------------------------------------------
# devices, dtypes, allocation
# ---------------------------------------------------------------------------
def _device_index(device: Any) -> int | None:
    """The one parser of every device= in the package (ferry.read/open, the xarray
    backend, the torch datasets, checkpoints): -1 for the CPU ("cpu", None, -1,
    torch.device("cpu")), the CUDA ordinal (n >= 0, "cuda:N", "gpu:N",
    torch.device("cuda", N)), or None for "cuda"/"gpu"/torch.device("cuda")
    without one: the current device, taken by the caller when it uses it.
    Anything else is a ValueError (TypeError for a bool), never a guess: a
    torch.device("mps") or "cuda:-1" was once taken for CUDA device 0 or the CPU."""
    if device is None:
        return -1
    if isinstance(device, bool):
        raise TypeError("device must be 'cpu', an int or 'cuda:N'")
    if isinstance(device, int):
        if device < -1:
            raise ValueError(f"unknown device {device} (-1 is the CPU, n >= 0 a CUDA device)")
        return device
    if not isinstance(device, str):
        t = getattr(device, "type", None)          # torch.device
        if t is None:
            raise TypeError(f"device must be 'cpu', an int, 'cuda:N' or a torch.device, not "
                            f"{type(device).__name__}")
        if t not in ("cpu", "cuda"):
            raise ValueError(f"unknown device {device!r}: ferry reads into CPU or CUDA memory")
        i = getattr(device, "index", None)
        return -1 if t == "cpu" else i
    d = device.strip().lower()
    if d == "cpu":
        return -1
    if d in ("cuda", "gpu"):
        return None
    for p in ("cuda:", "gpu:"):
        if d.startswith(p) and d[len(p):].isdigit():
            return int(d[len(p):])
    raise ValueError(f"unknown device {device!r} (use 'cpu', an int or 'cuda:N')")


def _current_cuda_device() -> int:
    """The package's one answer to "the current CUDA device" (device="cuda" without an
    ordinal, in ferry.read, the xarray backend, the datasets, checkpoints and DALI):
    torch's current device once torch has set CUDA up (torch.cuda.set_device does), else
    0, the device a fresh process starts on."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return torch.cuda.current_device()
    return 0


def parse_device(device: Any) -> int:
    """"cpu"/None/-1 -> -1; int n, "cuda:N", torch.device("cuda", N) -> N; "cuda" ->
    the current CUDA device (torch's, else 0). Other values raise ValueError."""
    d = _device_index(device)
    return _current_cuda_device() if d is None else d


def _torch_device(device: Any):
    """device= as a torch.device (cpu, cuda:N, or cuda for the current device):
    the torch adapters' spelling of the same parse."""
    import torch
    d = _device_index(device)
    return torch.device("cpu") if d == -1 else torch.device("cuda") if d is None else torch.device("cuda", d)


# types numpy lacks, by the library's long names (ferry_dtype_name)
_NUMPY_LACKS = frozenset(r[1] for r in _ferry.DTYPES if r[3] == r[1])


def _numpy_dtype(typestr: str):
    """numpy dtype for a ferry typestr, or None for types numpy lacks (bf16, fp8)."""
    import numpy as np
    if typestr in _NUMPY_LACKS:
        return None
    try:
        return np.dtype(typestr)
    except (TypeError, ValueError, SyntaxError):   # e.g. a Zarr type ferry lacks, named as written
        return None


def _native_typestr(typestr: str) -> str:
    if len(typestr) >= 3 and typestr[0] in "<>=" and typestr[1] not in "SUVO":
        return ("<" if _little() else ">") + typestr[1:]
    return typestr


def _little() -> bool:
    import sys
    return sys.byteorder == "little"


def _cupy():
    try:
        import cupy
        return cupy
    except Exception:  # noqa: BLE001 — any import failure means "no cupy"
        return None


def empty(shape, dtype: Any = "u1", device: Any = "cpu", *, ctx: Context | None = None,
          pinned: bool = False) -> Array:
    """ferry-owned memory: host (4 KiB-aligned, or page-locked with pinned=True) or device."""
    import numpy as np
    if isinstance(dtype, str) and dtype in _NUMPY_LACKS:
        ts = dtype
    else:
        ts = np.dtype(dtype).str
    if isinstance(shape, int):
        shape = (shape,)
    with _nogpu.device_alloc("ferry.empty", device, ctx):
        return _ferry.empty(tuple(int(s) for s in shape), ts, parse_device(device), ctx, pinned)


def _alloc(shape: tuple, typestr: str, dev: int, ctx: Context, where: str = "ferry.read"):
    """Destination for a read: numpy (host), cupy (device, when importable) or ferry.Array."""
    import numpy as np
    dt = _numpy_dtype(typestr)
    if dev < 0:
        arr = _ferry.empty(shape, typestr, -1, ctx)
        if dt is None:
            return arr
        return np.asarray(arr)
    cp = _cupy()
    with _nogpu.device_alloc(where, dev, ctx):   # no GPU here: one message, not cupy's or the driver's
        if cp is not None and dt is not None:
            with cp.cuda.Device(dev):
                return cp.empty(shape, dtype=dt)
        return _ferry.empty(shape, typestr, dev, ctx)


# ---------------------------------------------------------------------------
# selections
# ---------------------------------------------------------------------------
def normalize_selection(selection: Any, shape: Sequence[int]):
    """Turn a selection into (triples, out_shape, squeeze_axes).

    selection: None; a tuple of ints / slices (step > 0) / Ellipsis; or a
    sequence of (start, stop[, step]) triples. Negative indices count from the
    end; slices are clipped like numpy's. (The C extension decides:
    _ferry.normalize_selection.)
    """
    return _ferry.normalize_selection(shape, selection)


# ---------------------------------------------------------------------------
# attributes (JSON from the C parsers) -> Python values
# ---------------------------------------------------------------------------
def _json_number(v):
    if isinstance(v, str):
        return {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}.get(v, v)
    return v


def decode_attrs(attrs_json: str, fmt: str) -> dict:
    """Attributes from a Dataset's JSON, with the types the reference readers give.

    netcdf3 and hdf5 numeric attributes {"type": "<typestr>", "value": [...]}
    become numpy scalars (one value) or 1-d arrays; text attributes become str.
    Other formats' attributes are returned as parsed JSON.
    """
    d = json.loads(attrs_json or "{}")
    return _typed_attrs(d) if fmt in ("netcdf3", "hdf5") else d


def _decode_attrs_many(attrs_jsons: Sequence[str], fmt: str) -> list:
    """decode_attrs of many JSON texts, parsed by one json.loads (an open of
    thousands of variables pays the parser's call once, not per variable)."""
    ds = json.loads("[" + ",".join(a or "{}" for a in attrs_jsons) + "]")
    return [_typed_attrs(d) for d in ds] if fmt in ("netcdf3", "hdf5") else ds


_ATTR_SCALAR: dict = {}   # typestr -> (native dtype, its scalar type or None): a handful per process


def _attr_type(t: str):
    import numpy as np
    dt = np.dtype(t).newbyteorder("=")
    r = _ATTR_SCALAR[t] = (dt, dt.type if dt.kind in "iuf" else None)
    return r


def _typed_attrs(d: dict) -> dict:
    for k, v in d.items():
        if type(v) is dict and "type" in v and "value" in v:
            t, vals = v["type"], v["value"]
            dt, scalar = _ATTR_SCALAR.get(t) or _attr_type(t)
            if scalar is not None and len(vals) == 1 and type(vals[0]) is not str:
                d[k] = scalar(vals[0])     # the scalar np.array([x], dt)[0] is, built directly
            else:
                import numpy as np
                arr = np.array([_json_number(x) for x in vals], dtype=dt)
                d[k] = arr[0] if arr.size == 1 else arr
    return d


# ---------------------------------------------------------------------------
# reading
# ---------------------------------------------------------------------------
def _ctx_of(ctx: Context | None, storage_options: dict | None = None) -> Context:
    """ctx, or the context of storage_options (ferry._remote: URLs' endpoint, credentials), or the default."""
    if storage_options:
        if ctx is not None:
            raise ValueError("ferry: give ctx= or storage_options=, not both (set remote options on your "
                             "Context with ctx.set_remote_option)")
        from ._remote import remote_context
        return remote_context(storage_options)
    return ctx if ctx is not None else default_context()


def _fspath(path) -> str:
    """str, bytes or PathLike -> str; bytes that are not UTF-8 (os.fsencode'd
    names) become surrogate escapes, which the extension encodes back exactly."""
    return os.fsdecode(os.fspath(path))


def _open_dataset(path: str, ctx: Context):
    """A ferry Dataset, or None when the file has no format ferry knows (raw bytes)."""
    try:
        return _parquet_refs.dataset(ctx, os.fspath(path))
    except FerryError as e:
        # a file, or a URL the C library opened (its scheme decides, as there),
        # in no format ferry knows: its raw bytes
        if e.code == _ferry.ENOFORMAT and (os.path.isfile(path) or "://" in path):
            return None
        raise


def _pick_var(ds: Dataset, name: str | None) -> dict:
    if name is None:
        vs = ds.variables()
        if len(vs) == 1:
            return vs[0]
        names = [v["name"] for v in vs]
        raise ValueError(f"{ds.path} holds {len(vs)} variables; name one of {names[:20]}")
    return ds.variable(name)


def _same_type(a: str, b: str) -> bool:
    if a == b:
        return True
    da, db = _numpy_dtype(a), _numpy_dtype(b)
    return da is not None and db is not None and da == db


def _check_out(out, nbytes: int, shape: tuple, typestr: str, where: str, out_bytes: bool,
               bytes_hint: bool = True) -> dict:
    """out= must be writable, C-contiguous memory of the selection's dtype and shape (as
    numpy's and torch's out= demand): filling a float64 array with float32 bytes reinterprets
    them. out_bytes=True asks for the bytes as they are: then only the size counts. The
    layout is the extension's (buffer_layout: what the engine will be handed); returned.
    bytes_hint: the caller takes out_bytes= (the messages then say so)."""
    try:
        lay = _ferry.buffer_layout(out)
    except (TypeError, ValueError, BufferError, RuntimeError) as e:   # no memory, or torch's "requires grad"
        raise FerryError(_ferry.EINVAL, f"{where}: out= is not memory ferry can fill: {e}") from None
    if lay["readonly"]:
        raise FerryError(_ferry.EINVAL, f"{where}: out= is read-only ({type(out).__name__}): pass a writable "
                                        "array, or leave out= out to get a new one")
    if not lay["contiguous"]:
        raise FerryError(_ferry.EINVAL, f"{where}: out= is not C-contiguous (shape {lay['shape']}, strides "
                                        f"{lay['strides']} bytes): pass a contiguous array (np.ascontiguousarray, "
                                        "torch's .contiguous()) and copy into the view afterwards")
    ots, oshape = lay["typestr"], tuple(lay["shape"])
    known = not ots.startswith("|V")
    if not out_bytes:
        if not known:
            raise FerryError(_ferry.EINVAL, f"{where}: cannot tell the dtype of out= ({type(out).__name__}); "
                                            "pass out_bytes=True to fill its bytes as they are")
        if not _same_type(ots, typestr):
            raise FerryError(_ferry.EINVAL, f"{where}: out= has dtype {ots}, the data is {typestr}: a dtype "
                                            "mismatch (pass an out= of the data's dtype" + (
                                                ", or out_bytes=True to fill out's bytes as they are)"
                                                if bytes_hint else ")"))
    if lay["nbytes"] != nbytes:
        raise FerryError(_ferry.EINVAL, f"{where}: out= holds {lay['nbytes']} bytes, the selection needs {nbytes} "
                                        f"(shape {tuple(shape)}, {typestr})")
    if not out_bytes and oshape != tuple(shape):
        raise FerryError(_ferry.EINVAL, f"{where}: out= has shape {oshape}, the selection is {tuple(shape)}"
                                        + (" (pass out_bytes=True to fill out's bytes as they are)" if bytes_hint else ""))
    return lay


def typestr_itemsize(ts: str) -> int:
    """Bytes per element of a typestr ("<f4" -> 4, "bfloat16" -> 2), 0 if unknown."""
    if ts in _NUMPY_LACKS:
        return _ferry.dtype_itemsize(ts)
    dt = _numpy_dtype(ts)
    return dt.itemsize if dt is not None else 0


def _bytes_str(n: int) -> str:
    for unit, k in (("EiB", 60), ("PiB", 50), ("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << k:
            return f"{n / (1 << k):.1f} {unit}"
    return f"{n} bytes"


def _prepare_dst(out, nbytes: int, shape: tuple, typestr: str, dev: int, ctx: Context,
                 where: str = "ferry.read", out_bytes: bool = False):
    """(destination object for the plan, value to return)."""
    if out is None:
        try:
            arr = _alloc(shape, typestr, dev, ctx, where)
        except MemoryError as e:   # numpy's and the extension's say nothing of what was asked
            raise FerryError(_ferry.ENOMEM, f"{where}: the result would be {nbytes} bytes ({_bytes_str(nbytes)}, "
                                            f"shape {tuple(shape)} of {typestr}), more than can be allocated "
                                            "here: read a selection, or into out=") from e
        return arr, arr
    _check_out(out, nbytes, shape, typestr, where, out_bytes)
    return out, out          # the extension takes every kind of memory, torch's CPU tensors by DLPack


def _producer_stream(obj):
    """(CUstream handle, device) of the stream whose queued work may still use a
    caller's device array (cupy.zeros, a torch kernel): torch's current stream on
    the tensor's device, or __cuda_array_interface__ v3's "stream" (1 legacy, 2
    per-thread default); None when there is none to wait for."""
    mod = type(obj).__module__
    if mod.startswith("torch"):
        if obj.device.type != "cuda":
            return None
        import torch
        return torch.cuda.current_stream(obj.device).cuda_stream, obj.device.index
    try:
        cai = obj.__cuda_array_interface__
    except AttributeError:
        return None
    s = cai.get("stream") if isinstance(cai, dict) else None
    return None if s is None else (int(s), -1)


def _wait_producer(plan: Plan, obj) -> None:
    """The plan's jobs first wait (in the engine, not here) for obj's producer stream."""
    ps = _producer_stream(obj)
    if ps is not None:
        plan.wait_stream(*ps)


def _sync_producer(obj) -> None:
    """Wait here for obj's producer stream: for the synchronous ctx.memcpy, which
    takes no plan (plans use _wait_producer)."""
    ps = _producer_stream(obj)
    if ps is None:
        return
    s = ps[0]
    if type(obj).__module__.startswith("torch"):
        import torch
        torch.cuda.current_stream(obj.device).synchronize()
        return
    cp = _cupy()
    if cp is not None:
        if s in (1, 2):
            cp.cuda.Stream.null.synchronize() if s == 1 else cp.cuda.Stream.ptds.synchronize()
        else:
            cp.cuda.ExternalStream(int(s)).synchronize()


def _add_read(plan: Plan, ds: Dataset | None, file: File | None, var: dict | None, selection, dev: int,
              out, ctx: Context, out_bytes: bool = False, steps=None):
    """Append one array read to plan; returns (result object, post-processing). steps
    (_progress.ReadSteps, for progress=): the read runs now, in steps, reported."""
    import numpy as np
    if ds is None:  # raw file: uint8 bytes
        size = file.size
        triples, shape, squeeze = normalize_selection(selection, (size,))
        start, stop, step = triples[0] if triples else (0, size, 1)
        if step != 1:
            raise ValueError("raw files take contiguous byte ranges only")
        n = max(0, stop - start)
        dst, ret = _prepare_dst(out, n, (n,), "|u1", dev, ctx, f"{file.path}", out_bytes)
        _wait_producer(plan, dst)
        if n:
            plan.read_file(file, start, n, dst)
        return ret, (lambda r: r[0] if squeeze and not isinstance(r, Array) else r)
    if var.get("error"):  # a type, codec... ferry cannot read: the parser's message, before any allocation
        raise FerryError(_ferry.EUNSUPPORTED, var["error"])
    if var.get("dtype") == "str":   # variable-length strings: read now, into a numpy array of str
        return _read_strings(ds, var, selection, dev, out), (lambda r: r)
    shape = tuple(var["shape"])
    typestr = _native_typestr(var["typestr"])
    triples, sel_shape, squeeze = normalize_selection(selection, shape)
    itemsize = int(var["itemsize"])   # C refused shapes no array library holds at open
    nbytes = math.prod(sel_shape) * itemsize
    # integer indices drop their axes (as numpy's do): the new array gets the
    # squeezed shape from the start, the same bytes
    final = tuple(n for i, n in enumerate(sel_shape) if i not in squeeze)
    dst, ret = _prepare_dst(out, nbytes, final, typestr, dev, ctx, f"{ds.path}: {var['name']}", out_bytes)
    _wait_producer(plan, dst)
    if nbytes:
        # numpy keeps unicode in its stored byte order (">U3" stays ">U3"):
        # swapped to host order, its bytes would no longer be what the dtype says
        native = not (typestr[:2] == ">U" and _little()) and not (typestr[:2] == "<U" and not _little())
        if steps is not None:
            c0 = int((var.get("chunks") or shape)[0]) if shape else 1     # whole variable: not chunked
            steps.read(lambda p, t, d: p.read(ds, var["name"], d, t, native), triples, sel_shape, squeeze,
                       itemsize, c0 if c0 < shape[0] else 1, dst, nbytes)
        else:
            plan.read(ds, var["name"], dst, triples, native)
    return ret, (lambda r: r)


def _read_strings(ds: Dataset, var: dict, selection, dev, out):
    """A string variable's selection as a numpy object array of str (ferry_dataset_read_strings):
    host memory only, no out= (the elements are Python objects)."""
    import numpy as np
    if out is not None or (dev is not None and dev >= 0):
        raise FerryError(_ferry.EINVAL, f"{ds.path}: {var['name']}: variable-length strings are read into a "
                         "numpy array of str on the CPU (no device=, no out=)")
    shape = tuple(var["shape"])
    triples, sel_shape, squeeze = normalize_selection(selection, shape)
    got = ds.read_strings(var["name"], triples if shape else None)
    arr = np.empty(len(got), dtype=object)
    arr[:] = got
    return arr.reshape(tuple(n for i, n in enumerate(sel_shape) if i not in squeeze))   # 0-d as numbers read


def read(path, name: str | None = None, *, device: Any = "cpu", selection: Any = None, out: Any = None,
         ctx: Context | None = None, path_policy: str | None = None, threads: int = 0,
         out_bytes: bool = False, decode: str | None = None, progress: Any = None,
         storage_options: dict | None = None):
    """Read one whole array / tensor / variable (or a selection of it).

    device: "cpu" (numpy), an int or "cuda:N" (cupy when importable, else a
    ferry.Array usable through DLPack). out: a numpy / cupy / torch array to
    fill in place (C-contiguous, the selection's dtype and shape, as numpy's
    and torch's out= demand: anything else is a FerryError). out_bytes=True
    fills out with the selection's bytes as they are, whatever its dtype and
    shape (a byte view; only the byte count must match). A file with no
    format ferry knows reads as uint8 bytes.
    decode: where compressed chunks are decoded, "auto" (default; FERRY_DECODE),
    "gpu" (nvCOMP) or "cpu".
    progress: None (off), True/"tqdm" (a tqdm bar, or log lines without tqdm) or
    progress(done_bytes, total_bytes): the read then runs as about 20 plans along the first
    axis, cut at chunk boundaries, each reported when done.
    storage_options: for s3://, gs://, https:// URLs (endpoint_url, key, secret, anon, ...:
    docs/remote.md), in place of ctx.
    """
    threads = _checks.check("ferry.read", "threads", threads)
    _progress.check("ferry.read", progress)
    c = _ctx_of(ctx, storage_options)
    dev = parse_device(device) if out is None else None     # out= is where the data goes
    path = _fspath(path)
    try:
        ds = _open_dataset(path, c)
    except FerryError as e:
        if e.code == _ferry.EUNSUPPORTED and "structured npy" in str(e):
            from ._numpy_files import _read_structured_npy
            return _read_structured_npy(path, device=device, selection=selection, out=out, ctx=c,
                                        out_bytes=out_bytes)
        from ._h5open import _H5Opened, _is_hdf5
        if not _is_hdf5(path, e):
            raise
        with _H5Opened(path, device=device, ctx=c) as h:
            return h.read(name, selection, device=device if out is None else None, out=out, out_bytes=out_bytes)
    from ._numpy_files import _is_zip, _read_npz
    if ds is None and _is_zip(path):
        return _read_npz(path, name, device=device, selection=selection, out=out, ctx=c, out_bytes=out_bytes)
    f = None
    try:
        if ds is None:
            f = File(c, path)
            var = None
        else:
            var = _pick_var(ds, name)
        plan = Plan()
        steps = None if not progress or var is None else _progress.ReadSteps(
            progress, f"read {os.path.basename(path)} {var['name']}",
            lambda p: c.run(p, path=path_policy, threads=threads, decode=decode), _wait_producer)
        ret, post = _add_read(plan, ds, f, var, selection, dev, out, c, out_bytes, steps)
        if len(plan):
            c.run(plan, path=path_policy, threads=threads, decode=decode)
        return post(ret)
    finally:
        if f is not None:
            f.close()
        if ds is not None:
            ds.close()


def read_many(items: Iterable, *, device: Any = "cpu", ctx: Context | None = None,
              path_policy: str | None = None, threads: int = 0, decode: str | None = None) -> list:
    """Read many (path, name, selection) triples with ONE plan (one engine run).

    Returns a list of arrays in the order given. name may be None for
    single-array files; selection None for whole arrays."""
    threads = _checks.check("ferry.read_many", "threads", threads)
    c = _ctx_of(ctx)
    dev = parse_device(device)
    opened: dict = {}
    files: dict = {}
    plan = Plan()
    pending = []
    try:
        for it in items:
            it = tuple(it)
            p = _fspath(it[0])
            name = it[1] if len(it) > 1 else None
            sel = it[2] if len(it) > 2 else None
            if p not in opened:
                opened[p] = _open_dataset(p, c)
            ds = opened[p]
            f = None
            var = None
            if ds is None:
                if p not in files:
                    files[p] = File(c, p)
                f = files[p]
            else:
                var = _pick_var(ds, name)
            pending.append(_add_read(plan, ds, f, var, sel, dev, None, c))
        if len(plan):
            c.run(plan, path=path_policy, threads=threads, decode=decode)
        return [post(r) for r, post in pending]
    finally:
        for f in files.values():
            f.close()
        for d in opened.values():
            if d is not None:
                d.close()


class Variable:
    """A lazy reader of one variable of an opened file: .shape, .dtype, .attrs, [selection]."""

    def __init__(self, owner: "Opened", info: dict):
        self._owner = owner
        self.info = info
        self.name: str = info["name"]
        self.shape: tuple = tuple(info["shape"])
        self.typestr: str = info["typestr"]
        self.chunks: tuple = tuple(info["chunks"])
        #: None, or why ferry cannot read this variable (reading raises FerryError with it)
        self.error: str | None = info.get("error")

    # dtype, dims and attrs are decoded on first use: opening a 1,000-tensor
    # checkpoint must not pay 1,000 JSON decodes nobody asked for.
    @functools.cached_property
    def dtype(self):
        if self.error and self.typestr[:1] not in "<>|=":   # a type ferry lacks, in the metadata's own terms
            return self.typestr
        return _numpy_dtype(_native_typestr(self.typestr)) or self.typestr

    @functools.cached_property
    def dims(self) -> tuple:
        d = json.loads(self.info.get("dims") or "null")
        return tuple(d) if isinstance(d, list) else ()

    @functools.cached_property
    def attrs(self) -> dict:
        return decode_attrs(self.info.get("attrs") or "{}", self._owner.format)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def read(self, selection: Any = None, *, device: Any = None, out: Any = None, out_bytes: bool = False):
        """The selection (see ferry.read for out= and out_bytes=)."""
        dev = self._owner.device if device is None else device
        o = self._owner
        plan = Plan()
        ret, post = _add_read(plan, o._ds, None, self.info, selection,
                              parse_device(dev) if out is None else None, out, o._ctx, out_bytes)
        if len(plan):
            o._ctx.run(plan)
        return post(ret)

    def __getitem__(self, key):
        return self.read(key)

    def __array__(self, dtype=None, copy=None):
        import numpy as np
        a = self.read(device="cpu")
        return np.asarray(a, dtype=dtype)

    def __repr__(self) -> str:
        return f"<ferry.Variable {self.name!r} {self.dims} {self.shape} {self.typestr}>"


class Opened:
    """ferry.open(path): the variables a file holds; [name] gives a lazy Variable."""

    def __init__(self, path, *, device: Any = "cpu", ctx: Context | None = None, format: str | None = None,
                 group: str | None = None, storage_options: dict | None = None):
        self._ctx = _ctx_of(ctx, storage_options)
        self.path = _fspath(path)
        self.device = device
        self._ds = _parquet_refs.dataset(self._ctx, self.path, format, group)
        self.format: str = self._ds.format
        self.attrs: dict = decode_attrs(self._ds.attrs, self.format)
        self.dims: dict = json.loads(self._ds.dims)
        self.groups: list = json.loads(self._ds.groups)
        # Names now, Variable objects on first use: opening is metadata only
        # and a 1,000-tensor file must open in milliseconds.
        self._names: dict = dict.fromkeys(self._ds.names())
        self._vars: dict = {}

    @property
    def variables(self) -> dict:
        """{name: Variable} for every variable (built on first use)."""
        for n in self._names:
            if n not in self._vars:
                self[n]
        return {n: self._vars[n] for n in self._names}

    def __getitem__(self, name: str) -> Variable:
        v = self._vars.get(name)
        if v is None:
            if name not in self._names:
                raise KeyError(f"{self.path}: no variable named {name!r}")
            v = self._vars[name] = Variable(self, self._ds.variable(name))
        return v

    def __contains__(self, name) -> bool:
        return name in self._names

    def __iter__(self):
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def keys(self):
        return self._names.keys()

    def read(self, name: str | None = None, selection: Any = None, *, device: Any = None, out: Any = None,
             out_bytes: bool = False):
        if name is None:
            if len(self._names) != 1:
                raise ValueError(f"{self.path} holds {len(self._names)} variables; name one")
            name = next(iter(self._names))
        return self[name].read(selection, device=device, out=out, out_bytes=out_bytes)

    def close(self) -> None:
        self._ds.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        return f"<ferry.Opened {self.path!r} format={self.format} variables={list(self._names)[:10]}>"


def open(path, *, device: Any = "cpu", ctx: Context | None = None, format: str | None = None,
         group: str | None = None, storage_options: dict | None = None) -> Opened:  # noqa: A001
    """Open a file or store (npy, safetensors, netCDF classic, Zarr, netCDF-4/HDF5;
    format="hdf5" reads the latter through h5py, as the xarray backend does) and
    list its variables. storage_options: as ferry.read's, for URLs."""
    from ._h5open import _H5Opened, _is_hdf5
    if storage_options:
        ctx = _ctx_of(ctx, storage_options)
    if format == "hdf5":
        return _H5Opened(path, device=device, ctx=ctx, group=group)
    try:
        return Opened(path, device=device, ctx=ctx, format=format, group=group)
    except FerryError as e:
        if format is not None or not _is_hdf5(path, e):
            raise
    return _H5Opened(path, device=device, ctx=ctx, group=group)
