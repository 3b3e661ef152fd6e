"""ferry.torch.ImageDataset: batches of decoded, cropped and normalised images from WebDataset
tar shards, Mosaic MDS directories, ImageFolder trees or lists of image files, with their labels,
keys and other members; the order, sharding, epochs and resume of ArrayDataset (_BatchStream)."""
from __future__ import annotations

import io
import json
import logging
import os
import re

import numpy as np
import torch

from .. import _ferry, images
from .._checks import check, check_prob
from .sources import _expand
from .stream import _BatchStream

_log = logging.getLogger("ferry.torch")

_DTYPES = {"uint8": torch.uint8, "float16": torch.float16, "bfloat16": torch.bfloat16,
           "float32": torch.float32}
_RESERVED = ("image", "label", "key")
_TEXT = ("txt", "text", "caption")
_JSON = ("json", "jsn")
_INTS = ("cls", "cls2", "index", "label", "idx")
_LABEL_COLUMNS = ("label", "cls", "class", "target")      # MDS int columns taken as the label
_SKIPPED = object()      # a sample of per-sample mode left out by on_error="skip"


def _torch_dtype(dtype, normalize):
    if dtype is None:
        return torch.float32 if normalize is not None else torch.uint8
    if isinstance(dtype, str):
        if dtype not in _DTYPES:
            raise ValueError(f"ImageDataset: dtype must be one of {list(_DTYPES)}, not {dtype!r}")
        return _DTYPES[dtype]
    if dtype not in _DTYPES.values():
        raise ValueError(f"ImageDataset: dtype must be torch.uint8, float16, bfloat16 or float32, not {dtype}")
    return dtype


def _pair(size):
    if size is None:
        return None
    if isinstance(size, int) and not isinstance(size, bool):
        return (size, size)
    h, w = (int(v) for v in size)
    return (h, w)


class _ImageField:
    """The image of a sample as _BatchStream's `fields` describe it (shape None: the images'
    own size, known per batch)."""
    name = "image"
    row_bytes = 0          # decoded in load_batch, not staged by the engine: depth is prefetch's

    def __init__(self, shape, dtype):
        self.shape, self.dtype = shape, dtype

    def __repr__(self):
        return f"<field 'image' {self.shape or 'own size'} {self.dtype}>"

    def read(self, ds, rt, plan, ids, g):
        return ds._read_image(rt, ids, g)


class _ImageBatchJob:
    """One read group's load_batch, with its samples' keys, labels and members, run on the
    runtime's reader threads (the call releases the GIL in its reads, decodes and transforms);
    answers as a Job does. On CUDA the batch's copies are ordered on the runtime's decode stream
    and an event recorded behind them, which stream_wait makes the consumer's stream wait on.
    The thread holds no reference to the dataset (its last one dropped there would close the
    runtime from one of the runtime's own threads)."""
    path = "images"

    def __init__(self, rt, shards, ids, buf, args, members):
        self.stream = args["stream"]
        self.future = rt.reader().submit(self._run, shards, ids, buf, args, members)

    def _run(self, shards, ids, buf, args, members):
        res = images.load_batch(shards, ids, buf, **args)
        skipped = set(res["skipped"])
        keep = [int(i) for j, i in enumerate(ids.tolist()) if j not in skipped]
        extras = members.read(shards, keep)
        event = None
        if self.stream is not None:
            event = torch.cuda.Event()
            event.record(self.stream)
        return res, keep, extras, event

    def done(self):
        return self.future.done()

    def wait(self, timeout=None):
        return self.future.result(timeout)

    def stream_wait(self, stream):
        event = self.wait()[3]
        if event is not None:
            s = torch.cuda.ExternalStream(stream) if isinstance(stream, int) else stream
            s.wait_event(event)


