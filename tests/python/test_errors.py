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


def test_group_of_a_classic_netcdf_file_is_no_group(tmp_path):
    """xr.open_dataset(classic.nc, group="nope") raised nothing and returned the root (issue 38
    item 8): a file without groups has only its root, as netCDF4 answers for a netCDF-4 file."""
    xr = pytest.importorskip("xarray")
    pytest.importorskip("scipy")
    p = tmp_path / "classic.nc"
    xr.Dataset({"t": ("x", np.arange(4.0))}).to_netcdf(p, engine="scipy")
    with pytest.raises(ferry.FerryError, match="no group \"nope\"") as ei:
        xr.open_dataset(p, engine="ferry", group="nope")
    assert str(p) in str(ei.value) and ei.value.code == _ferry.ENOTFOUND
    with xr.open_dataset(p, engine="ferry", group="/") as ds:   # the root, named
        np.testing.assert_array_equal(ds["t"].values, np.arange(4.0))
    for fmt, write in (("npy", lambda q: np.save(q, np.zeros(3))),):
        q = tmp_path / f"a.{fmt}"
        write(q)
        with pytest.raises(ferry.FerryError, match="no group"):
            ferry.Dataset(ferry.default_context(), str(q), None, "g")
