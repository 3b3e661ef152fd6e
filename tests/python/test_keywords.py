"""One word per idea across the Python APIs (docs/python-extension.md, "Defaults and keywords"):
the I/O route is path_policy= (the xarray backend's old path= works, with a DeprecationWarning),
every dataset's shuffle default is False (TokenDataset's True stays one release, warned), and
device defaults to "cpu" everywhere except the torch datasets (None: the GPU when there is one)."""
import inspect
import warnings

import numpy as np
import pytest

import ferry


def _default(f, name):
    return inspect.signature(f).parameters[name].default


def test_device_defaults():
    for f in (ferry.read, ferry.read_many, ferry.open, ferry.empty):
        assert _default(f, "device") == "cpu", f
    torch = pytest.importorskip("torch")  # noqa: F841
    from ferry.torch import ArrayDataset, ImageDataset, TokenDataset
    for cls in (ArrayDataset, ImageDataset, TokenDataset):
        assert _default(cls.__init__, "device") is None, cls


def test_device_defaults_xarray():
    pytest.importorskip("xarray")
    from ferry.xarray import FerryBackendEntrypoint, FerryStore, open_mfdataset
    assert _default(FerryBackendEntrypoint.open_dataset, "device") == "cpu"
    assert _default(FerryStore.__init__, "device") == "cpu"
    assert _default(open_mfdataset, "device") == "cpu"
    pytest.importorskip("torch")
    from ferry.torch import XarrayDataset
    assert _default(XarrayDataset.__init__, "device") is None


def test_the_route_keyword_is_path_policy():
    assert "path_policy" in inspect.signature(ferry.read).parameters
    assert "path_policy" in inspect.signature(ferry.read_many).parameters


@pytest.fixture
def nc3(tmp_path):
    xr = pytest.importorskip("xarray")
    pytest.importorskip("scipy")
    p = tmp_path / "a.nc"
    xr.Dataset({"t": (("x",), np.arange(6.0, dtype="f4"))}).to_netcdf(p, engine="scipy")
    return xr, p


def test_xarray_path_policy_and_the_old_path_keyword(nc3):
    xr, p = nc3
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)       # the new name: no warning
        new = xr.open_dataset(p, engine="ferry", path_policy="host")
        np.testing.assert_array_equal(new["t"].values, np.arange(6.0, dtype="f4"))
    with pytest.warns(DeprecationWarning, match="path_policy") as rec:
        old = xr.open_dataset(p, engine="ferry", path="host")
    # the user's line, past xarray's frames: shown by Python's default filters in __main__
    assert [w.filename for w in rec if w.category is DeprecationWarning] == [__file__]
    np.testing.assert_array_equal(old["t"].values, new["t"].values)
    with pytest.raises(TypeError, match="path_policy"):
        xr.open_dataset(p, engine="ferry", path="host", path_policy="host")
    from ferry.xarray import FerryStore
    with pytest.warns(DeprecationWarning, match="path_policy"):
        s = FerryStore(str(p), path="host")
    assert s.path_policy == "host"
    s.close()
    with pytest.warns(DeprecationWarning, match="path_policy"):
        dt = xr.open_datatree(p, engine="ferry", path="host")
    np.testing.assert_array_equal(dt["t"].values, new["t"].values)


def test_a_store_keeps_its_route_through_pickle(nc3):
    import pickle
    _, p = nc3
    from ferry.xarray import FerryStore
    s = FerryStore(str(p), path_policy="host")
    assert pickle.loads(pickle.dumps(s)).path_policy == "host"
    s.close()


def _tokens(tmp_path):
    p = tmp_path / "t.bin"
    np.arange(4096, dtype="<u2").tofile(p)
    return str(p)


def test_token_dataset_shuffle_default_is_warned(tmp_path):
    pytest.importorskip("torch")
    from ferry.torch import TokenDataset
    p = _tokens(tmp_path)
    with pytest.warns(DeprecationWarning, match="shuffle") as rec:
        ds = TokenDataset(p, 16, 4, device="cpu", seed=3)
    assert [w.filename for w in rec if w.category is DeprecationWarning] == [__file__]
    assert ds.shuffle is True                                    # the old default, this release
    want = [x.clone() for x, _ in TokenDataset(p, 16, 4, device="cpu", seed=3, shuffle=True)]
    got = [x.clone() for x, _ in ds]
    assert len(got) == len(want) and all((a == b).all() for a, b in zip(got, want))
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)       # an explicit shuffle: no warning
        TokenDataset(p, 16, 4, device="cpu", shuffle=False)
        TokenDataset(p, 16, 4, device="cpu", shuffle=True)


def test_array_datasets_do_not_shuffle_by_default():
    pytest.importorskip("torch")
    from ferry.torch import ArrayDataset, ImageDataset
    assert _default(ArrayDataset.__init__, "shuffle") is False
    assert _default(ImageDataset.__init__, "shuffle") is False
    # the casting words are ArrayDataset's: normalize=(mean, std) and a torch dtype
    for word in ("normalize", "dtype", "transform", "prefetch", "block_size"):
        assert word in inspect.signature(ImageDataset.__init__).parameters, word
    pytest.importorskip("xarray")
    from ferry.torch import XarrayDataset
    assert _default(XarrayDataset.__init__, "shuffle") is False