class _SampleMembers:
    """What a batch holds beside the image: keys, the label and the requested members, how each
    is read (by the member's MDS encoding or tar extension), and the reading."""

    def __init__(self, s, label, members):
        self.members = tuple(members)
        self._label = self._label_source(s, label, s.format)
        self._kinds = {m: self._member_kind(s, m) for m in self.members}

    @property
    def has_label(self):
        return self._label is not None

    def _label_source(self, s, label, fmt):
        """-> None (no label), "class" (the folder's index) or (member name, kind)."""
        if label is False:
            return None
        info = s.sample(0)
        names = {m["name"]: m["encoding"] for m in info["members"]}
        if label is None:
            if fmt == "folder":
                return "class"
            if fmt == "tar" and "cls" in names:
                return ("cls", "int")
            if fmt == "mds":
                for c in _LABEL_COLUMNS:
                    if c in names and (names[c] or "").startswith(("int", "uint")):
                        return (c, self._member_kind(s, c))
            return None
        kind = self._member_kind(s, label)
        if kind not in ("int",) and not kind.startswith("mds-int:"):
            raise ValueError(f"ImageDataset: label {label!r} is not an integer member (it reads as {kind})")
        return (label, kind)

    def _member_kind(self, s, name):
        info = s.sample(0)
        enc = {m["name"]: m["encoding"] for m in info["members"]}
        if name not in enc:
            raise KeyError(f"ImageDataset: member {name!r}: sample {info['key']!r} has no such member "
                           f"(it has {sorted(enc)})")
        e = enc[name]
        if e is not None:                               # an MDS column
            if e == "str":
                return "str"
            if e.startswith(("int", "uint")):
                return "mds-int:" + e
            if e == "json":
                return "json"
            if e.startswith("ndarray"):
                return "ndarray:" + e
            return "bytes"
        ext = name.rsplit(".", 1)[-1]
        return ("str" if ext in _TEXT else "json" if ext in _JSON else "npy" if ext == "npy"
                else "int" if ext in _INTS else "bytes")

    def _value(self, s, i, name, kind):
        raw = s.read(i, name)
        if kind == "str":
            return raw.decode("utf-8")
        if kind == "json":
            return json.loads(raw)
        if kind == "int":
            return int(raw.decode("ascii").strip())
        if kind == "npy":
            return torch.from_numpy(np.load(io.BytesIO(raw), allow_pickle=False))
        if kind.startswith("mds-int:"):
            t = kind.split(":", 1)[1]
            return int(np.frombuffer(raw, "<i8" if t == "int" else "<" + _mds_int(t))[0])
        if kind.startswith("ndarray:"):
            return torch.from_numpy(_mds_ndarray(raw, kind.split(":", 1)[1]))
        return raw

    def read(self, s, keep):
        """Keys, labels and requested members of the samples `keep` (on a reader thread)."""
        out = {"key": [s.sample(i)["key"] for i in keep]}
        if self._label == "class":
            out["label"] = [s.sample(i)["label"] for i in keep]
        elif self._label is not None:
            name, kind = self._label
            out["label"] = [self._value(s, i, name, kind) for i in keep]
        for m in self.members:
            out[m] = [self._value(s, i, m, self._kinds[m]) for i in keep]
        return out


