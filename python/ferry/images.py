"""Image shards and image decoders: thin wrappers of the C library
(ferry_experimental.h; the API may still change).

    from ferry import images
    s = images.open_shards("train-*.tar")          # WebDataset tar, Mosaic MDS dir, image folder
    len(s); s.sample(0)                            # {"key", "label", "members": [...]}
    jpg = s.read(0, "jpg")                         # the member's bytes
    img = images.decode(jpg)                       # numpy uint8 array, HWC (RGB)
    imgs = images.decode_batch([jpg, ...], threads=8)
    out = torch.empty(64, 3, 224, 224, dtype=torch.bfloat16, device="cuda")
    images.load_batch(s, range(64), out, flip=0.5, mean=..., std=..., epoch=3)   # a training batch

Decoding uses libjpeg-turbo (JPEG) and libspng (PNG) in C, the GIL released;
corrupt images raise ferry.FerryError naming the image (a sample key and
member when given as labels), never return partial pixels.
"""
from __future__ import annotations

import os
from typing import Any, Optional, Sequence, Union

from . import _ferry

Shards = _ferry.Shards

PathLike = Union[str, "os.PathLike[str]"]


def open_shards(paths: Union[PathLike, Sequence[PathLike]], format: Optional[str] = None,
                ctx: Any = None) -> "_ferry.Shards":
    """Index shards: a path, a glob or a list of them; format "tar", "mds",
    "folder" or "files" (None: detected)."""
    return _ferry.Shards(paths, format, ctx)


def probe(data: bytes, keep_gray: bool = False) -> dict:
    """The header of a JPEG or PNG image: format, width, height, channels,
    subsampling, progressive, bit_depth, cmyk, out_channels."""
    return _ferry.image_probe(data, keep_gray)


def decode(data: bytes, keep_gray: bool = False, out: Any = None):
    """Decode one image to a (height, width, channels) uint8 numpy array
    (channels 3, or 1 for gray images with keep_gray), or into `out`."""
    import numpy as np
    if out is None:
        h = _ferry.image_probe(data, keep_gray)
        out = np.empty((h["height"], h["width"], h["out_channels"]), np.uint8)
    _ferry.image_decode(data, out, keep_gray)
    return out


def decode_batch(datas: Sequence[bytes], keep_gray: bool = False, threads: int = 0,
                 labels: Optional[Sequence[str]] = None) -> list:
    """Decode many images on `threads` threads (0: one per CPU, at most 16);
    returns a list of uint8 HWC numpy arrays. labels name the images in errors."""
    import numpy as np
    outs = []
    for i, d in enumerate(datas):
        try:
            h = _ferry.image_probe(d, keep_gray)
        except _ferry.FerryError as e:
            if labels is None:
                raise
            raise _ferry.FerryError(e.args[0], f"{labels[i]}: {e.args[1]}") from None
        outs.append(np.empty((h["height"], h["width"], h["out_channels"]), np.uint8))
    _ferry.image_decode_batch(list(datas), outs, labels, keep_gray, threads)
    return outs


# --------------------------------------------------------------------------------------------
# load_batch: read, decode and transform a batch of samples into a caller's array
# --------------------------------------------------------------------------------------------
_decode_one = decode           # load_batch's `decode` keyword hides the function
_OUT_DTYPES = ("uint8", "float16", "bfloat16", "float32")
_CROPS = ("random_resized", "center", "resize", None)
_IMAGE_NAMES = ("jpg", "jpeg", "png")          # tar extensions and folder files that are images
_IMAGE_ENCODINGS = ("jpeg", "png")              # MDS columns that hold encoded images
_pools = {}


def _pool(threads):
    """Transform threads, per process: a forked child (a DataLoader worker) has none of its
    parent's threads, and work given to the parent's pool would wait for ever."""
    import concurrent.futures
    n = threads if threads > 0 else min(16, os.cpu_count() or 1)
    key = (os.getpid(), n)
    p = _pools.get(key)
    if p is None:
        p = _pools[key] = concurrent.futures.ThreadPoolExecutor(n, thread_name_prefix="ferry-img")
    return p


