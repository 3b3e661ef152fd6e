"""Image shards and image decoders: thin wrappers of the C library
(ferry_experimental.h; the API may still change).

    from ferry import images
    s = images.open_shards("train-*.tar")          # WebDataset tar, Mosaic MDS dir, image folder
    len(s); s.sample(0)                            # {"key", "label", "members": [...]}
    jpg = s.read(0, "jpg")                         # the member's bytes
    img = images.decode(jpg)                       # numpy uint8 array, HWC (RGB)
    imgs = images.decode_batch([jpg, ...], threads=8)

Decoding uses libjpeg-turbo (JPEG) and libspng (PNG) in C, the GIL released;
corrupt images raise ferry.FerryError naming the image (a sample key and
member when given as labels), never return partial pixels.
"""
from __future__ import annotations

import os
from typing import Any, Optional, Sequence, Union

from . import _checks, _ferry

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