class ImageDataset(_BatchStream):
    """Batches of images (decoded, cropped, resized, flipped, normalised) with their labels, keys
    and other members, from image shards; ArrayDataset's contract for order, ranks, workers,
    epochs and resume (see ferry.torch's docstring).

    ImageDataset(source, *, format=None, member=None, label=None, members=(), batch_size=256,
                 shuffle=False, seed=0, drop_last=False, device=None, rank=None, world_size=None,
                 prefetch=4, block_size=None, size=None, crop="random_resized",
                 scale=(0.08, 1.0), ratio=(3/4, 4/3), flip=0.0, normalize=None, layout="CHW",
                 dtype=None, transform=None, on_error="raise", decode="auto", pin_memory=False,
                 threads=0, ctx=None, sample_group=64)

    source, format
        WebDataset tar shards (a glob, a path, a list; "train-{000000..000009}.tar" braces as
        webdataset's), a Mosaic MDS directory, an ImageFolder root (class sub-folders: labels are
        class indices, ds.classes their names) or a list of image files; format "tar", "mds",
        "folder" or "files" (None: detected). Each may be a URL (s3://, gs://, https://;
        docs/remote.md): s3:// and gs:// globs and folders are listed, with the remote options of
        ctx (ferry._remote.remote_context(storage_options)) or the environment's; a shard at a
        URL is indexed by range reads and its members read from the version indexed (an object
        replaced since is an error naming it).
    member
        The member holding the image: a tar extension ("jpg"), an MDS column, or a tuple (the
        first one a sample has); None: each sample's jpg/jpeg/png member or jpeg/png column.
    label
        None: the class index of a folder, a tar sample's .cls, an MDS int column named label,
        cls, class or target — whichever the set has (none: no "label" in the batches); a member
        name; False: no label. Labels are int64 tensors.
    members
        Other members returned beside the image, by name: .txt/.text/.caption and MDS str
        columns as str, .json as the parsed value, .npy and MDS ndarray columns as tensors
        (stacked when of one shape, else a list), .cls/.index and MDS int columns as int64
        tensors, anything else as bytes.
    size, crop, scale, ratio, flip
        The output's (height, width) (an int: square) and how each image gets there:
        crop="random_resized" (torchvision's RandomResizedCrop(size, scale, ratio), the box drawn
        from (seed, epoch, sample)), "center" (CenterCrop(size); smaller images are resized up,
        not padded), "resize" (the whole image to size) or None (no resize: every image of a
        batch must have one size; with size=None the batch takes its first image's). flip: the
        probability of a left-right flip, drawn from (seed, epoch, sample). Resizes are
        antialiased, as torchvision's resize(antialias=True). A resumed epoch draws the same
        crops and flips.
    normalize, dtype, layout
        normalize=(mean, std) on v / 255 (1 or 3 values); dtype torch.uint8 (the default without
        normalize), float16, bfloat16 or float32 (the default with normalize; without it floats
        are v / 255); layout "CHW" ((B, 3, H, W), the default) or "HWC".
    on_error
        "raise" (a FerryError naming the shard, the sample's key and the member) or "skip": an
        image that cannot be decoded is left out of its batch (which is then smaller), counted
        in ds.stats()["images"]["skipped"] and logged once.
    decode
        "auto" (for a CUDA device: nvJPEG's batched decode and CPU threads from one queue,
        where nvJPEG loads; else the CPU), "gpu" (every JPEG nvJPEG takes; the rest on the
        CPU) or "cpu" (libjpeg-turbo and libspng on threads). docs/images.md says which goes where.
    batch_size, shuffle, seed, drop_last, block_size, device, rank, world_size, prefetch,
    transform, pin_memory, ctx, sample_group
        As ArrayDataset's. shuffle=True is a global shuffle over every sample of every shard.
        threads: decode threads (0: the engine context's).

    Batches are dicts {"image": tensor (B, 3, H, W), "label": int64 tensor (B,), "key": list of
    str, plus the requested members}, tensors on `device`.
    """

    _STATE_TAG = "ferry.torch.ImageDataset"

    def __init__(self, source, *, format=None, member=None, label=None, members=(), batch_size=256,
                 shuffle=False, seed=0, drop_last=False, device=None, rank=None, world_size=None,
                 prefetch=4, block_size=None, size=None, crop="random_resized", scale=(0.08, 1.0),
                 ratio=(3 / 4, 4 / 3), flip=0.0, normalize=None, layout="CHW", dtype=None,
                 transform=None, on_error="raise", decode="auto", pin_memory=False, threads=0,
                 ctx=None, sample_group=64):
        super().__init__()
        self.block_size = check("ImageDataset", "block_size", block_size, none=True)
        self._init_stream(batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last,
                          device=device, rank=rank, world_size=world_size, prefetch=prefetch,
                          transform=transform, pin_memory=pin_memory, threads=threads, ctx=ctx,
                          sample_group=sample_group)
        self._single = False
        if crop not in ("random_resized", "center", "resize", None):
            raise ValueError(f"ImageDataset: crop must be 'random_resized', 'center', 'resize' or None, "
                             f"not {crop!r}")
        self.size = _pair(size)
        if self.size is None and crop is not None:
            raise ValueError(f"ImageDataset: crop={crop!r} needs size= (the output's height and width); "
                             f"crop=None batches images of one size as they are")
        if layout not in ("CHW", "HWC"):
            raise ValueError(f"ImageDataset: layout must be 'CHW' or 'HWC', not {layout!r}")
        if on_error not in ("raise", "skip"):
            raise ValueError(f"ImageDataset: on_error must be 'raise' or 'skip', not {on_error!r}")
        if decode not in ("auto", "cpu", "gpu"):
            raise ValueError(f"ImageDataset: decode must be 'auto', 'cpu' or 'gpu', not {decode!r}")
        self.crop, self.scale, self.ratio = crop, tuple(scale), tuple(ratio)
        self.flip = check_prob("ImageDataset", "flip", flip)
        self.layout, self.on_error, self.decode = layout, on_error, decode
        self.dtype = _torch_dtype(dtype, normalize)
        self.mean = self.std = None
        if normalize is not None:
            if self.dtype == torch.uint8:
                raise ValueError("ImageDataset: normalize gives floats; dtype=torch.uint8 cannot hold them")
            mean, std = normalize
            self.mean = [float(v) for v in np.asarray(mean, dtype=np.float64).reshape(-1)]
            self.std = [float(v) for v in np.asarray(std, dtype=np.float64).reshape(-1)]
            if any(v == 0 for v in self.std):
                raise ValueError("ImageDataset: normalize std has a zero")
        self.member = member
        self.members = tuple(members)
        bad = [m for m in self.members if m in _RESERVED]
        if bad:
            raise ValueError(f"ImageDataset: members {bad} would hide the batch's own keys {_RESERVED}")
        self._paths = _source_paths(source, ctx)
        self._format_arg = format
        self._shards_of = None            # (pid, runtime, Shards) of this process
        self.skipped = 0                  # samples left out by on_error="skip" (this process)
        self._decoded = {"cpu": 0, "gpu": 0, "gpu_hardware": 0}
        self._seconds = {}
        self._logged_skip = False
        meta_ctx = ctx if ctx is not None else _ferry.Context(threads=1)
        try:
            s = _ferry.Shards(self._paths, format, meta_ctx)
            try:
                self.num_samples = len(s)
                self.format = s.format
                self.classes = list(s.classes)
                self._sample_members = _SampleMembers(s, label, self.members)
            finally:
                s.close()
        finally:
            if ctx is None:
                meta_ctx.close()
        if self.num_samples == 0:
            raise ValueError(f"ImageDataset: no samples in {self._paths}")
        shape = None if self.size is None else ((3,) + self.size if layout == "CHW" else self.size + (3,))
        self._fields = [_ImageField(shape, self.dtype)]
        self._submit_epoch = 0

    # ---------------------------------------------------------------- reading
    def _shards(self, rt):
        """This process's Shards (opened on the runtime's context; a fork opens its own)."""
        c = self._shards_of
        if c is None or c[0] != os.getpid() or c[1] is not rt:
            c = self._shards_of = (os.getpid(), rt, _ferry.Shards(self._paths, self._format_arg, rt.ctx))
        return c[2]

    def _decode_stream(self, rt):
        """A stream for the next group's batch: one per reader thread, in turn, so that two
        groups in flight do not queue behind each other's work (each call waits for its
        stream at its end)."""
        if not isinstance(rt.decode_stream, list):
            rt.decode_stream = [torch.cuda.Stream(rt.device) for _ in range(rt.READERS)]
            rt.decode_turn = 0
        rt.decode_turn = (rt.decode_turn + 1) % len(rt.decode_stream)
        return rt.decode_stream[rt.decode_turn]

    def _load_args(self, rt, epoch, stream):
        threads = self.threads or rt.ctx.config()["threads"]
        return dict(member=self.member, size=None, crop=self.crop, scale=self.scale, ratio=self.ratio,
                    flip=self.flip, mean=self.mean, std=self.std, layout=self.layout, seed=self.seed,
                    epoch=epoch, on_error=self.on_error, decode=self.decode, threads=threads,
                    stream=stream)

    def _batch_shape(self, s, ids):
        if self.size is not None:
            h, w = self.size
        else:       # crop=None, size=None: the batch's first image sets it (load_batch checks the rest)
            i = int(ids[0])
            head = images.probe(s.read(i, images._pick_member(s, i, self.member)))
            h, w = head["height"], head["width"]
        return (len(ids), 3, h, w) if self.layout == "CHW" else (len(ids), h, w, 3)

    def _submit(self, rt, order, lay, units, ids=None):
        self._submit_epoch = self._epoch_of_order(order)      # the crops' and flips' epoch
        return super()._submit(rt, order, lay, units, ids)

    def _read_image(self, rt, ids, g):
        """The image "field" of a group: its buffer, and the job that fills it (g.extra)."""
        s = self._shards(rt)
        ids = np.asarray(ids, dtype=np.int64)
        buf = self._alloc(rt, self._batch_shape(s, ids), self.dtype)
        stream = self._decode_stream(rt) if buf.is_cuda else None
        g.extra.append(_ImageBatchJob(rt, s, ids, buf, self._load_args(rt, self._submit_epoch, stream),
                                      self._sample_members))
        return buf

    # ---------------------------------------------------------------- hand-off
    def _finish(self, g):
        buf = g.bufs[0]
        res, keep, extras, _ = g.job.wait()
        self._count(res, extras["key"], keep)
        dev = buf.device
        skipped = set(res["skipped"])
        outs, lo, row = [], 0, 0
        for size in g.sizes:
            kept = [j for j in range(lo, lo + size) if j not in skipped]
            a, b = row, row + len(kept)
            lo, row = lo + size, b
            if self.batch_size is None and not kept:
                outs.append(_SKIPPED)
                continue
            o = {"image": buf[a:b]}
            for k, v in extras.items():
                o[k] = _batch_value(k, v[a:b], dev)
            if self.batch_size is None:
                o = {k: v[0] for k, v in o.items()}
            if self.transform is not None:
                o = self.transform(o)
            outs.append(o)
        return outs

    def _count(self, res, keys, keep):
        for k in ("cpu", "gpu", "gpu_hardware"):
            self._decoded[k] += res[k]
        for k, v in res["seconds"].items():
            self._seconds[k] = self._seconds.get(k, 0.0) + v
        if res["skipped"]:
            self.skipped += len(res["skipped"])
            if not self._logged_skip:
                self._logged_skip = True
                _log.warning("ferry.torch.ImageDataset: %d image(s) of a batch could not be decoded and "
                             "were skipped (on_error='skip'); further skips are counted in "
                             "ds.stats()['images']['skipped'], not logged", len(res["skipped"]))

    def _iterate(self):
        inner = super()._iterate()
        try:
            for o in inner:
                if o is not _SKIPPED:
                    yield o
        finally:
            inner.close()           # the pass's own clean-up, now rather than at collection

    def stats(self):
        """The engine's statistics for this process, with "images": decoded on the CPU and the
        GPU (gpu_hardware: of those, by the JPEG engine), skipped (on_error="skip"), and
        "seconds": where the batches' time went (load_batch's "seconds", summed), by this
        process's copy of the dataset."""
        st = dict(super().stats())
        st["images"] = dict(self._decoded, skipped=self.skipped, seconds=dict(self._seconds))
        return st

    def __getstate__(self):
        st = super().__getstate__()
        st["_shards_of"] = None           # an index of this process's open files
        return st

    def __repr__(self):
        return (f"ImageDataset({self.num_samples} samples, format={self.format!r}, size={self.size}, "
                f"crop={self.crop!r}, batch_size={self.batch_size}, shuffle={self.shuffle}, "
                f"epoch={self._epoch}, consumed={self._consumed})")


