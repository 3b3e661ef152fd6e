"""progress= on long reads, beyond checkpoints (issue 38 item 17): ferry.read, the xarray
backend's Dataset.load() and dataset epochs report through the one reporter checkpoints use
(ferry/_progress.py): a callable progress(done, total), True/"tqdm" (a bar, or log lines without
tqdm), off by default."""
import inspect
import logging
import sys

import numpy as np
import pytest

import ferry


def _calls():
    got = []
    return got, lambda done, total: got.append((done, total))


def _monotone_to(got, total):
    assert got[0] == (0, total) and got[-1] == (total, total), got
    assert [d for d, _ in got] == sorted(d for d, _ in got) and all(t == total for _, t in got)


def test_off_by_default_everywhere():
    assert inspect.signature(ferry.read).parameters["progress"].default is None
    torch = pytest.importorskip("torch")  # noqa: F841
    from ferry.torch import ArrayDataset, TokenDataset
    for f in (ArrayDataset.__init__, TokenDataset.__init__):
        assert inspect.signature(f).parameters["progress"].default is None
    pytest.importorskip("xarray")
    from ferry.xarray import FerryBackendEntrypoint
    assert inspect.signature(FerryBackendEntrypoint.open_dataset).parameters["progress"].default is None
    assert "progress" in FerryBackendEntrypoint.open_dataset_parameters


def test_read_reports_about_twenty_steps(tmp_path):
    p = str(tmp_path / "a.npy")
    a = np.arange(1000 * 7, dtype="<f4").reshape(1000, 7)
    np.save(p, a)
    got, cb = _calls()
    np.testing.assert_array_equal(ferry.read(p, progress=cb), a)
    _monotone_to(got, a.nbytes)
    assert 15 <= len(got) <= 22, got
    got.clear()                               # a selection with a step, into out=
    out = np.zeros((100, 3), "<f4")
    assert ferry.read(p, selection=(slice(5, 1000, 10), slice(2, 5)), out=out, progress=cb) is out
    np.testing.assert_array_equal(out, a[5:1000:10, 2:5])
    _monotone_to(got, out.nbytes)
    got.clear()                               # an indexed first axis: one step
    np.testing.assert_array_equal(ferry.read(p, selection=(3,), progress=cb), a[3])
    assert got == [(0, 28), (28, 28)]
    with pytest.raises(ValueError, match="ferry.read: progress must be"):
        ferry.read(p, progress="yes please")


def test_read_steps_are_whole_chunks(tmp_path):
    zarr = pytest.importorskip("zarr")
    p = str(tmp_path / "a.zarr")
    a = np.arange(400 * 5, dtype="<f8").reshape(400, 5)
    zarr.create_array(p, shape=a.shape, chunks=(30, 5), dtype="<f8", zarr_format=3)[:] = a
    got, cb = _calls()
    np.testing.assert_array_equal(ferry.read(p, progress=cb), a)
    _monotone_to(got, a.nbytes)
    rows = [d // (5 * 8) for d, _ in got]
    assert all(r % 30 == 0 for r in rows[:-1]) and rows[-1] == 400, rows    # cut at chunk edges


def test_xarray_load_reports(tmp_path):
    xr = pytest.importorskip("xarray")
    pytest.importorskip("scipy")
    p = tmp_path / "a.nc"
    ref = xr.Dataset({f"v{i}": (("t", "x"), np.random.default_rng(i).random((50, 40))) for i in range(30)})
    ref.to_netcdf(p, engine="scipy")
    got, cb = _calls()
    with xr.open_dataset(p, engine="ferry", progress=cb) as ds:
        ds.load()
        xr.testing.assert_identical(ds, ref)
    _monotone_to(got, 30 * 50 * 40 * 8)
    assert len(got) >= 10
    with pytest.raises(ValueError, match="progress"):
        xr.open_dataset(p, engine="ferry", progress=3)


def test_dataset_epochs_report_batches(tmp_path):
    pytest.importorskip("torch")
    from ferry.torch import ArrayDataset
    p = str(tmp_path / "r.npy")
    np.save(p, np.arange(100 * 4, dtype="f4").reshape(100, 4))
    got, cb = _calls()
    ds = ArrayDataset(p, batch_size=10, device="cpu", progress=cb)
    for _ in range(2):
        assert len(list(ds)) == 10
    assert got == [(k, 10) for k in range(1, 11)] * 2
    with pytest.raises(ValueError, match="ArrayDataset: progress must be"):
        ArrayDataset(p, device="cpu", progress=7)


def test_without_tqdm_a_few_log_lines(tmp_path, monkeypatch, caplog):
    """progress=True without tqdm: log lines (about 20, not one per batch) on the caller's logger."""
    pytest.importorskip("torch")
    from ferry.torch import ArrayDataset
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)        # import tqdm.auto fails
    p = str(tmp_path / "r.npy")
    np.save(p, np.arange(1000, dtype="f4").reshape(1000, 1))
    with caplog.at_level(logging.INFO, logger="ferry"):
        assert len(list(ArrayDataset(p, batch_size=2, device="cpu", progress=True))) == 500
    lines = [r.getMessage() for r in caplog.records if r.name == "ferry.torch"]
    assert any("tqdm is not installed" in m for m in lines) and lines[-1].endswith("500 of 500 batches")
    assert 15 <= len(lines) <= 25, len(lines)


def test_checkpoints_use_the_same_reporter():
    pytest.importorskip("torch")
    from ferry import _progress
    from ferry.checkpoint import run
    got, cb = _calls()
    run.reporter(cb, "save", 10)(4)
    assert got == [(4, 10)]
    with pytest.raises(ValueError, match="ferry.checkpoint: progress must be"):
        run.reporter("nope", "save", 10)
    assert "_progress" in run.reporter.__code__.co_names and _progress.reporter is not run.reporter
