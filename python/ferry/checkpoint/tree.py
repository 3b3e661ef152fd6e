"""Nested state dicts <-> (flat tensor names, a JSON skeleton) for ferry.checkpoint.

A state dict is any tree of dicts, lists and tuples whose leaves are tensors or small
plain values. Tensors become named entries of the safetensors file; everything else
(and the shape of the tree) goes into one JSON string in the header's ``__metadata__``
so that it comes back with its types: tuple vs list, int dict keys, None, bools,
floats (NaN and infinities too), bytes, torch.dtype/device/Size.

Skeleton encoding (JSON):
  str / int / bool / null / finite float   as themselves
  {"T": name}        a tensor stored under `name` (two leaves naming one tensor: a tie)
  {"d": [[k, v]..]}  dict        {"od": [[k, v]..]}  OrderedDict
  {"l": [..]}        list        {"t": [..]}         tuple
  {"f": "nan"|"inf"|"-inf"}      non-finite float
  {"b": base64}      bytes       {"dt": "float32"}   torch.dtype
  {"dev": "cuda:0"}  torch.device                {"S": [..]} torch.Size
  {"np": [dtype, value]}         numpy scalar
Every JSON object is one of these tags, so plain values never need escaping.
"""
from __future__ import annotations

import base64
import collections
import json
import math

TREE_KEY = "ferry.tree"        # __metadata__ key of the skeleton (absent for flat dicts)
ALIAS_KEY = "ferry.aliases"    # __metadata__ key of {alias: stored name} for flat dicts


def _torch():
    import torch
    return torch


def _view_key(t):
    """Identity of a tensor view: equal keys mean "the same bytes, the same meaning"."""
    try:
        sptr = t.untyped_storage().data_ptr()
    except Exception:  # pragma: no cover - exotic tensor subclasses
        sptr = t.data_ptr()
    if t.numel() == 0 or sptr == 0:
        return None      # empty tensors are never treated as ties
    return (str(t.device), sptr, t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)


class Flattened:
    """Result of flatten(): tensors by name (each stored once), the skeleton, aliases."""

    def __init__(self):
        self.tensors = {}     # name -> tensor (insertion order = tree order)
        self.aliases = {}     # alias name -> stored name (flat dicts only)
        self.tree = None      # JSON-able skeleton, or None for a flat {str: tensor} dict
        self.paths = {}       # name -> key path (tuple) of its first occurrence

    def metadata(self):
        """The __metadata__ entries that describe the structure (strings)."""
        md = {}
        if self.tree is not None:
            md[TREE_KEY] = json.dumps(self.tree, separators=(",", ":"), allow_nan=False)
        elif self.aliases:
            md[ALIAS_KEY] = json.dumps(self.aliases, separators=(",", ":"))
        return md


def _is_tensor(x):
    torch = _torch()
    return isinstance(x, torch.Tensor)


