"""What users pass to xarray's engines, passed to engine="ferry": one default
device (the CPU, as every engine returns numpy), lock=, storage_options=,
consolidated= for Zarr, pathlib.Path, bytes and non-UTF-8 paths, file:// URLs,
fsspec mappers and zarr stores of local directories, remote URLs refused with a
FerryError, load_async(). Values checked against engine="netcdf4"/"h5netcdf"/
"zarr" on files they write here."""
import asyncio
import inspect
import os
import pathlib
import threading

import numpy as np
import pytest
from optional import has

import ferry

xr = pytest.importorskip("xarray")
import ferry  # noqa: E402
from ferry import xarray as fx  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning", "ignore::RuntimeWarning")


NC4 = "netcdf4" if has("netCDF4") else "h5netcdf"


def make_ds(seed=0):
    rng = np.random.default_rng(seed)
    return xr.Dataset({"t": (("time", "x"), rng.standard_normal((6, 5)).astype("f4")),
                       "n": (("x",), np.arange(5, dtype="i2"))},
                      coords={"time": np.arange(6.0), "x": np.arange(5) * 10})


@pytest.fixture
def nc4(tmp_path):
    if not (has("netCDF4") or has("h5netcdf")):
        pytest.skip("no netCDF-4 writer")
    p = tmp_path / "a.nc"
    make_ds().to_netcdf(p, engine=NC4, encoding={"t": {"zlib": True, "chunksizes": (2, 5)}})
    return p


def ref_of(p, engine=NC4, **kw):
    return xr.open_dataset(p, engine=engine, **kw).load()


# ---------------------------------------------------------------------------
# issue 15 item 8: one default device
# ---------------------------------------------------------------------------
def test_one_default_device_cpu(nc4):
    ep = inspect.signature(fx.FerryBackendEntrypoint.open_dataset).parameters["device"].default
    mf = inspect.signature(fx.open_mfdataset).parameters["device"].default
    assert ep == mf == "cpu"
    pytest.importorskip("dask")
    got = fx.open_mfdataset([nc4], combine="by_coords")       # no device: numpy, as with open_dataset
    assert type(got["t"].data.compute()) is np.ndarray
    xr.testing.assert_identical(got.compute(), ref_of(nc4))
    xr.testing.assert_identical(xr.open_dataset(nc4, engine="ferry").load(), ref_of(nc4))


# ---------------------------------------------------------------------------
# issue 15 item 9: what other engines accept
# ---------------------------------------------------------------------------
class CountingLock:
    def __init__(self):
        self._lock = threading.Lock()
        self.count = 0

    def acquire(self, *a, **k):
        self.count += 1
        return self._lock.acquire(*a, **k)

    def release(self):
        self._lock.release()

    __enter__ = acquire

    def __exit__(self, *exc):
        self.release()


def test_lock_is_held_around_reads(nc4):
    lock = CountingLock()
    got = xr.open_dataset(nc4, engine="ferry", lock=lock).load()
    assert lock.count >= 1
    xr.testing.assert_identical(got, ref_of(nc4))
    for lk in (None, False, threading.Lock()):
        xr.testing.assert_identical(xr.open_dataset(nc4, engine="ferry", lock=lk).load(), ref_of(nc4))


def test_paths_pathlib_bytes_file_url(nc4, tmp_path):
    ref = ref_of(nc4)
    for p in (pathlib.Path(nc4), str(nc4), os.fsencode(str(nc4)), pathlib.Path(nc4).as_uri(),
              "file://localhost" + str(nc4)):
        xr.testing.assert_identical(xr.open_dataset(p, engine="ferry", storage_options={}).load(), ref)
    spaced = tmp_path / "a b%.nc"
    os.link(nc4, spaced)
    xr.testing.assert_identical(xr.open_dataset(spaced.as_uri(), engine="ferry").load(), ref)


@pytest.mark.skipif(os.uname().sysname != "Linux", reason="file names are bytes on Linux")
def test_non_utf8_path(nc4, tmp_path):
    raw = os.path.join(os.fsencode(str(tmp_path)), b"caf\xe9-\xff.nc")
    with open(nc4, "rb") as src, open(raw, "wb") as dst:
        dst.write(src.read())
    ref = ref_of(nc4)
    for p in (raw, os.fsdecode(raw)):
        xr.testing.assert_identical(xr.open_dataset(p, engine="ferry").load(), ref)
    if has("scipy"):
        raw3 = os.path.join(os.fsencode(str(tmp_path)), b"\xfe3.nc")
        make_ds(3).to_netcdf(os.fsdecode(raw3), engine="scipy")
        xr.testing.assert_identical(xr.open_dataset(raw3, engine="ferry").load(),
                                    ref_of(os.fsdecode(raw3), engine="scipy"))


@pytest.mark.parametrize("url", ["simplecache::s3://bucket/a.nc", "file://otherhost/tmp/a.nc", "ftp://host/a.nc"])
def test_other_urls_refused(url, tmp_path, monkeypatch):
    # s3://, gs://, http(s):// are read by the C library (tests/python/test_remote_zarr.py);
    # any other scheme is refused, and never becomes a local path
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ferry.FerryError, match="ferry reads local files and s3://"):
        xr.open_dataset(url, engine="ferry", storage_options={"anon": True})
    assert os.listdir(tmp_path) == []          # never became a local path


