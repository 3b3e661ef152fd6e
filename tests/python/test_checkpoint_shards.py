"""Sharded saves are atomic as a set (issue 16 item 11) under Hugging Face's fixed shard names
(issue 38 item 3): the index is switched last and the previous set is kept as hard links
until then, so a save killed at any point leaves the previous set loadable -- never old and
new shards that load together. Dead writers' temporaries are reclaimed (issue 36 item 4)."""
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

import ferry  # noqa: E402
from ferry import checkpoint as ck  # noqa: E402
from ferry.checkpoint import FerryError  # noqa: E402

PYDIR = os.path.dirname(os.path.dirname(os.path.abspath(ferry.__file__)))
NT = 12


def version(v):
    return {"t%02d" % i: torch.full((4096,), float(v * 100 + i)) for i in range(NT)}


# The saver renames files with os.replace; the kill lands right after the k-th rename
# (k = 1: the first shard is in place, the others and the index are not).
SAVER = textwrap.dedent("""
    import os, signal, sys, torch
    sys.path.insert(0, %(pydir)r)
    from ferry import checkpoint as ck
    path, k, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    sd = {"t%%02d" %% i: torch.full((4096,), float(200 + i)) for i in range(%(nt)d)}
    if mode == "rename":
        real, n = os.replace, [0]
        def replace(a, b):
            real(a, b)
            n[0] += 1
            if n[0] == k:
                os.kill(os.getpid(), signal.SIGKILL)
        os.replace = replace
        ck.save(sd, path, max_shard_size=4 * 4096 * 3)
    else:
        print("ready", flush=True)
        while True:
            ck.save(sd, path, max_shard_size=4 * 4096 * 3)
            sd = {n: t + 100 for n, t in sd.items()}
""")


def check_one_version(path):
    got = ck.load(path)
    assert sorted(got) == sorted(version(0))
    vs = set()
    for n, t in got.items():
        v0 = float(t[0])
        assert bool((t == v0).all()), n
        vs.add(round(v0 - int(n[1:])))
    assert len(vs) == 1, "tensors of several saves load together: %s" % sorted(vs)
    return vs.pop()


def _saver(tmp_path, path, k, mode):
    script = tmp_path / "saver.py"
    script.write_text(SAVER % {"pydir": PYDIR, "nt": NT})
    return subprocess.Popen([sys.executable, str(script), str(path), str(k), mode],
                            stdout=subprocess.PIPE)


def test_kill_after_each_rename_leaves_old_set(tmp_path):
    path = tmp_path / "model.safetensors"
    ck.save(version(1), path, max_shard_size=4 * 4096 * 3)    # 4 shards + index
    assert check_one_version(path) == 100
    for k in (1, 4):                 # after the first shard, after the last shard
        proc = _saver(tmp_path, path, k, "rename")
        proc.wait(timeout=60)
        proc.stdout.close()
        assert proc.returncode == -signal.SIGKILL
        assert check_one_version(path) == 100, "killed after rename %d" % k
    proc = _saver(tmp_path, path, 5, "rename")                # after the index: new set
    proc.wait(timeout=60)
    proc.stdout.close()
    assert check_one_version(path) == 200
    # a later save reclaims nothing it still needs, and loads
    ck.save(version(3), path, max_shard_size=4 * 4096 * 3)
    assert check_one_version(path) == 300


def test_random_kills_during_sharded_saves(tmp_path):
    path = tmp_path / "model.safetensors"
    ck.save(version(1), path, max_shard_size=4 * 4096 * 3)
    rng = random.Random(5)
    for trial in range(2):
        proc = _saver(tmp_path, path, 0, "loop")
        try:
            assert proc.stdout.readline().strip() == b"ready"
            time.sleep(rng.uniform(0.05, 0.5))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            proc.stdout.close()
        check_one_version(path)


def test_index_first_files_then_single_save(tmp_path):
    path = tmp_path / "m.safetensors"
    ck.save(version(1), path, max_shard_size=4 * 4096 * 3)
    names = sorted(os.listdir(tmp_path))
    assert "m.safetensors.index.json" in names and "m.safetensors" not in names
    ck.save(version(2), path, max_shard_size=4 * 4096 * 3)
    assert len([n for n in os.listdir(tmp_path) if n.endswith(".safetensors")]) == 4
    ck.save(version(4), path)                                  # back to one file
    assert sorted(os.listdir(tmp_path)) == ["m.safetensors"]
    assert check_one_version(path) == 400
    with pytest.raises(FerryError):
        ck.load(tmp_path / "gone.safetensors")


# ------------------------------------------------ dead writers' temporaries (issue 36 item 4)
def _dead_pid():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_next_save_reclaims_every_dead_writers_temporary(tmp_path):
    path = tmp_path / "model.safetensors"
    ck.save(version(1), path, max_shard_size=4 * 4096 * 3)
    host, tag = ck._io._HOST, ck._io.TMP_TAG
    dead, live = _dead_pid(), os.getppid()
    names = {
        # shards of earlier killed saves: tokens no later save will use again
        ".model-0123456789ab-00002-of-00004.safetensors%s%s.%d.aaaaaaaaaaaa" % (tag, host, dead):
            False,
        ".model-ba9876543210-00004-of-00004.safetensors%s%s.%d.bbbbbbbbbbbb" % (tag, host, dead):
            False,
        ".model.safetensors.index.json%s%s.%d.cccccccccccc" % (tag, host, dead): False,
        ".other.bin%s%s.%d.dddddddddddd" % (tag, host, dead): False,
        # a save in progress on this host, a fresh one from another host: kept
        ".model-00aa00aa00aa-00001-of-00004.safetensors%s%s.%d.eeeeeeeeeeee" % (tag, host, live):
            True,
        ".model-11bb11bb11bb-00001-of-00004.safetensors%sotherhost.%d.ffffffffffff" % (tag, 4242):
            True,
        # from another host, untouched for two hours: its writer is gone
        ".model-22cc22cc22cc-00001-of-00004.safetensors%sotherhost.%d.999999999999" % (tag, 4243):
            False,
    }
    for n in names:
        (tmp_path / n).write_bytes(b"x" * 100)
    old = time.time() - 7200
    os.utime(tmp_path / [n for n in names if n.endswith("999999999999")][0], (old, old))
    ck.save(version(2), path, max_shard_size=4 * 4096 * 3)
    left = set(n for n in os.listdir(tmp_path) if tag in n)
    assert left == set(n for n, keep in names.items() if keep), left
    assert check_one_version(path) == 200
    ck.save(version(3), path)                                  # the single-file save too
    assert set(n for n in os.listdir(tmp_path) if tag in n) == left