def flatten(obj):
    """Split a state dict into tensors and a skeleton. Ties (several leaves holding the
    very same view of one storage) are stored once."""
    torch = _torch()
    out = Flattened()
    seen = {}          # view key -> stored name
    used = set()

    def name_for(path):
        base = ".".join(str(p) for p in path) if path else "tensor"
        name, k = base, 1
        while name in used:
            name = "%s#%d" % (base, k)
            k += 1
        used.add(name)
        return name

    def add_tensor(t, path):
        if t.layout != torch.strided:
            raise TypeError("ferry.checkpoint: %s is a %s tensor; only dense (strided) tensors "
                            "can be saved" % (".".join(map(str, path)) or "<root>", t.layout))
        t = t.detach()
        key = _view_key(t)
        if key is not None and key in seen:
            return seen[key], True
        name = name_for(path)
        out.tensors[name] = t
        out.paths[name] = tuple(path)
        if key is not None:
            seen[key] = name
        return name, False

    # Fast path: the common model state dict {str: tensor}.
    if isinstance(obj, dict) and all(isinstance(k, str) for k in obj) and \
            all(_is_tensor(v) for v in obj.values()):
        for k, v in obj.items():
            if v.layout != torch.strided:
                raise TypeError("ferry.checkpoint: %r is a %s tensor; only dense (strided) "
                                "tensors can be saved" % (k, v.layout))
            t = v.detach()
            key = _view_key(t)
            if key is not None and key in seen:
                out.aliases[k] = seen[key]
                continue
            used.add(k)
            out.tensors[k] = t
            out.paths[k] = (k,)
            if key is not None:
                seen[key] = k
        return out

    depth_limit = MAX_DEPTH

    def enc(x, path, depth):
        if depth > depth_limit:
            raise ValueError("ferry.checkpoint: state dict nested deeper than %d" % depth_limit)
        if isinstance(x, torch.Tensor):
            name, _ = add_tensor(x, path)
            return {"T": name}
        if x is None or isinstance(x, (bool, str)):
            return x
        if isinstance(x, int) and type(x) in (int, bool):
            return x
        if type(x) is float:
            if math.isnan(x):
                return {"f": "nan"}
            if math.isinf(x):
                return {"f": "inf" if x > 0 else "-inf"}
            return x
        if isinstance(x, torch.Size):
            return {"S": [int(v) for v in x]}
        if isinstance(x, dict):
            tag = "od" if isinstance(x, collections.OrderedDict) else "d"
            items = []
            for k, v in x.items():
                items.append([enc_key(k, path), enc(v, path + (k,), depth + 1)])
            return {tag: items}
        if isinstance(x, list):
            return {"l": [enc(v, path + (i,), depth + 1) for i, v in enumerate(x)]}
        if isinstance(x, tuple):
            return {"t": [enc(v, path + (i,), depth + 1) for i, v in enumerate(x)]}
        if isinstance(x, (bytes, bytearray)):
            return {"b": base64.b64encode(bytes(x)).decode("ascii")}
        if isinstance(x, torch.dtype):
            return {"dt": str(x).replace("torch.", "")}
        if isinstance(x, torch.device):
            return {"dev": str(x)}
        if isinstance(x, int):          # int subclasses (IntEnum, ...) -> plain int
            return int(x)
        if isinstance(x, float):        # float subclasses -> plain float
            return enc(float(x), path, depth)
        np_scalar = _numpy_scalar(x)
        if np_scalar is not None:
            return np_scalar
        arr = _numpy_array_tensor(x, path)
        if arr is not None:
            t, dtype_str = arr
            name, _ = add_tensor(t, path)
            return {"nd": [name, dtype_str]}
        raise TypeError("ferry.checkpoint: cannot store %s at %s (a %s); tensors, dicts, "
                        "lists, tuples, str, int, float, bool, None, bytes, torch.dtype/"
                        "device/Size, numpy scalars and numpy arrays of numeric dtypes "
                        "are supported"
                        % (repr(x)[:60], ".".join(map(str, path)) or "<root>", type(x).__name__))

    def enc_key(k, path):
        if isinstance(k, torch.Tensor):
            raise TypeError("ferry.checkpoint: tensors cannot be dict keys (at %s)"
                            % (".".join(map(str, path)) or "<root>"))
        return enc(k, path, 0)

    out.tree = enc(obj, (), 0)
    return out


def _numpy_array_tensor(x, path):
    """(tensor, dtype string) for a numpy array of a dtype torch holds, or None if x is no
    numpy array; TypeError for arrays of other dtypes (object, str, datetime, ...)."""
    try:
        import numpy as np
    except ImportError:  # pragma: no cover
        return None
    if not isinstance(x, np.ndarray):
        return None
    torch = _torch()
    native = x.dtype.newbyteorder("=")
    if x.dtype.kind not in "biufc" or type(x) is not np.ndarray:
        raise TypeError("ferry.checkpoint: cannot store the numpy array at %s: dtype %s (%s); "
                        "numpy arrays of bool, integer, float and complex64 dtypes are stored"
                        % (".".join(map(str, path)) or "<root>", x.dtype, type(x).__name__))
    a = np.ascontiguousarray(x, dtype=native)
    if not a.flags.writeable:
        a = a.copy()                     # torch.from_numpy wants writeable memory
    try:
        t = torch.from_numpy(a)
    except TypeError:
        raise TypeError("ferry.checkpoint: cannot store the numpy array at %s: dtype %s has "
                        "no torch equivalent" % (".".join(map(str, path)) or "<root>", x.dtype))
    from . import st as _ckpt_st
    try:
        _ckpt_st.st_dtype(t.dtype)
    except TypeError as e:               # complex128: no safetensors dtype
        raise TypeError("ferry.checkpoint: cannot store the numpy array at %s: %s"
                        % (".".join(map(str, path)) or "<root>", e))
    return t, x.dtype.str


