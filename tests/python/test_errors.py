"""ferry.FerryError keeps its message and attributes through str(), pickling
and torch's DataLoader, which re-raises a worker's exception in the main
process as type(e)(text)."""
import pickle

import numpy as np
import pytest

import ferry
from ferry import _ferry


def test_message_only_has_its_str():
    e = ferry.FerryError("x.npy: bad header at byte 8")
    assert str(e) == "x.npy: bad header at byte 8" and e.message == str(e) and e.code is None
    e = ferry.FerryError(message="m", code=_ferry.EFORMAT)
    assert str(e) == "m" and e.code == _ferry.EFORMAT
    e = ferry.FerryError(_ferry.ENOTFOUND, "a.npy: no such variable")
    assert e.code == _ferry.ENOTFOUND and str(e) == "a.npy: no such variable"


def test_pickle_round_trip_keeps_code_message_and_attributes():
    e = ferry.FerryError(_ferry.EFORMAT, "f.nc: bad magic at byte 0", path="f.nc")
    for proto in range(pickle.HIGHEST_PROTOCOL + 1):
        r = pickle.loads(pickle.dumps(e, proto))
        assert type(r) is ferry.FerryError
        assert (r.code, r.message, str(r), r.path) == (e.code, e.message, str(e), "f.nc")
    r = pickle.loads(pickle.dumps(ferry.FerryError("just text")))
    assert str(r) == "just text"


def test_library_error_survives_pickling(tmp_path):
    p = tmp_path / "bad.npy"
    p.write_bytes(b"\x93NUMPY\x01\x00\x10\x00{'descr': junk}\n")
    with pytest.raises(ferry.FerryError) as ei:
        ferry.read(p)
    r = pickle.loads(pickle.dumps(ei.value))
    assert str(r) == str(ei.value) and str(p) in str(r) and r.code == ei.value.code


class _Failing:
    def __init__(self, path):
        self.path = path

    def __len__(self):
        return 2

    def __getitem__(self, i):
        return ferry.read(self.path)      # a damaged file: FerryError in the worker


def test_error_in_dataloader_worker_reaches_main_process_with_message(tmp_path):
    torch = pytest.importorskip("torch")
    p = tmp_path / "bad.npy"
    p.write_bytes(b"\x93NUMPY\x01\x00\x10\x00{'descr': junk}\n")
    with pytest.raises(ferry.FerryError) as direct:
        ferry.read(p)
    loader = torch.utils.data.DataLoader(_Failing(str(p)), batch_size=None, num_workers=1)
    with pytest.raises(ferry.FerryError) as ei:
        next(iter(loader))
    assert str(direct.value) in str(ei.value) and "worker" in str(ei.value)


def _formats_of_24(tmp_path):
    """A 24-long float64 variable in each format ferry parses in C."""
    a = np.arange(24, dtype="<f8")
    out = {}
    p = str(tmp_path / "a.npy")
    np.save(p, a)
    out["npy"] = (p, 0)
    try:
        from safetensors.numpy import save_file
        p = str(tmp_path / "a.safetensors")
        save_file({"a": a}, p)
        out["safetensors"] = (p, "a")
    except ImportError:
        pass
    try:
        import zarr
        p = str(tmp_path / "a.zarr")
        zarr.create_array(p, shape=(24,), chunks=(5,), dtype="<f8", zarr_format=3)[:] = a
        out["zarr"] = (p, 0)
    except ImportError:
        pass
    try:
        import scipy.io
        p = str(tmp_path / "a.nc")
        with scipy.io.netcdf_file(p, "w") as f:
            f.createDimension("x", 24)
            f.createVariable("a", "f8", ("x",))[:] = a
        out["netcdf3"] = (p, "a")
    except ImportError:
        pass
    return out


def test_c_api_refuses_a_selection_outside_the_variable(tmp_path):
    """ferry_dataset_plan_read of 0:721:1 on a 24-long axis is an error naming the
    variable and the axis, in every format (issue 38.13); it clipped and read
    24 elements, silently. Python's slices are clipped as numpy's before C."""
    for fmt, (p, var) in _formats_of_24(tmp_path).items():
        ds = _ferry.Dataset(None, p)
        dst = np.zeros(721)
        plan = _ferry.Plan()
        with pytest.raises(ferry.FerryError, match=r"dimension 0: selection 0:721:1 outside 0\.\.24") as ei:
            plan.read(ds, var, dst, [(0, 721, 1)], True)
        assert p in str(ei.value), (fmt, str(ei.value))
        got = np.zeros(24)
        assert plan.read(ds, var, got, [(0, 24, 1)], True) == 24 * 8
        assert ferry.read(p, None if fmt in ("npy", "zarr") else var, selection=(slice(0, 721),)).shape == (24,)