def test_fsspec_mappers(tmp_path):
    fsspec = pytest.importorskip("fsspec")
    pytest.importorskip("zarr")
    p = tmp_path / "s.zarr"
    make_ds(1).to_zarr(p, zarr_format=2, mode="w", consolidated=True)
    ref = ref_of(p, engine="zarr")
    xr.testing.assert_identical(xr.open_dataset(fsspec.get_mapper(str(p)), engine="ferry").load(), ref)
    xr.testing.assert_identical(xr.open_dataset(fsspec.get_mapper(p.as_uri()), engine="ferry").load(), ref)
    mem = fsspec.get_mapper("memory://x.zarr")
    with pytest.raises(ferry.FerryError, match="not memory://"):
        xr.open_dataset(mem, engine="ferry")


def test_zarr_store_objects(tmp_path):
    zarr = pytest.importorskip("zarr")
    p = tmp_path / "v3.zarr"
    make_ds(2).to_zarr(p, zarr_format=3, mode="w", consolidated=False)
    ref = ref_of(p, engine="zarr", consolidated=False)
    stores = []
    if hasattr(zarr.storage, "LocalStore"):
        stores.append(zarr.storage.LocalStore(str(p)))
    if hasattr(zarr.storage, "DirectoryStore"):
        stores.append(zarr.storage.DirectoryStore(str(p)))
    assert stores
    for st in stores:
        xr.testing.assert_identical(xr.open_dataset(st, engine="ferry").load(), ref)
    if hasattr(zarr.storage, "FsspecStore"):
        pytest.importorskip("fsspec")
        try:
            remote = zarr.storage.FsspecStore.from_url("memory://y.zarr")
        except Exception:  # noqa: BLE001 — this zarr/fsspec pair cannot make one
            return
        with pytest.raises(ferry.FerryError, match="not memory://"):
            xr.open_dataset(remote, engine="ferry")


def test_consolidated(tmp_path):
    pytest.importorskip("zarr")
    c = tmp_path / "c.zarr"
    u = tmp_path / "u.zarr"
    make_ds(4).to_zarr(c, zarr_format=2, mode="w", consolidated=True)
    make_ds(4).to_zarr(u, zarr_format=3, mode="w", consolidated=False)
    ref = ref_of(c, engine="zarr", consolidated=True)
    xr.testing.assert_identical(xr.open_dataset(c, engine="ferry", consolidated=True).load(), ref)
    xr.testing.assert_identical(xr.open_dataset(u, engine="ferry", consolidated=False).load(),
                                ref_of(u, engine="zarr", consolidated=False))
    with pytest.raises(ferry.FerryError, match="no consolidated metadata"):
        xr.open_dataset(u, engine="ferry", consolidated=True)
    with pytest.raises(ferry.FerryError, match="consolidated=False"):
        xr.open_dataset(c, engine="ferry", consolidated=False)


def test_load_async(nc4):
    ref = ref_of(nc4)

    async def main():
        ds = xr.open_dataset(nc4, engine="ferry")
        sub = xr.open_dataset(nc4, engine="ferry")["t"].isel(time=[1, 4], x=slice(1, 4))
        return await asyncio.gather(ds.load_async(), sub.load_async())
    full, part = asyncio.run(main())
    xr.testing.assert_identical(full, ref)
    xr.testing.assert_identical(part, ref["t"].isel(time=[1, 4], x=slice(1, 4)))


# ---------------------------------------------------------------------------
# issue 16 item 6: a name that is not UTF-8 does not make the store unreadable
# ---------------------------------------------------------------------------
@pytest.mark.skipif(os.uname().sysname != "Linux", reason="file names are bytes on Linux")
@pytest.mark.parametrize("zarr_format", [2, 3])
def test_zarr_member_named_not_utf8(tmp_path, zarr_format):
    pytest.importorskip("zarr")
    p = tmp_path / "n.zarr"
    ds = make_ds(5)
    ds["b"] = ds["t"] * 2
    ds.to_zarr(p, zarr_format=zarr_format, mode="w", consolidated=False)
    os.rename(os.path.join(os.fsencode(str(p)), b"b"), os.path.join(os.fsencode(str(p)), b"b\xff"))
    ref = ref_of(p, engine="zarr", consolidated=False)
    assert "b\udcff" in ref.variables                 # zarr-python reads it, named with surrogateescape
    # Zarr keys are strings: ferry's parser refuses the store with an error naming it and the
    # member, never a UnicodeDecodeError (and never a store missing a variable)
    with pytest.raises(ferry.FerryError, match=r"n\.zarr: member .*not valid UTF-8"):
        xr.open_dataset(p, engine="ferry").load()


@pytest.mark.skipif(os.uname().sysname != "Linux", reason="file names are bytes on Linux")
def test_zarr_store_at_non_utf8_path(tmp_path):
    pytest.importorskip("zarr")
    raw = os.path.join(os.fsencode(str(tmp_path)), b"st\xff.zarr")
    make_ds(6).to_zarr(os.fsdecode(raw), zarr_format=3, mode="w", consolidated=False)
    ref = ref_of(os.fsdecode(raw), engine="zarr", consolidated=False)
    for p in (raw, os.fsdecode(raw)):
        xr.testing.assert_identical(xr.open_dataset(p, engine="ferry").load(), ref)
