"""Device buffers made by ferry itself (ferry.empty on a CUDA device), for GPU
tests that must run without cupy or torch: on the simulated driver of
tests/cudasim in `make test`, and next to cupy/torch on a real GPU."""
import numpy as np

from ferry import _ferry as F


def full(ctx, shape, dtype, byte=0x5A):
    """A device array of shape/dtype on device 0, every byte set to `byte`."""
    dtype = np.dtype(dtype)
    a = F.empty(shape, dtype.str, device=0, ctx=ctx)
    if a.nbytes:
        ctx.memcpy(a, np.full(a.nbytes, byte, dtype=np.uint8))
    return a


def to_numpy(ctx, a, dtype):
    """The contents of device array a as a numpy array of dtype."""
    h = np.empty(a.shape, dtype=np.dtype(dtype))
    if h.nbytes:
        ctx.memcpy(h, a)
    return h
