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

    depth_limit = 200

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
        raise TypeError("ferry.checkpoint: cannot store %s at %s (a %s); tensors, dicts, "
                        "lists, tuples, str, int, float, bool, None, bytes, torch.dtype/"
                        "device/Size and numpy scalars are supported"
                        % (repr(x)[:60], ".".join(map(str, path)) or "<root>", type(x).__name__))

    def enc_key(k, path):
        if isinstance(k, torch.Tensor):
            raise TypeError("ferry.checkpoint: tensors cannot be dict keys (at %s)"
                            % (".".join(map(str, path)) or "<root>"))
        return enc(k, path, 0)

    out.tree = enc(obj, (), 0)
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


class TreeError(ValueError):
    pass


def decode(tree, get_tensor):
    """Rebuild the object from a skeleton; get_tensor(name) gives the loaded tensor."""
    torch = _torch()

    def dec(x, depth):
        if depth > 1000:
            raise TreeError("skeleton nested too deep")
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        if isinstance(x, list):
            raise TreeError("bare JSON array in skeleton")
        if not isinstance(x, dict) or len(x) != 1:
            raise TreeError("malformed skeleton node %r" % (str(x)[:60],))
        (tag, v), = x.items()
        if tag == "T":
            return get_tensor(v)
        if tag in ("d", "od"):
            if not isinstance(v, list):
                raise TreeError("malformed dict node")
            d = collections.OrderedDict() if tag == "od" else {}
            for item in v:
                if not isinstance(item, list) or len(item) != 2:
                    raise TreeError("malformed dict item")
                k = dec(item[0], depth + 1)
                try:
                    hash(k)
                except TypeError:
                    raise TreeError("unhashable dict key in skeleton")
                d[k] = dec(item[1], depth + 1)
            return d
        if tag in ("l", "t", "S"):
            if not isinstance(v, list):
                raise TreeError("malformed sequence node")
            seq = [dec(e, depth + 1) for e in v]
            if tag == "l":
                return seq
            if tag == "S":
                return torch.Size(seq)
            return tuple(seq)
        if tag == "f":
            return float(v)
        if tag == "b":
            return base64.b64decode(v)
        if tag == "dt":
            dt = getattr(torch, str(v), None)
            if not isinstance(dt, torch.dtype):
                raise TreeError("unknown torch dtype %r" % (v,))
            return dt
        if tag == "dev":
            return torch.device(v)
        if tag == "np":
            import numpy as np
            dtype, val = v
            if isinstance(val, list):
                val = complex(val[0], val[1])
            elif isinstance(val, str):
                val = float(val)
            return np.dtype(dtype).type(val)
        raise TreeError("unknown skeleton tag %r" % (tag,))

    return dec(tree, 0)


def tensor_paths(tree):
    """{key path tuple: tensor name} for every tensor leaf of a skeleton."""
    out = {}

    def walk(x, path, depth):
        if depth > 1000 or not isinstance(x, dict) or len(x) != 1:
            return
        (tag, v), = x.items()
        if tag == "T":
            out[path] = v
        elif tag in ("d", "od") and isinstance(v, list):
            for item in v:
                if isinstance(item, list) and len(item) == 2:
                    try:
                        k = decode(item[0], lambda n: None)
                        hash(k)
                    except Exception:
                        continue
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
