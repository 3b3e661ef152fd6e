"""progress= for long saves and loads (off by default) and logging instead of silence
(issue 15 item 17)."""
import logging

import pytest

torch = pytest.importorskip("torch")

from ferry import checkpoint as ck  # noqa: E402


def _sd():
    return {"t%02d" % i: torch.full((1000 + 10 * i,), float(i)) for i in range(40)}


def test_progress_callback_save_and_load(tmp_path):
    sd = _sd()
    total = sum(t.numel() * 4 for t in sd.values())
    calls = []
    p = tmp_path / "p.safetensors"
    ck.save(sd, p, progress=lambda done, tot: calls.append((done, tot)))
    assert calls[0][0] == 0 and calls[-1][0] >= total and len(calls) >= 10
    assert all(t == calls[0][1] for _, t in calls) and calls[0][1] >= total
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)
    calls.clear()
    got = ck.load(p, progress=lambda done, tot: calls.append((done, tot)))
    assert all(torch.equal(got[k], sd[k]) for k in sd)
    assert calls[-1] == (total, total) and len(calls) >= 10
    calls.clear()
    tgt = {k: torch.zeros_like(v) for k, v in sd.items()}
    ck.load_into(tgt, p, progress=lambda d, t: calls.append(d))
    assert calls[-1] == total and all(torch.equal(tgt[k], sd[k]) for k in sd)
    # sharded, durable: the same bytes, fsynced once per file at the end
    calls.clear()
    ck.save(sd, tmp_path / "s.safetensors", max_shard_size=total // 3,
            progress=lambda d, t: calls.append(d))
    assert calls[-1] >= total
    assert all(torch.equal(ck.load(tmp_path / "s.safetensors")[k], sd[k]) for k in sd)
    ck.async_save(sd, tmp_path / "a.safetensors",
                  progress=lambda d, t: calls.append(("a", d))).result(timeout=60)
    assert calls[-1][0] == "a"


def test_progress_tqdm_and_bad_values(tmp_path, capsys):
    pytest.importorskip("tqdm")
    p = tmp_path / "q.safetensors"
    ck.save(_sd(), p, progress=True)
    ck.load(p, progress="tqdm")
    assert "save q.safetensors" in capsys.readouterr().err      # tqdm writes to stderr
    with pytest.raises(ValueError, match="progress"):
        ck.save(_sd(), p, progress="yes please")


def test_off_by_default_and_logged(tmp_path, caplog, capsys):
    p = tmp_path / "l.safetensors"
    with caplog.at_level(logging.INFO, logger="ferry.checkpoint"):
        ck.save(_sd(), p)
        ck.load(p)
    msgs = [r.getMessage() for r in caplog.records if r.name == "ferry.checkpoint"]
    assert any(m.startswith("save ") and "bytes in" in m and "GB/s" in m for m in msgs), msgs
    assert any(m.startswith("load ") and "bytes in" in m for m in msgs), msgs
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""                      # no progress unless asked
