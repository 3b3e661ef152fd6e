"""Common mistakes and what ferry answers: each case makes its files in a folder, makes the bad
call, and states the exception, a pattern its message must match, and the fix a user needs.
test_errors.py runs every case; tools/errors_table.py turns them into docs/errors.md (the
messages as the code writes them, the folder's path left out), and test_errors.py checks that
the page is current. A case whose message depends on the machine has no place here (its test
lives beside the others in test_errors.py)."""
import os
from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass
class Case:
    mistake: str                 # what the user did, in their words
    call: Callable[[str], object]   # the bad call, given a folder for its files
    raises: str                  # "ValueError", "TypeError", "FerryError", ...
    match: str                   # a regular expression the message matches
    fix: str                     # what to do instead
    needs: tuple = ()             # modules the case imports (skipped without them)


def _npy(d, name="a.npy", a=None):
    p = os.path.join(d, name)
    np.save(p, np.arange(12, dtype="<f4").reshape(3, 4) if a is None else a)
    return p


def _read_out(out):
    import ferry
    return lambda d: ferry.read(_npy(d), out=out() if callable(out) else out)


def _readonly():
    a = np.zeros((3, 4), "<f4")
    a.flags.writeable = False
    return a


def _threads(d):
    import ferry
    return ferry.read(_npy(d), threads=-3)


def _batch_size(d):
    from ferry.torch import ArrayDataset
    return ArrayDataset(_npy(d), batch_size=0, device="cpu")


def _seq_len(d):
    from ferry.torch import TokenDataset
    p = os.path.join(d, "t.bin")
    np.arange(100, dtype="<u2").tofile(p)
    return TokenDataset(p, -8, 4, device="cpu", shuffle=False)


def _rank(d):
    from ferry.torch import ArrayDataset
    return ArrayDataset(_npy(d), rank=2, world_size=2, device="cpu")


def _shard_size(d):
    import torch

    import ferry.checkpoint as ck
    return ck.save({"w": torch.zeros(2)}, os.path.join(d, "m.safetensors"), max_shard_size="5QB")


def _two_vars(d):
    from safetensors.numpy import save_file

    import ferry
    p = os.path.join(d, "m.safetensors")
    save_file({"a": np.zeros(2, "<f4"), "b": np.ones(2, "<f4")}, p)
    return ferry.read(p)


def _torch_zip(d):
    import zipfile

    import ferry.checkpoint as ck
    p = os.path.join(d, "model.safetensors")
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("model/data.pkl", b"\x80\x02}q\x00.")
    return ck.load(p)


def _text_npy(d):
    import ferry
    p = os.path.join(d, "table.npy")
    with open(p, "w") as f:
        f.write("time,value\n0,1.5\n")
    return ferry.read(p)


def _group(d):
    import xarray as xr
    p = os.path.join(d, "classic.nc")
    xr.Dataset({"t": ("x", np.arange(4.0))}).to_netcdf(p, engine="scipy")
    return xr.open_dataset(p, engine="ferry", group="nope")


def _no_gpu(d):
    """The message of a machine without a driver, whatever this one has: the resolver asked
    with a context whose driver is missing (test_errors.py runs the real thing)."""
    from ferry._nogpu import no_gpu

    class NoDriver:
        cuda_status = "libcuda.so.1 not found (no NVIDIA driver)"

        def cuda_device_count(self):
            return 0
    raise no_gpu(os.path.join(d, "a.npy") + ": a", 0, NoDriver())


def _progress(d):
    import ferry
    return ferry.read(_npy(d), progress="yes")


CASES = [
    Case("`threads=-3` (or any numeric keyword out of range, in any function)", _threads, "ValueError",
         r"ferry.read: threads must be an int from 0 to 4096",
         "Give a value in the range the message names; 0 means the context's workers."),
    Case("`batch_size=0` for a dataset", _batch_size, "ValueError",
         r"ArrayDataset: batch_size must be an int from 1 to", "A positive batch size, or None for one sample at a time.",
         ("torch",)),
    Case("a negative `seq_len`", _seq_len, "ValueError", r"TokenDataset: seq_len must be an int from 1",
         "The window length in tokens, at least 1.", ("torch",)),
    Case("`rank` not below `world_size`", _rank, "ValueError", r"rank must be an int from 0 to 1 \(below world_size\)",
         "Ranks count from 0 to world_size - 1.", ("torch",)),
    Case("`max_shard_size` that is not a size", _shard_size, "ValueError", r"max_shard_size: \"5QB\": not a size",
         "Bytes as an int, or a string such as \"5GB\" (10^9) or \"5GiB\" (2^30).", ("torch",)),
    Case("`progress=` of another kind", _progress, "ValueError", r"progress must be None, True, 'tqdm' or a callable",
         "True for a bar (or log lines), or a function progress(done, total)."),
    Case("`out=` of another dtype", _read_out(lambda: np.zeros((3, 4), "<f8")), "FerryError", r"a dtype mismatch",
         "An out= of the data's dtype, or out_bytes=True to fill its bytes as they are."),
    Case("`out=` of another shape", _read_out(lambda: np.zeros((4, 3), "<f4")), "FerryError",
         r"out= has shape \(4, 3\), the selection is \(3, 4\)",
         "An out= of the selection's shape (reshape a view), or out_bytes=True."),
    Case("`out=` a strided view", _read_out(lambda: np.zeros((3, 8), "<f4")[:, ::2]), "FerryError",
         r"out= is not C-contiguous", "Read into a contiguous array and copy into the view."),
    Case("`out=` a read-only array", _read_out(_readonly), "FerryError", r"out= is read-only",
         "A writable array (or no out=: ferry allocates one)."),
    Case("`device=0` / `device=\"cuda\"` on a machine without a GPU", _no_gpu, "FerryError",
         r"no usable GPU was found .*device=\"cpu\" reads to host memory", "device=\"cpu\" (the default)."),
    Case("no variable named in a file of several", _two_vars, "ValueError", r"holds 2 variables; name one of",
         "Name the variable: ferry.read(path, \"a\").", ("safetensors",)),
    Case("a torch.save file loaded as safetensors", _torch_zip, "FerryError",
         r"a torch.save zip archive, not safetensors", "torch.load it (or convert it to safetensors once).",
         ("torch",)),
    Case("a text file given as .npy", _text_npy, "FerryError", r"plain text, not npy",
         "Read text with numpy.loadtxt or pandas; ferry reads array files."),
    Case("`group=` that a classic netCDF file does not have", _group, "FerryError", r"no group \"nope\"",
         "Classic (netCDF-3) files have only the root group: leave group= out.", ("xarray", "scipy")),
]


def message(case: Case, folder: str) -> tuple:
    """(exception type name, message with the folder left out) of the case's call."""
    import ferry
    try:
        case.call(folder)
    except (ValueError, TypeError, ferry.FerryError, KeyError, ImportError) as e:
        text = str(e).replace(folder.rstrip("/") + "/", "")
        return type(e).__name__, text
    raise AssertionError(f"{case.mistake}: no error")
