"""consolidated= and group= of Zarr v3 stores follow what the C parser read
(Dataset.store_info, issue 10 item 2), not a second look at the files in
Python. Stores are written by xarray/zarr-python; each has an array added
after consolidating, so consolidated metadata is stale and the two ways of
listing a group give different variables: which one ferry read is visible."""
import shutil

import numpy as np
import pytest

xr = pytest.importorskip("xarray")
zarr = pytest.importorskip("zarr")

import ferry  # noqa: E402
from ferry import _ferry  # noqa: E402


def _store(p, consolidate_at):
    xr.Dataset({"a": (("x",), np.arange(5.0))}).to_zarr(p, mode="w", zarr_format=3, consolidated=False)
    xr.Dataset({"b": (("y",), np.arange(3.0))}).to_zarr(p, group="g1", mode="a", zarr_format=3,
                                                        consolidated=False)
    with pytest.warns(Warning):   # zarr: consolidated metadata is not in the v3 spec
        zarr.consolidate_metadata(str(p), path=consolidate_at)
    # an array added after, by copying one (writing through zarr would rewrite
    # g1/zarr.json): only the members' own documents know it
    shutil.copytree(p / "g1" / "b", p / "g1" / "late")


def _vars(p, engine, **kw):
    with xr.open_dataset(p, engine=engine, **kw) as d:
        return sorted(d.variables)


@pytest.mark.filterwarnings("ignore::Warning")
def test_group_below_a_consolidated_root_reads_the_root_listing_as_zarr_does(tmp_path):
    p = tmp_path / "root.zarr"
    _store(p, None)
    info = ferry.Dataset(ferry.default_context(), str(p), None, "g1").store_info
    assert info == {"zarr_format": 3, "consolidated": True, "is_array": False}
    # zarr's engine lists g1 from the root's (stale) consolidated metadata: so does ferry
    for c in (True, None):
        assert _vars(p, "ferry", group="g1", consolidated=c) == _vars(p, "zarr", group="g1", consolidated=c) \
            == ["b"]
    assert _vars(p, "zarr", group="g1", consolidated=False) == ["b", "late"]
    with pytest.raises(ferry.FerryError, match="cannot ignore it"):
        xr.open_dataset(p, engine="ferry", group="g1", consolidated=False)


@pytest.mark.filterwarnings("ignore::Warning")
def test_group_with_its_own_consolidated_metadata_refuses_consolidated_false(tmp_path):
    # Python used to look for consolidated metadata at the root only: here it found
    # none and accepted consolidated=False, while the parser read g1's own stale
    # listing, so "late" was silently missing
    p = tmp_path / "group.zarr"
    _store(p, "g1")
    assert ferry.Dataset(ferry.default_context(), str(p), None, "g1").store_info["consolidated"]
    assert not ferry.Dataset(ferry.default_context(), str(p), None, None).store_info["consolidated"]
    with pytest.raises(ferry.FerryError, match="cannot ignore it") as ei:
        xr.open_dataset(p, engine="ferry", group="g1", consolidated=False)
    assert ei.value.args[0] == _ferry.EUNSUPPORTED
    assert _vars(p, "ferry", group="g1", consolidated=True) == ["b"]
    assert _vars(p, "ferry", consolidated=False) == _vars(p, "zarr", consolidated=False) == ["a"]
    with pytest.raises(ferry.FerryError, match="no consolidated metadata"):
        xr.open_dataset(p, engine="ferry", consolidated=True)


def test_store_info_of_arrays_and_other_formats(tmp_path):
    for zf in (2, 3):
        a = zarr.create_array(str(tmp_path / f"a{zf}.zarr"), shape=(4,), dtype="i4", zarr_format=zf)
        a[:] = np.arange(4)
        info = ferry.Dataset(ferry.default_context(), str(tmp_path / f"a{zf}.zarr")).store_info
        assert info == {"zarr_format": zf, "consolidated": False, "is_array": True}
    np.save(tmp_path / "x.npy", np.arange(3))
    assert ferry.Dataset(ferry.default_context(), str(tmp_path / "x.npy")).store_info == \
        {"zarr_format": 0, "consolidated": False, "is_array": False}


@pytest.mark.parametrize("fill, want", [("0x3f800000", 1.0), ("NaN", np.nan), ("-Infinity", -np.inf), (2.5, 2.5)])
def test_zarr_v3_fill_value_is_the_parsers(tmp_path, fill, want):
    """encoding["fill_value"] is the fill element the C parser decoded (Dataset.fill),
    equal to zarr's engine: Python used to decode the JSON again and gave None for
    the hex bit pattern v3 allows ("0x3f800000" is 1.0f), while absent chunks were
    filled with 1.0."""
    import json
    p = tmp_path / "h.zarr"
    g = zarr.create_group(str(p), zarr_format=3)
    a = g.create_array("v", shape=(8,), chunks=(4,), dtype="f4", fill_value=0.0, dimension_names=["x"])
    a[:4] = np.arange(4)
    m = json.loads((p / "v" / "zarr.json").read_text())
    m["fill_value"] = fill
    (p / "v" / "zarr.json").write_text(json.dumps(m))
    ref = xr.open_dataset(p, engine="zarr", consolidated=False)["v"]
    got = xr.open_dataset(p, engine="ferry")["v"]
    fv = got.encoding["fill_value"]
    assert fv.dtype == ref.encoding["fill_value"].dtype == np.float32
    np.testing.assert_array_equal(fv, ref.encoding["fill_value"])
    np.testing.assert_array_equal(fv, np.float32(want))
    np.testing.assert_array_equal(got.values, ref.values)