def test_kills_during_sharded_saves_leave_no_temporaries_behind(tmp_path):
    path = tmp_path / "model.safetensors"
    ck.save(version(1), path, max_shard_size=4 * 4096 * 3)
    rng = random.Random(7)
    for trial in range(4):
        proc = _saver(tmp_path, path, 0, "loop")
        try:
            assert proc.stdout.readline().strip() == b"ready"
            time.sleep(rng.uniform(0.05, 0.4))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            proc.stdout.close()
    ck.save(version(2), path, max_shard_size=4 * 4096 * 3)
    assert [n for n in os.listdir(tmp_path) if ck._io.TMP_TAG in n] == []
    assert check_one_version(path) == 200


def test_reader_retries_once_from_a_fresh_index(tmp_path, monkeypatch):
    """The index read names shards a save removed before they were opened: the load opens
    the set again from the index now in place."""
    from ferry.checkpoint import open as _ckpt_open
    path = tmp_path / "model.safetensors"
    idx = tmp_path / "model.safetensors.index.json"
    ck.save(version(1), path, max_shard_size=4 * 4096 * 3)
    stale = idx.read_bytes()
    ck.save(version(2), path, max_shard_size=4 * 4096 * 3)     # removes version 1's shards
    fresh = idx.read_bytes()
    idx.write_bytes(stale)
    real, calls = _ckpt_open._ferry.Dataset, []

    def dataset(*a, **k):
        calls.append(1)
        try:
            return real(*a, **k)
        finally:
            if len(calls) == 1:
                idx.write_bytes(fresh)            # the save's commit lands meanwhile
    monkeypatch.setattr(_ckpt_open._ferry, "Dataset", dataset)
    assert check_one_version(path) == 200 and len(calls) == 2
    # a shard still missing after the retry: FerryError naming it
    calls.clear()
    idx.write_bytes(stale)
    fresh = stale
    with pytest.raises(FerryError, match="belongs to save .*the set was replaced"):
        ck.load(path)
    assert len(calls) == 2


# ------------------------------------------ Hugging Face's shard names (issue 38 item 3)
def _hf_names(stem, n):
    # save_pretrained / huggingface_hub's pattern: "model{suffix}.safetensors", suffix
    # "-00001-of-00004", beside "model.safetensors.index.json"
    return ["%s-%05d-of-%05d.safetensors" % (stem, i + 1, n) for i in range(n)]


def test_sharded_names_follow_hugging_face(tmp_path):
    path = tmp_path / "model.safetensors"
    ck.save(version(1), path, max_shard_size=4 * 4096 * 3)
    want = _hf_names("model", 4) + ["model.safetensors.index.json"]
    assert sorted(os.listdir(tmp_path)) == sorted(want)
    idx = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert sorted(set(idx["weight_map"].values())) == _hf_names("model", 4)
    for n in _hf_names("model", 4):                       # each shard is plain safetensors
        safetensors_torch.load_file(str(tmp_path / n))
    # saving again writes the same names; nothing else stays behind
    ck.save(version(2), path, max_shard_size=4 * 4096 * 3)
    assert sorted(os.listdir(tmp_path)) == sorted(want)
    assert check_one_version(path) == 200
    # another shard count: the other names, the old ones removed after the commit
    ck.save(version(3), path, max_shard_size=4 * 4096 * 6)
    assert sorted(os.listdir(tmp_path)) == sorted(_hf_names("model", 2) +
                                                  ["model.safetensors.index.json"])
    assert check_one_version(path) == 300


def test_a_reader_never_pairs_an_index_with_another_saves_shards(tmp_path):
    """The state a reader can meet while a save renames shards over the old names: the
    old index, some new shards. The C parser refuses the pair (save ids differ) and the
    reader loads the copy of the old set the save keeps; without it, a FerryError."""
    import shutil
    path = tmp_path / "model.safetensors"
    ck.save(version(1), path, max_shard_size=4 * 4096 * 3)
    other = tmp_path / "other"
    other.mkdir()
    ck.save(version(2), other / "model.safetensors", max_shard_size=4 * 4096 * 3)
    keep = tmp_path / (".model.safetensors.index.json.ferry-prev.%s.%d.0123456789ab"
                       % (ck._io._HOST, os.getpid()))
    keep.mkdir()
    for n in _hf_names("model", 4) + ["model.safetensors.index.json"]:
        os.link(tmp_path / n, keep / n)
    os.replace(other / _hf_names("model", 4)[0], tmp_path / _hf_names("model", 4)[0])
    assert check_one_version(path) == 100               # the kept copy of the old set
    with ck.safe_open(path) as f:
        assert float(f.get_tensor("t03")[0]) == 103
    shutil.rmtree(keep)
    with pytest.raises(FerryError, match="belongs to save .*the index to save"):
        ck.load(path)