_BRACE = re.compile(r"\{([^{}]*)\}")
_MAX_BRACE = 1_000_000       # shards one {a..b} range may name (a typo must not build a list of billions)


def _braces(s):
    """WebDataset's shard lists: "train-{000000..000009}.tar" (a range, zero-padded as written) and
    "{a,b}" (alternatives) expanded, left to right; a string without them as it is."""
    m = _BRACE.search(s)
    if m is None:
        return [s]
    body, head, tail = m.group(1), s[:m.start()], s[m.end():]
    r = re.fullmatch(r"(\d+)\.\.(\d+)", body)
    if r:
        lo, hi = int(r.group(1)), int(r.group(2))
        if abs(hi - lo) >= _MAX_BRACE:
            raise ValueError(f"ImageDataset: {s!r}: the range {{{body}}} names {abs(hi - lo) + 1} shards, "
                             f"more than {_MAX_BRACE}: give a glob or a list")
        width = len(r.group(1)) if r.group(1).startswith("0") else 0
        step = 1 if hi >= lo else -1
        parts = [str(v).zfill(width) for v in range(lo, hi + step, step)]
    elif "," in body:
        parts = body.split(",")
    else:
        return [head + "{" + body + "}" + t for t in _braces(tail)]
    return [head + p + t for p in parts for t in _braces(tail)]


