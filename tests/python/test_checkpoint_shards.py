"""Sharded saves are atomic as a set (issue 16 item 11): shards are written under new names
and the index is switched last, so a save killed at any point leaves the previous set
loadable -- never old and new shards that load together."""
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest

torch = pytest.importorskip("torch")

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