def numpy_names(tree):
    """Names of the tensors that hold numpy arrays (not load_into targets)."""
    out = set()

    def walk(x, depth):
        if depth > MAX_DEPTH:
            return
        if isinstance(x, dict):
            for k, v in x.items():
                if k == "nd" and isinstance(v, list) and v and isinstance(v[0], str):
                    out.add(v[0])
                else:
                    walk(v, depth + 1)
        elif isinstance(x, list):
            for v in x:
                walk(v, depth + 1)

    walk(tree, 0)
    return out


def _numpy_scalar(x):
    try:
        import numpy as np
    except ImportError:  # pragma: no cover
        return None
    if isinstance(x, np.generic) and x.dtype.kind in "biufc?":
        v = x.item()
        if isinstance(v, complex):
            return {"np": [x.dtype.str, [v.real, v.imag]]}
        if isinstance(v, float) and not math.isfinite(v):
            v = repr(v)
        return {"np": [x.dtype.str, v]}
    return None


MAX_DEPTH = 200            # nesting flatten() writes and decode() accepts


def _fail(target, path, msg):
    from . import io as _io
    where = ".".join(str(p) for p in path) or "<root>"
    _io.fail("%s: corrupted %s metadata at %s: %s" % (target, TREE_KEY, where, msg))


def parse(text, target):
    """The skeleton stored under TREE_KEY, as JSON; FerryError naming the file if it is not
    JSON or nests deeper than json and MAX_DEPTH allow."""
    if not isinstance(text, str):
        _fail(target, (), "not a string")
    depth = cur = 0
    for ch in text:                  # bound the nesting before json's recursion does
        if ch in "[{":
            cur += 1
            depth = max(depth, cur)
        elif ch in "]}":
            cur -= 1
    if depth > 3 * MAX_DEPTH + 4:    # a level of nesting is at most 3 JSON levels
        _fail(target, (), "nested %d levels deep (at most %d)" % (depth, MAX_DEPTH))
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:
        _fail(target, (), "not JSON: %s" % (str(e)[:80],))


def decode(tree, tensors, target):
    """Rebuild the object from a skeleton; tensors: {name: loaded tensor}. Every node is
    checked: a damaged skeleton raises FerryError naming the file and the key path."""
    torch = _torch()

    def want(cond, path, msg):
        if not cond:
            _fail(target, path, msg)

    def seq(v, path):
        want(isinstance(v, list), path, "a sequence node without a list")
        return v

    def dec(x, path, depth):
        want(depth <= MAX_DEPTH, path, "nested deeper than %d" % MAX_DEPTH)
        if x is None or isinstance(x, (bool, str)):
            return x
        if type(x) is int or type(x) is float:
            return x
        want(isinstance(x, dict) and len(x) == 1, path,
             "malformed node %s" % (json.dumps(x)[:60] if not isinstance(x, dict) else
                                    "with %d keys" % len(x)))
        (tag, v), = x.items()
        if tag == "T":
            want(isinstance(v, str) and v in tensors, path,
                 "names tensor %r, which the file lacks" % (v,))
            return tensors[v]
        if tag == "nd":
            want(isinstance(v, list) and len(v) == 2 and isinstance(v[0], str) and
                 v[0] in tensors and isinstance(v[1], str), path, "malformed numpy array node")
            return _numpy_array(tensors[v[0]], v[1], lambda m: _fail(target, path, m))
        if tag in ("d", "od"):
            d = collections.OrderedDict() if tag == "od" else {}
            for item in seq(v, path):
                want(isinstance(item, list) and len(item) == 2, path, "malformed dict item")
                k = dec(item[0], path, depth + 1)
                want(not isinstance(k, (torch.Tensor, list, dict, bytearray)), path,
                     "a dict key of type %s" % type(k).__name__)
                try:
                    hash(k)
                except TypeError:
                    _fail(target, path, "an unhashable dict key")
                d[k] = dec(item[1], path + (k,), depth + 1)
            return d
        if tag in ("l", "t"):
            out = [dec(e, path + (i,), depth + 1) for i, e in enumerate(seq(v, path))]
            return out if tag == "l" else tuple(out)
        if tag == "S":
            want(all(type(e) is int and e >= 0 for e in seq(v, path)), path,
                 "a torch.Size of non-integers")
            return torch.Size(v)
        if tag == "f":
            want(v in ("nan", "inf", "-inf"), path, "float %r" % (v,))
            return float(v)
        if tag == "b":
            want(isinstance(v, str), path, "bytes not in base64")
            try:
                return base64.b64decode(v.encode("ascii"), validate=True)
            except (ValueError, UnicodeEncodeError):
                _fail(target, path, "bytes not in base64")
        if tag == "dt":
            dt = getattr(torch, v, None) if isinstance(v, str) else None
            want(isinstance(dt, torch.dtype), path, "unknown torch dtype %r" % (v,))
            return dt
        if tag == "dev":
            want(isinstance(v, str) and len(v) < 64, path, "malformed torch.device")
            try:
                return torch.device(v)
            except (RuntimeError, ValueError, TypeError):
                _fail(target, path, "malformed torch.device %r" % (v,))
        if tag == "np":
            return _numpy_scalar_decode(v, lambda m: _fail(target, path, m))
        _fail(target, path, "unknown tag %r" % (tag,))

    return dec(tree, (), 0)


