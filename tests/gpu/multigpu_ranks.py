"""Ranks the way torchrun starts them (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT in the
environment, torch.distributed initialised from it), for test_multigpu_ranks.py.

    python multigpu_ranks.py SPEC.pkl OUT_DIR gloo|nccl

One launcher process imports torch once and forks each phase's ranks (importing torch in 8
fresh processes costs ~10 s of a small CI machine per phase; CUDA is never touched before the
fork, so NCCL ranks may be forked too). Phases run in order; a "resume" phase takes the state
rank 0 saved in the phase it names; "dcp_save" / "dcp_load" phases save and load a
checkpoint in the phase's "dir". Each rank writes OUT_DIR/<phase>_rank<r>.pkl.
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


def full_tensors(device):
    """The global tensors the checkpoint phases save and check (the same on every rank)."""
    g = torch.Generator().manual_seed(11)
    return {"w": torch.randn(48, 840, generator=g).to(device),
            "e": torch.randn(50, 24, generator=g).to(torch.bfloat16).to(device)}


def checkpoint_phase(phase, device, world, rank):
    """dcp through FerryWriter/FerryReader with DTensors sharded one way on save and another
    on load; ferry.checkpoint sharded saves (max_shard_size) by every rank at once."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from ferry import checkpoint as ck
    mesh = init_device_mesh(device.split(":")[0], (world,))
    full = full_tensors(device)
    d = phase["dir"]
    if phase["mode"] == "dcp_save":
        sd = {"w": distribute_tensor(full["w"], mesh, [Shard(0)]),
              "e": distribute_tensor(full["e"], mesh, [Shard(1)]), "step": 5}
        dcp.save(sd, storage_writer=ck.FerryWriter(os.path.join(d, "dcp")))
        # every rank its own sharded safetensors set, all at once
        mine = {f"r{rank}.{k}": v.to_local().contiguous() for k, v in sd.items() if k != "step"}
        p = os.path.join(d, f"rank{rank}", "model.safetensors")
        ck.save(mine, p, max_shard_size=1024)
        back = ck.load(p + ".index.json", device=device)
        files = len([n for n in os.listdir(os.path.dirname(p)) if n.endswith(".safetensors")])
        return {"sharded_ok": set(back) == set(mine) and all(torch.equal(back[k], mine[k]) for k in mine),
                "shard_files": files}
    sd = {"w": distribute_tensor(torch.zeros_like(full["w"]), mesh, [Shard(1)]),
          "e": distribute_tensor(torch.zeros_like(full["e"]), mesh, [Replicate()]), "step": 0}
    dcp.load(sd, storage_reader=ck.FerryReader(os.path.join(d, "dcp")))
    return {"w_ok": bool(torch.equal(sd["w"].full_tensor(), full["w"])),
            "w_local_ok": bool(torch.equal(sd["w"].to_local(), torch.chunk(full["w"], world, dim=1)[rank])),
            "e_ok": bool(torch.equal(sd["e"].to_local(), full["e"])), "step": sd["step"]}


def rank_main(rank, world, port, backend, phase, outdir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=120))
    device = f"cuda:{rank}" if backend == "nccl" else "cpu"
    res = {"rank": dist.get_rank(), "world": dist.get_world_size()}
    try:
        if phase["mode"].startswith("dcp"):
            res["ckpt"] = checkpoint_phase(phase, device, world, rank)
        for kind, spec in phase.get("kinds", {}).items():
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
