"""Every numeric keyword of every public function, just outside its range, is refused by the one
validator (ferry/_checks.py) with the keyword's name and range (issue 38 item 8): a ValueError
(a wrong type: KeywordTypeError, a ValueError and a TypeError at once), never a silent default,
a clamp, or numpy's, torch's or the C library's words without the keyword.

The sweep reads the functions' signatures: a numeric keyword a new public function grows is
swept as soon as the function has a call below, and test_every_numeric_keyword_is_swept fails
until it has one."""
import importlib
import inspect
import os

import numpy as np
import pytest

import ferry
from ferry._checks import PROBS, RANGES, SIZES, KeywordTypeError

MODULES = ("ferry", "ferry.torch", "ferry.xarray", "ferry.checkpoint", "ferry.images", "ferry.dali")
# keywords that take any number (a pad value), not a count, size or seed
NOT_COUNTS = {"value"}
# the C types' keywords (no signature to read): checked through the same validator
C_KEYWORDS = {"ferry.Context.__init__": ["threads", "staging_count", "task_size", "staging_size", "small_io"],
              "ferry.Context.run": ["threads"], "ferry.Context.submit": ["threads"]}


def _public_functions():
    """(qualified name, function) of every public function and public class's __init__ and
    methods, of the modules that import here."""
    out = {}
    for m in MODULES:
        try:
            mod = importlib.import_module(m)
        except ImportError:
            continue
        names = getattr(mod, "__all__", None)
        if names is None:                     # a module without __all__: what it defines
            names = [n for n, o in vars(mod).items() if not n.startswith("_")
                     and getattr(o, "__module__", None) == mod.__name__]
        for n in names:
            obj = getattr(mod, n, None)
            if inspect.isclass(obj):
                if not obj.__module__.startswith("ferry"):
                    continue
                for a, f in [("__init__", obj.__init__)] + [(k, v) for k, v in vars(obj).items()
                                                           if not k.startswith("_") and callable(v)]:
                    out[f"{m}.{n}.{a}"] = f
            elif inspect.isfunction(obj):
                out[f"{m}.{n}"] = obj
    out.update({q: q for q in C_KEYWORDS})
    return out


def _numeric_keywords(f):
    if isinstance(f, str):
        return C_KEYWORDS[f]
    try:
        ps = inspect.signature(f).parameters.values()
    except (TypeError, ValueError):           # a C type: its arguments are parsed in C
        return []
    return [p.name for p in ps if p.name in RANGES or p.name in SIZES or p.name in PROBS or
            (type(p.default) in (int, float) and p.name not in NOT_COUNTS)]


@pytest.fixture(scope="module")
def fx(tmp_path_factory):
    d = tmp_path_factory.mktemp("kw")
    f = type("Files", (), {})()
    f.npy = str(d / "a.npy")
    np.save(f.npy, np.arange(64, dtype="f4").reshape(16, 4))
    f.tok = str(d / "t.bin")
    np.arange(4096, dtype="<u2").tofile(f.tok)
    f.dir = str(d)
    f.nc = None
    try:
        import xarray as xr
        f.nc = str(d / "a.nc")
        xr.Dataset({"t": (("time", "y", "x"), np.zeros((8, 4, 4), "f4"))},
                   coords={"time": np.arange(8)}).to_netcdf(f.nc, engine="scipy")
    except ImportError:
        pass
    f.tar = str(d / "img.tar")          # one WebDataset sample: a 16 x 12 JPEG made by ferry's own test writer
    import io
    import tarfile

    from PIL import Image
    b = io.BytesIO()
    Image.fromarray(np.full((12, 16, 3), 90, np.uint8)).save(b, format="JPEG")
    with tarfile.open(f.tar, "w") as t:
        ti = tarfile.TarInfo("s0.jpg")
        ti.size = len(b.getvalue())
        t.addfile(ti, io.BytesIO(b.getvalue()))
    f.st = str(d / "m.safetensors")
    try:
        import torch
        import ferry.checkpoint as ck
        ck.save({"a": torch.zeros(3)}, f.st)
    except ImportError:
        pass
    return f