def _out_info(out, layout):
    """(kind, dtype name, (n, C, H, W), device index or -1) of a C-contiguous 4-D output."""
    mod = type(out).__module__.split(".")[0]
    if mod == "torch":
        dt = str(out.dtype).rsplit(".", 1)[-1]
        contiguous = out.is_contiguous()
        dev = out.device.index if out.is_cuda else -1
        if out.is_cuda and dev is None:     # pragma: no cover - torch always gives cuda tensors an index
            dev = 0
        kind = "torch"
    elif mod == "cupy":
        dt, contiguous, dev, kind = out.dtype.name, out.flags.c_contiguous, out.device.id, "cupy"
    elif hasattr(out, "__array_interface__"):
        import numpy as np
        out = np.asarray(out)
        dt, contiguous, dev, kind = out.dtype.name, out.flags.c_contiguous, -1, "numpy"
    else:
        raise TypeError(f"load_batch: out must be a torch tensor, a cupy or a numpy array, not {type(out).__name__}")
    if dt not in _OUT_DTYPES:
        raise TypeError(f"load_batch: out's dtype is {dt}; image batches are {', '.join(_OUT_DTYPES)}")
    if not contiguous or len(out.shape) != 4:
        raise ValueError(f"load_batch: out must be a C-contiguous 4-D array, (n, C, H, W) or (n, H, W, C); "
                         f"got shape {tuple(out.shape)}{'' if contiguous else ', not contiguous'}")
    s = tuple(int(d) for d in out.shape)
    nchw = (s[0], s[1], s[2], s[3]) if layout == "CHW" else (s[0], s[3], s[1], s[2])
    return kind, dt, nchw, dev


def _host_bytes(out, kind):
    """A flat uint8 numpy view of a host output's memory."""
    import numpy as np
    if kind == "torch":
        import torch
        return out.reshape(-1).view(torch.uint8).numpy()
    return np.asarray(out).reshape(-1).view(np.uint8)


def _copy_to_device(out, kind, stage, nbytes, stream):
    """stage[:nbytes] -> the first nbytes of device array `out`, ordered on `stream` (a
    torch/cupy stream, a cudaStream_t as an int, or None: the current stream); the call returns
    once the copy is complete (the host buffer is reused at once)."""
    if kind == "torch":
        import torch
        if isinstance(stream, int):
            stream = torch.cuda.ExternalStream(stream, device=out.device)
        elif stream is not None and not isinstance(stream, torch.cuda.Stream):
            stream = torch.cuda.ExternalStream(int(getattr(stream, "ptr", getattr(stream, "cuda_stream", 0))),
                                               device=out.device)
        dst = out.reshape(-1).view(torch.uint8)[:nbytes]
        with torch.cuda.stream(stream if stream is not None else torch.cuda.current_stream(out.device)):
            dst.copy_(torch.from_numpy(stage[:nbytes]))     # pageable source: complete on return
        return
    import cupy
    if isinstance(stream, int):
        stream = cupy.cuda.ExternalStream(stream)
    elif stream is not None and not isinstance(stream, cupy.cuda.Stream):
        stream = cupy.cuda.ExternalStream(int(getattr(stream, "cuda_stream", getattr(stream, "ptr", 0))))
    dst = out.reshape(-1).view(cupy.uint8)[:nbytes]
    dst.set(stage[:nbytes], stream=stream)
    (stream or cupy.cuda.get_current_stream()).synchronize()