def _source_paths(source, ctx):
    """The dataset's paths: braces expanded, then globs (an s3:// or gs:// glob listed with ctx's
    remote options); a local directory or a URL without wildcards as it is (the C library tells its
    format: an MDS directory, an ImageFolder root, a tar shard, an image)."""
    if isinstance(source, (str, os.PathLike)):
        s = os.fspath(source)
        if isinstance(s, bytes):
            s = os.fsdecode(s)
        items = _braces(s)
    else:
        items = [os.fspath(p) for p in source]
    out = []
    for p in items:
        scheme = p.split("://", 1)[0].lower() if "://" in p else ""
        if scheme in ("http", "https") or (scheme not in ("", "file") and not any(c in p for c in "*?[")):
            out.append(p)              # a web server's URL as written ('?' starts its query)
        elif os.path.isdir(p):
            out.append(p)
        else:
            out.extend(_expand(p, ctx))
    return out


def _batch_value(name, values, device):
    """A list of one batch's values of a member -> what the batch holds."""
    if name == "key":
        return values
    if values and all(isinstance(v, int) for v in values):
        return torch.tensor(values, dtype=torch.int64).to(device, non_blocking=True)
    if name == "label" and not values:
        return torch.empty(0, dtype=torch.int64, device=device)
    if values and all(isinstance(v, torch.Tensor) for v in values):
        if all(v.shape == values[0].shape and v.dtype == values[0].dtype for v in values):
            return torch.stack(values).to(device, non_blocking=True)
        return [v.to(device) for v in values]
    return values


def _mds_int(t):
    return {"int8": "i1", "int16": "i2", "int32": "i4", "int64": "i8", "uint8": "u1", "uint16": "u2",
            "uint32": "u4", "uint64": "u8"}[t]


def _mds_ndarray(raw, enc):
    """An MDS ndarray column: "ndarray:dtype:shape" is raw data of that shape; "ndarray" alone
    carries a header (dtype code, ndim, shape as uint32s) before the data."""
    parts = enc.split(":")
    if len(parts) >= 3:
        shape = tuple(int(d) for d in parts[2].split(","))
        return np.frombuffer(raw, np.dtype(parts[1])).reshape(shape).copy()
    if len(parts) == 2:
        return np.frombuffer(raw, np.dtype(parts[1])).copy()
    raise ValueError("ImageDataset: MDS ndarray columns without dtype and shape in the encoding are not "
                     "read yet; name the column's encoding as ndarray:dtype:shape when writing")