def _calls(fx):
    """Qualified name -> call(**keywords): a valid call, given the keyword under test."""
    c = {
        "ferry.Context.__init__": lambda **kw: ferry.Context(**kw).close(),
        "ferry.Context.run": lambda **kw: ferry.default_context().run(ferry.Plan(), **kw),
        "ferry.Context.submit": lambda **kw: ferry.default_context().submit(ferry.Plan(), **kw).wait(),
        "ferry.read": lambda **kw: ferry.read(fx.npy, **kw),
        "ferry.read_many": lambda **kw: ferry.read_many([(fx.npy, None, None)], **kw),
    }
    try:
        import ferry.torch as ft
        c.update({
            "ferry.torch.ArrayDataset.__init__": lambda **kw: ft.ArrayDataset(**{
                "source": fx.npy, "device": "cpu", **kw}),
            "ferry.torch.TokenDataset.__init__": lambda **kw: ft.TokenDataset(**{
                "files": fx.tok, "seq_len": 16, "batch_size": 4, "device": "cpu", "shuffle": False, **kw}),
            "ferry.torch.epoch_order": lambda **kw: ft.epoch_order(**{"n": 10, **kw}),
        })
        if fx.nc:
            c["ferry.torch.XarrayDataset.__init__"] = lambda **kw: ft.XarrayDataset(**{
                "data": fx.nc, "batch_size": 2, "device": "cpu", **kw})
    except ImportError:
        pass
    try:
        import xarray as xr

        import ferry.xarray as fxr

        def opened(open_fn):
            def call(**kw):
                r = open_fn(fx.nc, engine="ferry", **kw)
                r.close() if hasattr(r, "close") else None
            return call
        c.update({
            "ferry.xarray.FerryBackendEntrypoint.open_dataset": opened(xr.open_dataset),
            "ferry.xarray.FerryBackendEntrypoint.open_datatree": opened(xr.open_datatree),
            "ferry.xarray.FerryBackendEntrypoint.open_groups_as_dict": opened(xr.open_groups),
            "ferry.xarray.FerryStore.__init__": lambda **kw: fxr.FerryStore(fx.nc, **kw).close(),
        })
    except ImportError:
        pass
    try:
        import torch

        import ferry.checkpoint as ck
        sd = {"a": torch.zeros(3)}

        def safe_open(**kw):
            with ck.safe_open(fx.st, **kw):
                pass
        c.update({
            "ferry.checkpoint.save": lambda **kw: ck.save(sd, os.path.join(fx.dir, "s.safetensors"), **kw),
            "ferry.checkpoint.async_save": lambda **kw: ck.async_save(
                sd, os.path.join(fx.dir, "as.safetensors"), **kw).result(),
            "ferry.checkpoint.save_bytes": lambda **kw: ck.save_bytes(sd, **kw),
            "ferry.checkpoint.load": lambda **kw: ck.load(fx.st, **kw),
            "ferry.checkpoint.load_bytes": lambda **kw: ck.load_bytes(ck.save_bytes(sd), **kw),
            "ferry.checkpoint.load_into": lambda **kw: ck.load_into({"a": torch.zeros(3)}, fx.st, **kw),
            "ferry.checkpoint.safe_open.__init__": safe_open,
            "ferry.checkpoint.FerryWriter.__init__": lambda **kw: ck.FerryWriter(fx.dir, **kw),
            "ferry.checkpoint.FerryReader.__init__": lambda **kw: ck.FerryReader(fx.dir, **kw),
        })
    except ImportError:
        pass
    from ferry import images
    c["ferry.images.decode_batch"] = lambda **kw: images.decode_batch([], **kw)
    c["ferry.images.load_batch"] = lambda **kw: images.load_batch(
        images.open_shards(fx.tar), [0], np.empty((1, 3, 8, 8), np.uint8), **kw)
    try:
        import ferry.torch as ft
        c["ferry.torch.ImageDataset.__init__"] = lambda **kw: ft.ImageDataset(**{
            "source": fx.tar, "size": 8, "device": "cpu", **kw})
    except ImportError:
        pass
    try:
        import ferry.dali as dali
        c["ferry.dali.DALISource.__init__"] = lambda **kw: dali.DALISource(
            ferry.torch.ArrayDataset(fx.npy, device="cpu"), **kw)
        c["ferry.dali.pipeline"] = lambda **kw: dali.pipeline(ferry.torch.ArrayDataset(fx.npy, device="cpu"), **kw)
    except ImportError:
        pass
    return c