def _pick_member(shards, i, member):
    """The member holding sample i's image: `member` (a name, a column or an index; a tuple:
    the first the sample has), or the first image member (jpg/jpeg/png, or an MDS jpeg/png
    column)."""
    if isinstance(member, (str, int)) and not isinstance(member, bool):
        return member
    info = shards.sample(i)
    names = [m["name"] for m in info["members"]]
    if member is not None:
        for m in member:
            if m in names:
                return m
        raise KeyError(f"sample {info['key']!r} ({i}): none of the members {list(member)} (it has {names})")
    for m in info["members"]:
        if m["encoding"] in _IMAGE_ENCODINGS or (m["encoding"] is None and m["name"] in _IMAGE_NAMES):
            return m["name"]
    raise KeyError(f"sample {info['key']!r} ({i}): no image member (jpg, jpeg, png or an MDS jpeg/png "
                   f"column; it has {names}); name it with member=")


def _name(shards, i, member):
    """Where sample i's member is, for error messages: shard, key, member."""
    try:
        info = shards.sample(i)
        m = next((x for x in info["members"] if x["name"] == member), None) if isinstance(member, str) \
            else info["members"][member]
        path = m["path"] if m else "?"
        return f"{path}: sample {info['key']!r}, member {m['name'] if m else member!r}"
    except Exception:       # the message must not hide the error it reports
        return f"sample {i}, member {member!r}"


