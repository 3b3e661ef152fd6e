"""A checkpoint read while another process replaces it (atomic rename, as ckpt.save does)
gives the old file, the new file or a clear FerryError -- never a mix of both (issue 15
item 0). Each generation has tensors of other sizes, so a header of one file paired with
the bytes of another gives wrong values or wrong shapes, which the checks below catch."""
import os
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
NT = 6


def gen_sd(g):
    # sizes move with the generation: offsets differ between consecutive files
    return {"t%d" % i: torch.full((1000 + 37 * ((g + i) % 5) + 500 * i,), float(g * 100 + i))
            for i in range(NT)}


WRITER = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, PYDIR)
    from ferry import checkpoint as ck
    path, sharded = sys.argv[1], sys.argv[2] == "1"
    def gen_sd(g):
        return {"t%d" % i: torch.full((1000 + 37 * ((g + i) % 5) + 500 * i,), float(g * 100 + i))
                for i in range(NT)}
    shard = 20000 if sharded else None
    g = 1
    ck.save(gen_sd(0), path, max_shard_size=shard, durable=False)
    print("ready", flush=True)
    while True:
        ck.save(gen_sd(g), path, max_shard_size=shard, durable=False)
        g += 1
""")


def check_consistent(sd):
    """Every tensor one constant value g*100+i of a single generation g, of g's shape."""
    gens = set()
    for i in range(NT):
        t = sd["t%d" % i]
        v = float(t[0])
        assert bool((t == v).all()), "tensor t%d mixes values" % i
        g, rest = divmod(round(v) - i, 100)
        assert rest == 0 and v == g * 100 + i, "t%d holds %r" % (i, v)
        assert tuple(t.shape) == tuple(gen_sd(g)["t%d" % i].shape), "t%d: shape of another file" % i
        gens.add(g)
    assert len(gens) == 1, "tensors from generations %s" % sorted(gens)


def run_race(tmp_path, sharded, readers, seconds=2.5):
    path = tmp_path / "latest.safetensors"
    script = tmp_path / "writer.py"
    script.write_text(WRITER.replace("PYDIR", repr(PYDIR)).replace("NT)", "%d)" % NT))
    proc = subprocess.Popen([sys.executable, str(script), str(path), "1" if sharded else "0"],
                            stdout=subprocess.PIPE)
    counts = {"ok": 0, "error": 0}
    try:
        assert proc.stdout.readline().strip() == b"ready"
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for read in readers:
                try:
                    sd = read(path)
                except FerryError as e:
                    assert str(e), "FerryError without a message"
                    counts["error"] += 1
                    continue
                check_consistent(sd)
                counts["ok"] += 1
    finally:
        proc.kill()
        proc.wait(timeout=30)
        proc.stdout.close()
    print("race", sharded, counts)
    assert counts["ok"] > 20, counts
    return counts


def via_load(p):
    return ck.load(p)


def via_safe_open(p):
    with ck.safe_open(p) as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def via_slices(p):
    with ck.safe_open(p) as f:
        return {k: f.get_slice(k)[:] for k in f.keys()}


def via_load_into(p):
    with ck.safe_open(p) as f:          # the shapes of the file we will fill from
        shapes = {k: f.get_slice(k).get_shape() for k in f.keys()}
    sd = {k: torch.empty(s) for k, s in shapes.items()}
    ck.load_into(sd, p)
    return sd


def test_concurrent_replace_single_file(tmp_path):
    run_race(tmp_path, False, [via_load, via_safe_open, via_slices])


def test_concurrent_replace_sharded(tmp_path):
    run_race(tmp_path, True, [via_load, via_safe_open])


def test_concurrent_replace_load_into(tmp_path):
    def reader(p):
        try:
            return via_load_into(p)
        except FerryError:
            raise
    run_race(tmp_path, False, [reader], seconds=1.5)