def _bad_values(name):
    if name in PROBS:
        return [-0.25, 1.5, float("nan"), "x", True]
    if name in SIZES:
        lo = SIZES[name][0]
        return [-1, "xyz", 1.5, True, [4096]] + ([lo - 1] if lo > 0 else [])
    lo, hi, _ = RANGES[name]
    return ([] if lo is None else [lo - 1]) + ([] if hi is None else [hi + 1]) + ["x", 1.5, True]


def test_every_numeric_keyword_is_swept(fx):
    calls = _calls(fx)
    missing = {q: kws for q, f in _public_functions().items() if (kws := _numeric_keywords(f)) and q not in calls}
    assert not missing, f"public functions with numeric keywords and no call in _calls: {missing}"
    unknown = {q: [k for k in _numeric_keywords(f) if k not in RANGES and k not in SIZES and k not in PROBS]
               for q, f in _public_functions().items()}
    unknown = {q: ks for q, ks in unknown.items() if ks}
    assert not unknown, f"numeric keywords without a range in ferry/_checks.py: {unknown}"


def test_out_of_range_values_name_the_keyword_and_its_range(fx):
    funcs = _public_functions()
    swept = 0
    for q, call in _calls(fx).items():
        call()                                       # the call is valid without the bad keyword
        for name in _numeric_keywords(funcs[q]):
            for v in _bad_values(name):
                with pytest.raises((ValueError, ferry.FerryError)) as ei:
                    call(**{name: v})
                msg = str(ei.value)
                assert name in msg, (q, name, v, msg)
                if name in RANGES:
                    assert "must be an int" in msg, (q, name, v, msg)
                if isinstance(v, (str, float, bool)) and name in RANGES:
                    assert isinstance(ei.value, TypeError) and isinstance(ei.value, KeywordTypeError), (q, name, v)
                swept += 1
    assert swept > 100


def test_in_range_edges_pass(fx):
    """The range is the truth both ways: its edges are accepted."""
    ft = pytest.importorskip("ferry.torch")
    assert ferry.read(fx.npy, threads=4096).shape == (16, 4)
    ds = ft.ArrayDataset(fx.npy, device="cpu", batch_size=1, prefetch=0, seed=-(1 << 63), rank=1, world_size=2)
    assert ds.rank == 1 and ds.batch_size == 1
    assert list(ft.epoch_order(np.int64(5), seed=np.uint32(3), shuffle=False)) == [0, 1, 2, 3, 4]


def test_a_size_keyword_passes_the_c_parser_s_reason_with_its_name(fx):
    ck = pytest.importorskip("ferry.checkpoint")
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match=r"max_shard_size: \"5QB\": not a size"):
        ck.save({"a": torch.zeros(3)}, os.path.join(fx.dir, "q.safetensors"), max_shard_size="5QB")
    with pytest.raises(ValueError, match="max_shard_size must be at least 1 byte"):
        ck.save({"a": torch.zeros(3)}, os.path.join(fx.dir, "q.safetensors"), max_shard_size=0)


def test_reserve_pinned_takes_a_size():
    """reserve_pinned's bytes (its first argument, a state dict or a size) pass the size parser."""
    pytest.importorskip("torch")
    import ferry.checkpoint as ck
    for bad, what in ((-5, "a size cannot be negative"), ("lots", "not a size"), (2.5, "must be a size")):
        with pytest.raises(ValueError, match=f"reserve_pinned: nbytes.*{what}|reserve_pinned: nbytes must be a size"):
            ck.reserve_pinned(bad)
    ck.reserve_pinned(0)
    ck.reserve_pinned("4K")
    ck.release_pinned()
