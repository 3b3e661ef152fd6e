"""ferry.FerryError keeps its message and attributes through str(), pickling
and torch's DataLoader, which re-raises a worker's exception in the main
process as type(e)(text)."""
import os
import pickle
import subprocess
import sys

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


def test_a_file_of_another_kind_is_named_as_what_it_is(tmp_path):
    """A file that is not the format asked for (by its name or format=) is named
    as what it is, with what reads it, by one C sniffer on every reader's error
    path (issue 38.5): never "safetensors header length 578712552184433488"."""
    import gzip
    import io
    import zipfile
    npy = io.BytesIO()
    np.save(npy, np.arange(10.0))
    cases = []
    p = str(tmp_path / "model.safetensors")     # torch.save's zip layout: <stem>/data.pkl first
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("model/data.pkl", b"\x80\x02}q\x00.")
        z.writestr("model/byteorder", b"little")
    cases.append((p, None, "a torch.save zip archive, not safetensors", "torch.load"))
    p = str(tmp_path / "text.npy")
    with open(p, "w") as f:
        f.write("time,value\n0,1.5\n1,2.5\n")
    cases.append((p, None, "plain text, not npy", "not an array file"))
    p = str(tmp_path / "data.nc")
    with open(p, "wb") as f:
        f.write(gzip.compress(npy.getvalue()))
    cases.append((p, None, "gzip-compressed data, not netcdf3", "decompress it"))
    p = str(tmp_path / "table.npy")
    with open(p, "wb") as f:
        f.write(b"PAR1" + bytes(64) + b"PAR1")
    cases.append((p, None, "a Parquet file, not npy", "pyarrow"))
    p = str(tmp_path / "h5.bin")
    with open(p, "wb") as f:
        f.write(b"\x89HDF\r\n\x1a\n" + bytes(100))
    cases.append((p, "npy", "an HDF5 / netCDF-4 file, not npy", "engine=\"ferry\""))
    for path, fmt, what, todo in cases:
        with pytest.raises(ferry.FerryError) as ei:
            if fmt:
                ferry.open(path, format=fmt)
            else:
                ferry.read(path)
        msg = str(ei.value)
        assert msg.startswith(path) and what in msg and todo in msg, msg
        assert "header length" not in msg and "bad magic" not in msg, msg
    # the same file under its own format's name is still that format's damage
    p = str(tmp_path / "cut.npy")
    with open(p, "wb") as f:
        f.write(npy.getvalue()[:40])
    with pytest.raises(ferry.FerryError, match="npy") as ei:
        ferry.read(p)
    assert "plain text" not in str(ei.value)


# --------------------------------------------------------------------------- no GPU (issue 38.11)
ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def _stand_in_driver():
    """build/cudasim/libcuda.so.1, the stand-in driver (tests/cudasim), built if missing."""
    lib = os.path.join(ROOT, "build", "cudasim", "libcuda.so.1")
    if not os.path.exists(lib):
        r = subprocess.run(["make", "-C", ROOT, "build/cudasim/libcuda.so.1"], capture_output=True)
        if r.returncode != 0 or not os.path.exists(lib):
            pytest.skip("the stand-in driver (tests/cudasim) cannot be built here")
    return os.path.dirname(os.path.abspath(lib))


