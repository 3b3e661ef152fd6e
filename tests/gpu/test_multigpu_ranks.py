"""Datasets on real ranks started as torchrun starts them (multigpu_ranks.py): 8 processes,
rank and world size found through torch.distributed; ArrayDataset rows, per-sample files
(samples="files") and TokenDataset each give every sample exactly once per epoch over the
8 ranks; a state saved after 3 global steps on 8 ranks resumes on 4 and on 3 ranks with
nothing repeated and nothing skipped. gloo on the CPU everywhere (CI included); NCCL with one
GPU per rank where there are 8 GPUs (nvidia-h200-x8; fewer GPUs: N = the count, from 2).

tests/python covers the arithmetic with simulated ranks (rank=, world_size=) exhaustively;
this runs the same through torch.distributed in separate processes."""
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.join(os.path.dirname(os.path.dirname(HERE)), "python")
sys.path.insert(0, PYDIR)

from ferry.torch.order import epoch_order, FeistelOrder  # noqa: E402

ROWS, FILES, L, BATCH, STEPS = 203, 150, 8, 3, 3


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("mgranks")
    specs = {}
    # rows: 203 samples in 3 shards of unequal length; the id field is the sample id
    lo = 0
    for i, n in enumerate((90, 13, 100)):
        ids = np.arange(lo, lo + n, dtype=np.int64)
        np.save(root / f"x_{i}.npy", np.stack([ids.astype(np.float32)] * 5, axis=1))
        np.save(root / f"id_{i}.npy", ids)
        lo += n
    specs["rows"] = dict(fields={"x": str(root / "x_*.npy"), "id": str(root / "id_*.npy")}, batch=BATCH)
    for k in ("img", "id"):
        (root / k).mkdir()
    for i in range(FILES):
        np.save(root / "img" / f"s{i}.npy", np.full((2, 3), i, np.uint8))
        np.save(root / "id" / f"s{i}.npy", np.int64(i))
    specs["files"] = dict(fields={"img": str(root / "img" / "s*.npy"), "id": str(root / "id" / "s*.npy")},
                          batch=BATCH)
    # tokens: global positions as uint32, so a window's first token is its id
    starts, at = [], 0
    for i, n in enumerate((700, 41, 333)):
        np.arange(at, at + n, dtype=np.uint32).tofile(root / f"train_{i}.bin")
        starts += [at + j * L for j in range((n - 1) // L)]
        at += n
    specs["tokens"] = dict(files=str(root / "train_*.bin"), seq_len=L, batch=BATCH)
    every = {"rows": list(range(ROWS)), "files": list(range(FILES)), "tokens": starts}
    return root, specs, every


def _run_phases(tmp_path, phases, backend):
    spec = tmp_path / "phases.pkl"
    spec.write_bytes(pickle.dumps(phases))
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    env = dict(os.environ, PYTHONPATH=PYDIR + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1", FERRY_THREADS="2")
    p = subprocess.run([sys.executable, os.path.join(HERE, "multigpu_ranks.py"), str(spec), str(out), backend],
                       capture_output=True, text=True, timeout=240, env=env)
    assert p.returncode == 0 and "OK" in p.stdout, p.stdout[-3000:] + p.stderr[-3000:]
    res = {}
    for ph in phases:
        res[ph["name"]] = []
        for r in range(ph["world"]):
            with open(out / f"{ph['name']}_rank{r}.pkl", "rb") as f:
                got = pickle.load(f)
            assert "error" not in got, got["error"]
            res[ph["name"]].append(got)
    return res


def _launch(tmp_path, specs, backend, world, resume_on):
    phases = [dict(name="epoch", mode="epoch", world=world, steps=STEPS, kinds=specs)]
    phases += [dict(name=f"on{w}", mode="resume", world=w, kinds=specs, **{"from": "epoch"}) for w in resume_on]
    res = _run_phases(tmp_path, phases, backend)
    for ph in phases:
        assert [(r["rank"], r["world"]) for r in res[ph["name"]]] == [(r, ph["world"]) for r in range(ph["world"])]
    return res


def _check(res, every, world, resume_on):
    for kind, all_ids in every.items():
        ep = [r[kind]["epoch"] for r in res["epoch"]]
        flat = [i for e in ep for i in e]
        assert sorted(flat) == sorted(all_ids), (kind, "an epoch over", world, "ranks")
        assert len(set(flat)) == len(flat)
        states = [r[kind]["state"] for r in res["epoch"]]
        assert all(s == states[0] for s in states), kind          # the state is global
        assert states[0]["samples_consumed"] == STEPS * world * BATCH, (kind, states[0])
        first = [i for r in res["epoch"] for i in r[kind]["first"]]
        # the first STEPS global steps are the first positions of the epoch order
        n = len(all_ids)
        order = (FeistelOrder(n, 7, 0)[:].tolist() if kind == "tokens" else epoch_order(n, 7, 0).tolist())
        ids_in_order = [all_ids[k] for k in order] if kind == "tokens" else order
        assert sorted(first) == sorted(ids_in_order[:STEPS * world * BATCH]), kind
        for w in resume_on:
            rest = [i for r in res[f"on{w}"] for i in r[kind]["rest"]]
            both = first + rest
            assert len(both) == len(set(both)), (kind, "repeats after resuming on", w)
            assert sorted(both) == sorted(all_ids), (kind, "skipped after resuming on", w)
            assert all(r[kind]["state_after"]["epoch"] == 1 for r in res[f"on{w}"])


def test_eight_gloo_ranks_exactly_once_and_resume_on_4_and_3(data, tmp_path):
    _, specs, every = data
    res = _launch(tmp_path, specs, "gloo", 8, (4, 3))
    _check(res, every, 8, (4, 3))


NGPU = torch.cuda.device_count() if torch.cuda.is_available() else 0


def _dcp_on_ranks(tmp_path, backend, world, load_on):
    d = tmp_path / "ck"
    d.mkdir()
    phases = [dict(name="save", mode="dcp_save", world=world, dir=str(d))]
    phases += [dict(name=f"load{w}", mode="dcp_load", world=w, dir=str(d)) for w in load_on]
    res = _run_phases(tmp_path, phases, backend)
    # one DCP file per rank, each rank's own sharded set with its index
    assert len([n for n in os.listdir(d / "dcp") if n.endswith(".ferry")]) == world
    for r in res["save"]:
        assert r["ckpt"]["sharded_ok"] and r["ckpt"]["shard_files"] >= 2, r["ckpt"]
    for w in load_on:
        for r in res[f"load{w}"]:
            c = r["ckpt"]
            assert c["w_ok"] and c["w_local_ok"] and c["e_ok"] and c["step"] == 5, (w, c)


def test_dcp_on_8_gloo_ranks_loaded_resharded_on_3_and_sharded_saves_at_once(tmp_path):
    """Shard(0)/Shard(1) saved by 8 ranks, loaded as Shard(1)/Replicate on 3 ranks;
    ferry.checkpoint.save(max_shard_size=) by the 8 ranks at once."""
    _dcp_on_ranks(tmp_path, "gloo", 8, (3,))


@pytest.mark.skipif(NGPU < 2 or not torch.distributed.is_nccl_available(),
                    reason=f"needs 2+ GPUs and NCCL (found {NGPU} GPUs)")
def test_dcp_nccl_one_gpu_per_rank_loaded_resharded(tmp_path):
    world = min(NGPU, 8)
    _dcp_on_ranks(tmp_path, "nccl", world, (world, max(1, world // 2 - 1)))


@pytest.mark.skipif(NGPU < 2 or not torch.distributed.is_nccl_available(),
                    reason=f"needs 2+ GPUs and NCCL (found {NGPU} GPUs)")
def test_nccl_one_gpu_per_rank_exactly_once_and_resume(data, tmp_path):
    _, specs, every = data
    world = min(NGPU, 8)
    resume_on = sorted({world // 2, max(1, world // 2 - 1)}, reverse=True)   # 8: on 4 and on 3
    res = _launch(tmp_path, specs, "nccl", world, resume_on)
    _check(res, every, world, resume_on)


def test_state_of_a_rank_whose_shard_is_used_up_is_still_global(tmp_path):
    """103 samples, 8 ranks, batches of 4: after 3 global steps (96 samples) ranks 0..6 have
    one more step (one sample each of the tail of 7), rank 7 none. Every rank's state_dict() is
    still the global position (epoch 0, 96 consumed), as test_resume_with_another_world_size
    asserts for ranks in lock step: rank 7 reporting epoch 1 there made a resume on another
    world size from its state skip the 7 samples left of epoch 0."""
    from ferry.torch import ArrayDataset
    np.save(tmp_path / "id.npy", np.arange(103))
    kw = dict(fields={"id": str(tmp_path / "id.npy")}, batch_size=4, shuffle=True, seed=5, device="cpu")
    sets = [ArrayDataset(rank=r, world_size=8, **kw) for r in range(8)]
    its = [iter(d) for d in sets]
    for _ in range(3):
        for it in its:
            next(it)
    states = [(d.state_dict()["epoch"], d.state_dict()["samples_consumed"]) for d in sets]
    assert states == [(0, 96)] * 8, states