def load_batch(shards, samples, out, *, member=None, size=None, crop="random_resized", scale=(0.08, 1.0),
               ratio=(3 / 4, 4 / 3), flip=0.0, mean=None, std=None, layout="CHW", seed=0, epoch=0,
               on_error="raise", decode="auto", threads=0, stream=None) -> dict:
    """Read, decode and transform the images of `samples` (indices into `shards`, a Shards
    set) into `out`, a preallocated C-contiguous torch tensor, cupy or numpy array of shape
    (len(samples), C, H, W) (layout "CHW") or (len(samples), H, W, C) ("HWC"), C = 3, dtype
    uint8, float16, bfloat16 or float32 — its dtype, layout and device define the output.

    member: the member holding the image (a tar extension, an MDS column, an index; a tuple:
    the first one a sample has); None: each sample's first jpg/jpeg/png member or jpeg/png
    column. crop: "random_resized" (torchvision's RandomResizedCrop(size, scale, ratio): a box
    drawn from (seed, epoch, sample), resized to H x W), "center" (a box of H x W at the centre,
    CenterCrop's; a smaller image gives its whole extent, resized up rather than padded),
    "resize" (the whole image resized to H x W) or None (every image must already be H x W).
    size: None (out's H x W), an int or (h, w) equal to out's. flip: the probability of a
    left-right flip, drawn from (seed, epoch, sample). mean/std (1 or 3 values, on v / 255):
    float outputs only; None: v / 255 for floats, the pixels for uint8. Resizes are
    antialiased (torchvision's resize(antialias=True), within 1 of its uint8 result).

    on_error: "raise" (a FerryError naming shard, sample key and member) or "skip" (the sample
    is left out; an image that cannot be decoded). decode: "auto" or "cpu"; "gpu" is refused
    by this build (its batch path to the GPU decoder is not here yet). threads: decode and
    transform threads (0: one per CPU, at most 16). stream: for a device `out`, the stream the
    copies are ordered on (torch or cupy stream, or a cudaStream_t int; None: the current
    one); they are complete when the call returns.

    Returns {"written": k, "skipped": [positions in samples], "gpu": 0, "cpu": k,
    "fallbacks": {}}: rows 0..k-1 of out hold the non-skipped samples in order."""
    import numpy as np
    if layout not in ("CHW", "HWC"):
        raise ValueError(f"load_batch: layout must be 'CHW' or 'HWC', not {layout!r}")
    if crop not in _CROPS:
        raise ValueError(f"load_batch: crop must be one of {_CROPS}, not {crop!r}")
    if on_error not in ("raise", "skip"):
        raise ValueError(f"load_batch: on_error must be 'raise' or 'skip', not {on_error!r}")
    if decode not in ("auto", "cpu", "gpu"):
        raise ValueError(f"load_batch: decode must be 'auto', 'cpu' or 'gpu', not {decode!r}")
    if decode == "gpu":
        raise _ferry.FerryError(_ferry.EUNSUPPORTED,
                                "load_batch: decode='gpu' needs the GPU decoder's batch path, which this "
                                "build does not have; use decode='auto' or 'cpu'")
    kind, dt, (n, c, H, W), dev = _out_info(out, layout)
    samples = [int(i) for i in samples]
    if n != len(samples):
        raise ValueError(f"load_batch: out holds {n} images, {len(samples)} samples were given")
    if c != 3:
        raise ValueError(f"load_batch: images are decoded to 3 channels (RGB); out has {c}")
    if size is not None:
        hw = (int(size), int(size)) if isinstance(size, (int, np.integer)) else tuple(int(v) for v in size)
        if hw != (H, W):
            raise ValueError(f"load_batch: size {hw} is not out's {H} x {W}")
    if (mean is None) != (std is None):
        raise ValueError("load_batch: give mean and std together")
    if mean is not None and dt == "uint8":
        raise ValueError("load_batch: mean/std normalise float outputs; out is uint8")
    flip = float(flip)
    if not 0.0 <= flip <= 1.0:
        raise ValueError(f"load_batch: flip is a probability in [0, 1], not {flip}")
    scale, ratio = tuple(float(v) for v in scale), tuple(float(v) for v in ratio)
    members = [_pick_member(shards, i, member) for i in samples]
    datas = [shards.read(i, m) for i, m in zip(samples, members)]

    def label(j):
        return _name(shards, samples[j], members[j])

    skipped = set()
    try:
        imgs = decode_batch(datas, threads=threads, labels=[label(j) for j in range(n)]) if n else []
    except _ferry.FerryError:
        if on_error == "raise":
            raise
        imgs = []                       # one by one, to tell the bad ones from the good
        for j, d in enumerate(datas):
            try:
                imgs.append(_decode_one(d))
            except _ferry.FerryError:
                skipped.add(j)
                imgs.append(None)
    keep = [j for j in range(n) if j not in skipped]

    def box(j):
        h, w = imgs[j].shape[:2]
        i = samples[j]
        if crop == "random_resized":
            return _ferry.random_resized_crop(seed, epoch, i, h, w, scale, ratio)
        if crop == "center":
            return _ferry.center_box(h, w, H, W)
        if crop is None and (h, w) != (H, W):
            raise ValueError(
                f"load_batch: {label(j)} is {h} x {w} and the batch is {H} x {W}; images of other "
                f"sizes need a resize or a crop of equal-size output (crop='random_resized', "
                f"'center' or 'resize')")
        return (0, 0, h, w)

    boxes = [box(j) for j in keep]
    flips = [flip > 0 and _ferry.flip_draw(seed, epoch, samples[j], flip) for j in keep]
    mean3 = None if mean is None else [float(v) for v in np.asarray(mean, dtype=np.float64).reshape(-1)]
    std3 = None if std is None else [float(v) for v in np.asarray(std, dtype=np.float64).reshape(-1)]
    item = {"uint8": 1, "float16": 2, "bfloat16": 2, "float32": 4}[dt]
    rb = c * H * W * item
    dst = _host_bytes(out, kind) if dev < 0 else np.empty(len(keep) * rb, np.uint8)

    def xform(k):
        img = imgs[keep[k]]
        raw = _ferry.image_transform(img, img.shape, boxes[k], (H, W), flips[k], layout, dt, mean3, std3)
        dst[k * rb:(k + 1) * rb] = np.frombuffer(raw, np.uint8)

    if len(keep) > 1 and threads != 1:
        list(_pool(threads).map(xform, range(len(keep))))
    else:
        for k in range(len(keep)):
            xform(k)
    if dev >= 0 and keep:
        _copy_to_device(out, kind, dst, len(keep) * rb, stream)
    return {"written": len(keep), "skipped": sorted(skipped), "gpu": 0, "cpu": len(keep), "fallbacks": {}}