def _run_with_driver(code, **env):
    """code in a fresh interpreter whose libcuda.so.1 is the stand-in's (no cupy: its runtime
    would look for a real driver); returns its stdout, asserting it succeeded."""
    e = dict(os.environ, LD_LIBRARY_PATH=_stand_in_driver(), FERRY_CUFILE="off",
             PYTHONPATH=os.path.join(ROOT, "python"), **env)
    r = subprocess.run([sys.executable, "-c", "import sys; sys.modules['cupy'] = None\n" + code],
                       env=e, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


NO_GPU_CODE = """
import numpy as np, ferry
np.save({p!r}, np.arange(6.0))
for dev in (0, "cuda", "cuda:1"):
    try:
        ferry.read({p!r}, device=dev)
        print("read", dev)
    except ferry.FerryError as e:
        print("ERR", e.code == ferry._ferry.ENOCUDA, e)
try:
    ferry.empty(4, device=0)
except ferry.FerryError as e:
    print("ERR", e.code == ferry._ferry.ENOCUDA, e)
"""


def test_a_gpu_device_on_a_driver_without_devices_says_so(tmp_path):
    """device=0 / "cuda" where the driver finds no GPU: one FerryError saying so and that
    device="cpu" reads to host memory, raised where device memory is first asked for."""
    p = str(tmp_path / "a.npy")
    out = _run_with_driver(NO_GPU_CODE.format(p=p), FERRY_CUDASIM_DEVICES="0").splitlines()
    assert len(out) == 4 and all(line.startswith("ERR True") for line in out), out
    assert all("no usable GPU was found" in line and 'device="cpu" reads to host memory' in line for line in out)
    assert p in out[0] and "ferry.empty" in out[3]


def test_a_gpu_device_on_the_stand_in_driver_works(tmp_path):
    """The same calls on the stand-in driver with its two devices read, and an ordinal past
    them names how many there are."""
    p = str(tmp_path / "a.npy")
    code = NO_GPU_CODE.format(p=p) + f"""
a = ferry.read({p!r}, device=1)
h = np.zeros(6)
ferry.default_context().memcpy(h, a)
print("values", h.tolist() == list(range(6)))
try:
    ferry.read({p!r}, device=5)
except ferry.FerryError as e:
    print("ERR5", e)
"""
    out = _run_with_driver(code).splitlines()
    assert out[:4] == ["read 0", "read cuda", "read cuda:1", "values True"], out   # ferry.empty too
    assert "this machine has 2 GPUs (0..1)" in out[4] and 'device="cpu"' in out[4], out


def test_a_host_failure_is_not_blamed_on_the_gpu():
    """The no-GPU answer is for GPU devices only: a host allocation's own error stays."""
    with pytest.raises(ValueError, match="negative dimension"):
        ferry.empty(-1)
    from ferry._nogpu import no_gpu
    assert no_gpu("x", "cpu") is None and no_gpu("x", -1) is None


def _no_driver_calls(calls):
    for call in calls:
        with pytest.raises(ferry.FerryError, match="no usable GPU was found") as ei:
            call()
        assert 'device="cpu" reads to host memory' in str(ei.value) and ei.value.code == _ferry.ENOCUDA
        assert "Found no NVIDIA driver" not in str(ei.value)


def test_no_driver_at_all_in_torch_datasets_and_checkpoints(tmp_path):
    """Without any CUDA driver (this machine's own state; skipped where there is one): the torch
    datasets and checkpoint loads say no GPU was found, not torch's "Found no NVIDIA driver"."""
    if ferry.default_context().cuda_device_count() > 0:
        pytest.skip("a CUDA driver is installed here")
    torch = pytest.importorskip("torch")
    import ferry.checkpoint as ck
    from ferry.torch import ArrayDataset
    p, s = str(tmp_path / "a.npy"), str(tmp_path / "m.safetensors")
    np.save(p, np.arange(8.0).reshape(4, 2))
    ck.save({"w": torch.ones(2)}, s)
    _no_driver_calls([lambda: next(iter(ArrayDataset(p, batch_size=2, device="cuda"))),
                      lambda: ck.load(s, device="cuda:0")])


def test_no_driver_at_all_in_ferry_read_and_the_xarray_backend(tmp_path):
    """ferry.read says no GPU was found; lazily opening with device=0 stays legal."""
    if ferry.default_context().cuda_device_count() > 0:
        pytest.skip("a CUDA driver is installed here")
    p = str(tmp_path / "a.npy")
    np.save(p, np.arange(8.0).reshape(4, 2))
    _no_driver_calls([lambda: ferry.read(p, device="cuda")])
    with ferry.open(p, device=0) as f:                   # metadata only: no GPU asked for yet
        assert [v.shape for v in f.variables.values()] == [(4, 2)]
    try:
        import xarray as xr
        import scipy  # noqa: F401
    except ImportError:
        return
    if ferry._cupy() is None:      # engine="ferry" with device=0 needs cupy: said, and the GPU it lacks
        nc = str(tmp_path / "a.nc")
        xr.Dataset({"t": ("x", np.arange(3.0))}).to_netcdf(nc, engine="scipy")
        with pytest.raises(ImportError, match="install cupy.*no usable GPU was found"):
            xr.open_dataset(nc, engine="ferry", device=0)


# --------------------------------------------------------------------------- docs/errors.md
from error_cases import CASES, message  # noqa: E402  (tests/python is on pytest's path)


@pytest.mark.parametrize("case", CASES, ids=[c.call.__name__.strip("_") + ("_torch" if "torch" in c.needs else "")
                                            for c in CASES])
def test_common_mistake(case, tmp_path):
    """Each row of docs/errors.md: the exception, the message naming what went wrong, the hint."""
    import importlib.util
    import re
    for m in case.needs:
        if importlib.util.find_spec(m) is None:
            pytest.skip(f"needs {m}")
    kind, msg = message(case, str(tmp_path))
    assert kind == case.raises and re.search(case.match, msg), (kind, msg)
    assert str(tmp_path) not in msg


def test_docs_errors_table_is_current_with_torch_cases():
    """docs/errors.md is what tools/errors_table.py writes from error_cases.py today (some cases
    import torch: the name keeps it out of the ASan subset, tools/asan-pytest.sh)."""
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "errors_table.py"), "--check"],
                       capture_output=True, text=True, timeout=300)
    if r.returncode == 2:
        pytest.skip(r.stderr.strip())
    assert r.returncode == 0, r.stderr