def _numpy_scalar_decode(v, fail):
    import numpy as np
    if not (isinstance(v, list) and len(v) == 2 and isinstance(v[0], str) and len(v[0]) < 16):
        fail("malformed numpy scalar")
    try:
        dt = np.dtype(v[0])
    except (TypeError, ValueError):
        fail("unknown numpy dtype %r" % (v[0],))
    val = v[1]
    if dt.kind not in "biufc":
        fail("numpy scalar of dtype %s" % dt)
    if dt.kind == "c":
        if not (isinstance(val, list) and len(val) == 2 and
                all(type(x) in (int, float) for x in val)):
            fail("malformed complex numpy scalar")
        val = complex(val[0], val[1])
    elif isinstance(val, str) and dt.kind == "f":
        if val not in ("nan", "inf", "-inf"):
            fail("numpy float %r" % (val,))
        val = float(val)
    elif type(val) not in (int, float, bool):
        fail("numpy scalar value of type %s" % type(val).__name__)
    try:
        with np.errstate(all="raise"):
            out = dt.type(val)
        if dt.kind in "iub" and out != val:
            raise OverflowError
        return out
    except (OverflowError, ValueError, TypeError, FloatingPointError):
        fail("%r does not fit numpy %s" % (val, dt))


def _numpy_array(t, dtype_str, fail):
    """A numpy array stored as tensor t (native byte order), back in its own dtype."""
    import numpy as np
    try:
        dt = np.dtype(dtype_str)
    except (TypeError, ValueError):
        fail("unknown numpy dtype %r" % (dtype_str,))
    a = t.detach().cpu().numpy()
    if a.dtype.newbyteorder("=") != dt.newbyteorder("="):
        fail("numpy dtype %s stored as a %s tensor" % (dt, t.dtype))
    return a.astype(dt, copy=False)


def tensor_paths(tree):
    """{key path tuple: tensor name} for every tensor leaf of a skeleton."""
    out = {}

    def walk(x, path, depth):
        if depth > MAX_DEPTH or not isinstance(x, dict) or len(x) != 1:
            return
        (tag, v), = x.items()
        if tag == "T":
            out[path] = v
        elif tag in ("d", "od") and isinstance(v, list):
            for item in v:
                if isinstance(item, list) and len(item) == 2:
                    k = item[0]
                    if isinstance(k, dict) or isinstance(k, list):
                        continue         # tensors sit under plain keys (str/int)
                    walk(item[1], path + (k,), depth + 1)
        elif tag in ("l", "t") and isinstance(v, list):
            for i, e in enumerate(v):
                walk(e, path + (i,), depth + 1)

    walk(tree, (), 0)
    return out


def leaf_tensors(obj, path=()):
    """Yield (key path, tensor) for every tensor in a nested container."""
    torch = _torch()
    if isinstance(obj, torch.Tensor):
        yield path, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from leaf_tensors(v, path + (k,))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from leaf_tensors(v, path + (i,))
