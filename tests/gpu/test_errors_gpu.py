"""Device-side answers to the mistakes of issue 38 (items 9, 11, 17): out= device memory that
is strided or of another dtype is a FerryError naming the file, the variable and out=; an
ordinal past the machine's GPUs names how many there are; progress= reads a device destination
in steps. Runs on a real GPU and on the stand-in driver (tests/cudasim); results are ferry's
own device arrays or cupy's, copied back and compared with numpy."""
import numpy as np
import pytest

import ferry
import ferry_arrays
from ferry import _ferry as F


class _Strided:
    """Device memory described as a strided view (every other column), through
    __cuda_array_interface__ only."""

    def __init__(self, base, shape, typestr):
        lay = F.buffer_layout(base)
        item = np.dtype(typestr).itemsize
        self.__cuda_array_interface__ = {"data": (lay["ptr"], False), "shape": shape, "typestr": typestr,
                                         "strides": (shape[1] * 2 * item, 2 * item), "version": 3}


def _host(ctx, a, dtype):
    if isinstance(a, F.Array):
        return ferry_arrays.to_numpy(ctx, a, np.dtype(dtype))
    import cupy
    return cupy.asnumpy(a)


@pytest.fixture(scope="module")
def npy(tmp_path_factory):
    p = str(tmp_path_factory.mktemp("err") / "a.npy")
    a = np.arange(600 * 5, dtype="<f4").reshape(600, 5)
    np.save(p, a)
    return p, a


def test_buffer_layout_of_device_memory(ctx, npy):
    a = ferry.empty((6, 5), "<f4", device=0)
    lay = F.buffer_layout(a)
    assert (lay["device"], lay["typestr"], lay["shape"], lay["contiguous"]) == (0, "<f4", (6, 5), True)
    s = _Strided(ferry.empty((6, 10), "<f4", device=0), (6, 5), "<f4")
    lay = F.buffer_layout(s)
    assert lay["source"] == "cuda_array_interface" and not lay["contiguous"] and lay["device"] in (0, None)


def test_strided_and_mistyped_device_out(ctx, npy):
    p, _ = npy
    base = ferry.empty((600, 10), "<f4", device=0)
    with pytest.raises(ferry.FerryError, match="out= is not C-contiguous") as ei:
        ferry.read(p, out=_Strided(base, (600, 5), "<f4"))
    assert p in str(ei.value)
    with pytest.raises(ferry.FerryError, match="dtype mismatch"):
        ferry.read(p, out=ferry.empty((600, 5), "<f8", device=0))


def test_an_ordinal_past_the_gpus_names_how_many(ctx, npy):
    p, _ = npy
    n = ctx.cuda_device_count()
    with pytest.raises(ferry.FerryError, match=f"this machine has {n} GPU") as ei:
        ferry.read(p, device=n)
    assert 'device="cpu"' in str(ei.value) and ei.value.code == F.ENOCUDA


def test_progress_reads_a_device_destination_in_steps(ctx, npy):
    p, a = npy
    got = []
    r = ferry.read(p, device=0, progress=lambda d, t: got.append(d))
    np.testing.assert_array_equal(_host(ctx, r, "<f4"), a)
    assert len(got) > 10 and got[-1] == a.nbytes, got
