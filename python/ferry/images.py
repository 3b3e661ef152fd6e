"""Image shards and image decoders: thin wrappers of the C library
(ferry_experimental.h; the API may still change).

    from ferry import images
    s = images.open_shards("train-*.tar")          # WebDataset tar, Mosaic MDS dir, image folder
    len(s); s.sample(0)                            # {"key", "label", "members": [...]}
    jpg = s.read(0, "jpg")                         # the member's bytes
    img = images.decode(jpg)                       # numpy uint8 array, HWC (RGB)
    imgs = images.decode_batch([jpg, ...], threads=8)
    images.load_batch(s, [0, 5, 9], out, size=(224, 224), flip=0.5)   # decode + crop into out (C)

Decoding uses libjpeg-turbo (JPEG) and libspng (PNG) in C, the GIL released;
corrupt images raise ferry.FerryError naming the image (a sample key and
member when given as labels), never return partial pixels.
"""
from __future__ import annotations

import os
from typing import Any, Optional, Sequence, Union

from . import _checks, _ferry
from ._checks import check, check_prob

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
    (channels 3, or 1 for gray images with keep_gray), or into `out` (writable, C-contiguous
    uint8 of the image's shape: a FerryError naming out= otherwise, as ferry.read's out=)."""
    import numpy as np
    h = _ferry.image_probe(data, keep_gray)
    shape = (h["height"], h["width"], h["out_channels"])
    if out is None:
        out = np.empty(shape, np.uint8)
    else:
        from . import _check_out
        _check_out(out, int(np.prod(shape)), shape, "|u1", "ferry.images.decode", False, bytes_hint=False)
    _ferry.image_decode(data, out, keep_gray)
    return out


def decode_batch(datas: Sequence[bytes], keep_gray: bool = False, threads: int = 0,
                 labels: Optional[Sequence[str]] = None) -> list:
    """Decode many images on `threads` threads (0: one per CPU, at most 16);
    returns a list of uint8 HWC numpy arrays. labels name the images in errors."""
    import numpy as np
    threads = _checks.check("ferry.images.decode_batch", "threads", threads)
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


def nvjpeg_status() -> str:
    """Which nvJPEG ferry loaded ("loaded nvJPEG 12.4 from libnvjpeg.so.12"), or
    why none (FERRY_NVJPEG names a file, or "off"). Loads CUDA on first call."""
    return _ferry.nvjpeg_status()


_OUT_DTYPES = ("uint8", "float16", "bfloat16", "float32")
_TYPESTRS = {"|u1": "uint8", "<u1": "uint8", "<f2": "float16", "<f4": "float32", "<V2": "bfloat16",
             "bfloat16": "bfloat16"}
_ITEMSIZE = {"uint8": 1, "float16": 2, "bfloat16": 2, "float32": 4}
_CROPS = ("random_resized", "center", "resize", None)


def _out_facts(out: Any):
    """(shape, dtype name, contiguous, what to hand the extension, device or -1, default stream)."""
    mod = type(out).__module__.split(".")[0]
    if mod == "torch":
        dt = str(out.dtype).rsplit(".", 1)[-1]
        dev = out.device.index if out.device.type == "cuda" else -1
        if out.device.type == "cuda" and dev is None:
            dev = 0
        if out.device.type not in ("cuda", "cpu"):
            raise ValueError(f"load_batch: out is on {out.device}; host or CUDA memory is written")
        stream = 0
        if dev >= 0:
            import torch
            stream = torch.cuda.current_stream(out.device).cuda_stream
        raw = (out.data_ptr(), out.numel() * out.element_size(), dev)
        return tuple(out.shape), dt, out.is_contiguous(), raw, dev, stream
    if hasattr(out, "__cuda_array_interface__"):   # cupy, numba, ferry.Array on a device
        cai = out.__cuda_array_interface__
        shape, strides = tuple(cai["shape"]), cai.get("strides")
        dt = _TYPESTRS.get(cai["typestr"], cai["typestr"])
        if strides is not None:
            size, want = _ITEMSIZE.get(dt, 0), []
            for d in reversed(shape):
                want.insert(0, size)
                size *= d
            contiguous = tuple(strides) == tuple(want)
        else:
            contiguous = True
        stream = 0
        if mod == "cupy":
            import cupy
            stream = cupy.cuda.get_current_stream().ptr
        return shape, dt, contiguous, out, 0, stream
    shape = tuple(getattr(out, "shape", ()))
    dt = getattr(getattr(out, "dtype", None), "name", None) or str(getattr(out, "dtype", ""))
    flags = getattr(out, "flags", None)
    contiguous = bool(flags["C_CONTIGUOUS"]) if flags is not None else True
    return shape, dt, contiguous, out, -1, 0


_IMAGE_NAMES = ("jpg", "jpeg", "png")          # tar extensions and folder files that are images
_IMAGE_ENCODINGS = ("jpeg", "png")              # MDS columns that hold encoded images


def _pick_member(shards, i, member):
    """The member holding sample i's image: `member` (a name, a column or an index; a tuple:
    the first the sample has), or the first image member (jpg/jpeg/png, or an MDS jpeg/png
    column) -- the member ferry_image_batch takes when none is named."""
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


def load_batch(shards, samples, out, *, member=None, size=None, crop="random_resized", scale=(0.08, 1.0),
               ratio=(3 / 4, 4 / 3), flip=0.0, mean=None, std=None, layout="CHW", seed=0, epoch=0,
               on_error="raise", decode="auto", threads=0, stream=None) -> dict:
    """Read, decode and transform the images of `samples` (indices into the
    Shards set) into the rows of `out`, in C (ferry_image_batch), the GIL
    released.

    out: a preallocated C-contiguous torch / cupy / numpy array of shape
    (len(samples), 3, H, W) (layout "CHW") or (len(samples), H, W, 3) ("HWC"),
    dtype uint8, float16, bfloat16 or float32, on the host or a CUDA device:
    its dtype, layout and device define the output. size=(H, W) must match it.
    crop: "random_resized" (RandomResizedCrop(size, scale, ratio)), "center"
    (the largest centred box of the output's aspect, resized: for a square
    output Resize(size) + CenterCrop(size)), "resize" (the whole image
    resized) or None (no resize: every image must already be H x W, else an
    error whatever on_error says). flip: probability of a horizontal flip.
    mean/std: per channel, for float outputs ((v / 255 - mean) / std); None:
    no normalisation (v / 255). Crops and flips derive from (seed, epoch,
    sample), so a resumed epoch draws the same ones.

    decode: "auto" (nvJPEG and the CPU threads together for a CUDA `out`,
    where nvJPEG and the transform kernel load; else the CPU), "gpu" or
    "cpu". on_error: "raise" (FerryError naming the shard file, sample key and
    member) or "skip" (the sample left out). stream: the CUDA stream the rows
    are written on (an int handle or an object with .cuda_stream / .ptr;
    None: torch's or cupy's current stream); the call returns when they are
    there. Work queued on that stream before the call delays the copies of
    CPU-decoded images: a stream of the loader's own is best.

    Returns {"written": k, "skipped": [positions in samples], "gpu": n,
    "cpu": n, "fallbacks": {reason: n}, "gpu_hardware": n, "seconds": {"call",
    "prepare", "cpu_decode", "gpu", "wait"}} (where the call's time went: reading and
    probing, thread-seconds of CPU decoding, the GPU feeder's runs, thread-seconds waiting
    for the device); rows 0..k-1 of out hold the samples not skipped, in order."""
    seed = check("ferry.images.load_batch", "seed", seed)
    epoch = check("ferry.images.load_batch", "epoch", epoch)
    threads = check("ferry.images.load_batch", "threads", threads)
    flip = check_prob("ferry.images.load_batch", "flip", flip)
    shape, dt, contiguous, raw, dev, default_stream = _out_facts(out)
    samples = [int(s) for s in samples]
    if len(shape) != 4:
        raise ValueError(f"load_batch: out must be 4-d (N, C, H, W) or (N, H, W, C), not shape {shape}")
    if layout not in ("CHW", "HWC"):
        raise ValueError(f"load_batch: layout {layout!r}: 'CHW' or 'HWC'")
    n, (c, h, w) = shape[0], ((shape[1], shape[2], shape[3]) if layout == "CHW" else (shape[3], shape[1], shape[2]))
    if n != len(samples):
        raise ValueError(f"load_batch: out has {n} rows for {len(samples)} samples")
    if c != 3:
        raise ValueError(f"load_batch: out has {c} channels in layout {layout}; images are written as 3 (RGB)")
    if size is not None:
        sh, sw = (size, size) if isinstance(size, int) else tuple(size)
        if (sh, sw) != (h, w):
            raise ValueError(f"load_batch: size {(sh, sw)} does not match out's {(h, w)}")
    if dt not in _OUT_DTYPES:
        raise _checks.KeywordTypeError(f"load_batch: out has dtype {dt}; uint8, float16, bfloat16 or float32")
    if not contiguous:
        raise ValueError("load_batch: out must be C-contiguous")
    if crop not in _CROPS:
        raise ValueError(f"load_batch: crop {crop!r}: 'random_resized', 'center', 'resize' or None")
    if stream is None:
        stream = default_stream
    elif not isinstance(stream, int):
        stream = getattr(stream, "cuda_stream", None) or getattr(stream, "ptr", 0)
    if dev < 0:
        stream = 0
    return _ferry.image_batch(shards, samples, raw, h, w, layout=layout, dtype=dt, crop=crop,
                              scale=tuple(map(float, scale)), ratio=tuple(map(float, ratio)), flip=float(flip),
                              mean=mean, std=std, seed=int(seed), epoch=int(epoch), member=member,
                              on_error=on_error, decode=decode, threads=int(threads), stream=int(stream))
