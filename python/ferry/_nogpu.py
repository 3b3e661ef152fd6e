"""device="cuda" / device=0 on a machine without a usable GPU (issue 38 item 11): one FerryError,
saying no GPU was found and that device="cpu" reads to host memory, instead of whatever the first
allocation happened to say (torch's "Found no NVIDIA driver", cupy's cudaErrorNoDevice, the
library's "libcuda.so.1 not found").

The question is asked only where device memory is first allocated and that allocation failed
(device_alloc), or where an engine is set up for a device: opening a file lazily with device=0
touches no GPU and stays legal (the xarray backend's lazy open, tests on the stand-in driver).
The library answers it: the context's CUDA device count and status (tests/cudasim stands in for
the driver)."""
from __future__ import annotations

import contextlib


def _shown(device) -> str:
    return repr(device if isinstance(device, int) else str(device))


def no_gpu(where: str, device, ctx=None):
    """The FerryError to raise when `device` names a GPU this process cannot use, else None
    (a GPU is there: a failure is something else, and is raised as it is)."""
    from . import FerryError, _device_index, _ferry, default_context
    try:
        if _device_index(device) == -1:      # the CPU: a failure there is no GPU's doing
            return None
    except (TypeError, ValueError):
        return None
    c = ctx if ctx is not None else default_context()
    try:
        n = c.cuda_device_count()
        reason = c.cuda_status or "the driver reports no CUDA device"
    except FerryError as e:
        n, reason = 0, str(e)
    index = device if isinstance(device, int) else getattr(device, "index", None)
    if n > 0 and (index is None or index < n):
        return None
    if n > 0:
        return FerryError(_ferry.ENOCUDA, f"{where}: device={_shown(device)}, but this machine has {n} GPU"
                                          f"{'s' if n > 1 else ''} (0..{n - 1}); device=\"cpu\" reads to host memory")
    return FerryError(_ferry.ENOCUDA, f"{where}: device={_shown(device)} asks for a GPU, but no usable GPU was "
                                      f"found ({reason}); device=\"cpu\" reads to host memory")


@contextlib.contextmanager
def device_alloc(where: str, device, ctx=None):
    """Around the first allocation on `device`: a failure there becomes no_gpu's FerryError
    when the machine has no usable GPU, and stays what it was otherwise."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 — torch's RuntimeError, cupy's CUDARuntimeError, FerryError...
        err = no_gpu(where, device, ctx)
        if err is None:
            raise
        raise err from e
