"""Ranks the way torchrun starts them (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT in the
environment, torch.distributed initialised from it), for test_multigpu_ranks.py.

    python multigpu_ranks.py SPEC.pkl OUT_DIR gloo|nccl

One launcher process imports torch once and forks each phase's ranks (importing torch in 8
fresh processes costs ~10 s of the 2-core CI box per phase; CUDA is never touched before the
fork, so NCCL ranks may be forked too). Phases run in order; a "resume" phase takes the state
rank 0 saved in the phase it names. Each rank writes OUT_DIR/<phase>_rank<r>.pkl.
"""
import datetime
import os
import pickle
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))


def make(kind, spec, device):
    """The dataset; rank and world size come from torch.distributed, as in a training job."""
    from ferry.torch import ArrayDataset, TokenDataset
    if kind == "rows":
        return ArrayDataset(fields=spec["fields"], batch_size=spec["batch"], shuffle=True, seed=7,
                            device=device)
    if kind == "files":
        return ArrayDataset(fields=spec["fields"], samples="files", batch_size=spec["batch"],
                            shuffle=True, seed=7, device=device)
    return TokenDataset(spec["files"], spec["seq_len"], spec["batch"], dtype="uint32", seed=7,
                        device=device, drop_last=False)


def ids_of(kind, b, device):
    if kind == "tokens":
        x, _ = b
        assert x.device == torch.device(device), (x.device, device)
        return x[:, 0].tolist()
    assert b["id"].device == torch.device(device), (b["id"].device, device)
    return b["id"].tolist()


def rank_main(rank, world, port, backend, phase, outdir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=120))
    device = f"cuda:{rank}" if backend == "nccl" else "cpu"
    res = {"rank": dist.get_rank(), "world": dist.get_world_size()}
    try:
        for kind, spec in phase["kinds"].items():
            r = res[kind] = {}
            if phase["mode"] == "epoch":
                r["epoch"] = [i for b in make(kind, spec, device) for i in ids_of(kind, b, device)]
                ds = make(kind, spec, device)
                it = iter(ds)
                r["first"] = [i for _ in range(phase["steps"]) for i in ids_of(kind, next(it), device)]
                r["state"] = ds.state_dict()
                del it
            else:
                ds = make(kind, spec, device)
                ds.load_state_dict(phase["state"][kind])
                r["rest"] = [i for b in ds for i in ids_of(kind, b, device)]
                r["state_after"] = ds.state_dict()
    except Exception:  # noqa: BLE001
        import traceback
        res["error"] = traceback.format_exc()
    with open(os.path.join(outdir, f"{phase['name']}_rank{rank}.pkl"), "wb") as f:
        pickle.dump(res, f)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)   # no interpreter teardown racing gloo's threads (see tests/python/test_checkpoint.py)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def main(spec_path, outdir, backend):
    with open(spec_path, "rb") as f:
        phases = pickle.load(f)
    for phase in phases:
        if phase["mode"] == "resume":
            with open(os.path.join(outdir, f"{phase['from']}_rank0.pkl"), "rb") as f:
                saved = pickle.load(f)
            phase["state"] = {k: saved[k]["state"] for k in phase["kinds"]}
        mp.start_processes(rank_main, args=(phase["world"], free_port(), backend, phase, outdir),
                           nprocs=phase["world"], join=True, start_method="fork")
    print("OK")


if __name__ == "__main__":
    main(*sys.argv[1:4])
