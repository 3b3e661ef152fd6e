#!/usr/bin/env python3
"""Issue 39's benchmark: image batches (decode + RandomResizedCrop(224) + flip + normalize ->
bfloat16 NCHW batches of 256 in GPU memory) from an ImageNet-like set, every row in one run.

The set: --count JPEGs (default 50,000), ~500x375 (widths 400-600, heights 300-450, a fifth
portrait), quality 90, ~110 KB, windows of scikit-image's photographs rescaled with grain (so
every image is distinct), written once under --dir as ~1 GB WebDataset tar shards (key.jpg,
key.cls) and as the same images in an ImageFolder tree (100 classes); both read once before the
rows (page-cached). Rows, each with images/s and the CPU cores it used (the CPU time of the
process and its worker processes / wall):
  limit-gpu     the GPU decoder alone, batched, from memory (nvImageCodec when installed, else
                torchvision.io.decode_jpeg(device="cuda") on lists: nvJPEG's batched decode)
  limit-cpu     libjpeg-turbo alone on --threads threads, from memory (ferry.images.decode_batch)
  limit         their sum: ferry's target is >= 0.85 x this
  ferry-tar     ferry.torch.ImageDataset over the tar shards (shuffle, device="cuda")
  ferry-folder  the same over the folder tree
  dali-tar      DALI fn.readers.webdataset + fn.decoders.image(device="mixed") +
                fn.random_resized_crop + fn.crop_mirror_normalize (float16: DALI has no
                bfloat16 output), best of --dali-threads
  dali-folder   the same with fn.readers.file
  tv-loader     torchvision: DataLoader(--workers workers, pin_memory) over the folder tree,
                decode_jpeg + v2.RandomResizedCrop + RandomHorizontalFlip on the CPU, then
                .cuda() and normalize to bfloat16 on the GPU
  tv-gpu        torchvision.io.decode_jpeg(device="cuda") on batches of file bytes read by the
                main thread, v2 transforms on the GPU
Then the GPU idle fraction behind a --step-ms training step (a sleep kernel) fed by ferry and by
each peer. Rows whose library is missing or that need a GPU the machine lacks print why.

    python bench/bench_images.py                                  # the GPU machine: every row
    python bench/bench_images.py --count 300 --device cpu --seconds 3 --batch 32   # a smoke test
The figures, with the machine and the command of each run, go in BENCHMARKS.md.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tarfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, HERE)

from harness import have, log, warm  # noqa: E402

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
CLASSES = 100


# ----------------------------------------------------------------------------------- the set
def _photos():
    from skimage import data
    return [data.astronaut(), data.coffee(), data.chelsea(), data.rocket(),
            np.stack([data.camera()] * 3, -1), data.immunohistochemistry(), data.hubble_deep_field()]


_PICS = None


def _one_jpeg(i):
    """Image i of the set: a window of a photograph, rescaled to ~500x375, grain, q90."""
    global _PICS
    from PIL import Image
    if _PICS is None:
        _PICS = _photos()
    rng = np.random.default_rng(i)
    w, h = int(rng.integers(400, 601)), int(rng.integers(300, 451))
    if i % 5 == 4:
        w, h = h, w
    p = _PICS[i % len(_PICS)]
    ch, cw = int(rng.integers(p.shape[0] // 3, p.shape[0] + 1)), int(rng.integers(p.shape[1] // 3, p.shape[1] + 1))
    y0, x0 = int(rng.integers(0, p.shape[0] - ch + 1)), int(rng.integers(0, p.shape[1] - cw + 1))
    a = np.asarray(Image.fromarray(p[y0:y0 + ch, x0:x0 + cw]).resize((w, h), Image.BICUBIC), dtype=np.int16)
    # grain of +-40 per value: photographs upscaled are smooth, and this brings a q90 file to
    # ImageNet's ~110 KB (measured on the 500x375 windows: +-6 gave 57 KB, +-40 110 KB)
    a = (a + rng.integers(-40, 41, a.shape)).clip(0, 255).astype(np.uint8)
    b = io.BytesIO()
    Image.fromarray(a).save(b, "JPEG", quality=90)
    return b.getvalue()


def make_set(root, count, shard_bytes):
    """Write (or reuse) the tar shards and the folder tree; returns (tar paths, folder root)."""
    stamp = os.path.join(root, "set.json")
    want = {"count": count, "shard_bytes": shard_bytes, "version": 2}
    tars = os.path.join(root, "tar")
    folder = os.path.join(root, "folder")
    if os.path.exists(stamp) and json.load(open(stamp)) == want:
        return sorted(os.path.join(tars, f) for f in os.listdir(tars)), folder
    import multiprocessing
    os.makedirs(tars, exist_ok=True)
    for c in range(CLASSES):
        os.makedirs(os.path.join(folder, f"n{c:05d}"), exist_ok=True)
    t0 = time.time()
    paths, tf, size, total = [], None, 0, 0
    with multiprocessing.Pool() as pool:
        for i, data in enumerate(pool.imap(_one_jpeg, range(count), chunksize=64)):
            if tf is None or size >= shard_bytes:
                if tf is not None:
                    tf.close()
                paths.append(os.path.join(tars, f"train-{len(paths):05d}.tar"))
                tf, size = tarfile.open(paths[-1], "w", format=tarfile.USTAR_FORMAT), 0
            key = f"{i:08d}"
            for name, blob in ((f"{key}.jpg", data), (f"{key}.cls", str(i % CLASSES).encode())):
                ti = tarfile.TarInfo(name)
                ti.size = len(blob)
                tf.addfile(ti, io.BytesIO(blob))
            size += len(data) + 1536
            total += len(data)
            with open(os.path.join(folder, f"n{i % CLASSES:05d}", f"{key}.jpg"), "wb") as f:
                f.write(data)
            if i and i % 5000 == 0:
                log(f"  {i} images, {time.time() - t0:.0f} s")
    if tf is not None:
        tf.close()
    json.dump(want, open(stamp, "w"))
    log(f"set: {count} JPEGs, mean {total / count / 1e3:.0f} KB, {len(paths)} shards, {time.time() - t0:.0f} s")
    return paths, folder


# ----------------------------------------------------------------------------------- timing
def _tree_cpu():
    """CPU seconds of this process and its live descendants (DataLoader workers)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = time.process_time()
    todo = [os.getpid()]
    seen = set()
    while todo:
        pid = todo.pop()
        try:
            for t in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{t}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            continue
        if pid != os.getpid() and pid not in seen:
            seen.add(pid)
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / tick
            except OSError:
                pass
    return total


def run_row(name, batches, seconds, images_of, step=None, warmup=3, sync=None):
    """Time an iterator of batches: -> {"row", "images_s", "cores", "gpu_idle"}."""
    it = iter(batches)
    for _ in range(warmup):
        next(it)
    if sync:
        sync()
    n = nb = 0
    events = []
    c0, t0 = _tree_cpu(), time.perf_counter()
    for b in it:
        n += images_of(b)
        nb += 1
        if step is not None:
            events.append(step(b))
        if time.perf_counter() - t0 > seconds:
            break
    if sync:
        sync()
    wall = time.perf_counter() - t0
    cpu = _tree_cpu() - c0
    out = {"row": name, "images_s": n / wall, "cores": cpu / wall, "batches": nb}
    if events:
        busy = sum(a.elapsed_time(b) for a, b in events) / 1e3
        out["gpu_idle"] = max(0.0, 1 - busy / wall)
    log(f"{name:14s} {out['images_s']:9.0f} img/s  {out['cores']:5.1f} cores"
        + (f"  GPU idle {out['gpu_idle'] * 100:5.1f} %" if "gpu_idle" in out else ""))
    return out


def make_step(ms):
    """A training step of `ms` milliseconds on the GPU (a sleep kernel), timed by events."""
    import torch
    torch.cuda.synchronize()
    t = time.perf_counter()
    torch.cuda._sleep(10_000_000)
    torch.cuda.synchronize()
    cycles = int(10_000_000 * ms / 1e3 / (time.perf_counter() - t))

    def step(_batch):
        s = torch.cuda.current_stream()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record(s)
        torch.cuda._sleep(cycles)
        e1.record(s)
        return e0, e1
    return step


# ----------------------------------------------------------------------------------- rows
def read_members(tars, n):
    from ferry import images
    s = images.open_shards(tars)
    return [s.read(i, "jpg") for i in range(min(n, len(s)))]


def row_limit_cpu(datas, args):
    from ferry import images

    def batches():
        while True:
            for k in range(0, len(datas) - args.batch + 1, args.batch):
                yield images.decode_batch(datas[k:k + args.batch], threads=args.threads)
    return run_row("limit-cpu", batches(), args.seconds, len)


def row_limit_gpu(datas, args):
    import torch
    if have("nvidia.nvimgcodec"):
        from nvidia import nvimgcodec
        dec = nvimgcodec.Decoder()
        name = "limit-gpu (nvImageCodec)"

        def decode(chunk):
            return dec.decode(chunk)
    else:
        from torchvision.io import decode_jpeg
        tens = [torch.frombuffer(bytearray(d), dtype=torch.uint8) for d in datas]
        name = "limit-gpu (nvJPEG via torchvision)"
        datas = tens

        def decode(chunk):
            return decode_jpeg(chunk, device="cuda")

    def batches():
        while True:
            for k in range(0, len(datas) - args.batch + 1, args.batch):
                yield decode(datas[k:k + args.batch])
    return run_row(name, batches(), args.seconds, len, sync=torch.cuda.synchronize)


def ferry_dataset(src, args):
    import torch
    from ferry.torch import ImageDataset
    return ImageDataset(src, batch_size=args.batch, size=224, crop="random_resized", flip=0.5,
                        normalize=(MEAN, STD), dtype=torch.bfloat16, shuffle=True, seed=0,
                        device=args.device, threads=args.threads)


def _forever(make):
    while True:
        yield from make()


def row_ferry(name, src, args, step=None):
    ds = ferry_dataset(src, args)
    sync = None
    if args.device != "cpu":
        import torch
        sync = torch.cuda.synchronize
    r = run_row(name, _forever(lambda: iter(ds)), args.seconds, lambda b: b["image"].shape[0], step, sync=sync)
    im = ds.stats()["images"]      # who decoded, and where the batch calls' time went
    sec = im.get("seconds", {})
    log(f"  {name}: decoded gpu {im['gpu']} (hardware {im.get('gpu_hardware', 0)}) cpu {im['cpu']}; "
        + ", ".join(f"{k} {v:.2f} s" for k, v in sec.items()))
    return dict(r, images=im)


def dali_pipe(kind, src, threads, args):
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def

    @pipeline_def(batch_size=args.batch, num_threads=threads, device_id=0, prefetch_queue_depth=2)
    def pipe():
        if kind == "tar":
            jpg, label = fn.readers.webdataset(paths=src, ext=["jpg", "cls"], random_shuffle=True,
                                               name="reader", missing_component_behavior="error")
        else:
            jpg, label = fn.readers.file(file_root=src, random_shuffle=True, name="reader")
        img = fn.decoders.image(jpg, device="mixed", output_type=types.RGB)
        img = fn.random_resized_crop(img, size=(224, 224))
        img = fn.crop_mirror_normalize(img, dtype=types.FLOAT16, output_layout="CHW",
                                       mean=[m * 255 for m in MEAN], std=[s * 255 for s in STD],
                                       mirror=fn.random.coin_flip(probability=0.5))
        return img, label
    p = pipe()
    p.build()
    return p


def row_dali(kind, src, args, step=None):
    import torch
    best = None
    for t in args.dali_threads:
        p = dali_pipe(kind, src, t, args)

        def batches(p=p):
            while True:
                yield p.run()
        r = run_row(f"dali-{kind} ({t} thr)", batches(), args.seconds, lambda b: len(b[0]), step,
                    sync=torch.cuda.synchronize)
        del p
        if best is None or r["images_s"] > best["images_s"]:
            best = r
    best = dict(best, row=f"dali-{kind}")
    return best


class _FolderDataset:
    """torchvision's way: a map-style dataset of (file, label), decode_jpeg + v2 transforms."""

    def __init__(self, root):
        self.items = []
        for c, d in enumerate(sorted(os.listdir(root))):
            for f in sorted(os.listdir(os.path.join(root, d))):
                self.items.append((os.path.join(root, d, f), c))
        from torchvision.transforms import v2
        self.t = v2.Compose([v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip()])

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        from torchvision.io import decode_jpeg, read_file
        p, c = self.items[i]
        return self.t(decode_jpeg(read_file(p))), c


def _to_gpu_normalized(x, device):
    import torch
    mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor(STD, device=device).view(1, 3, 1, 1) * 255
    x = x.to(device, non_blocking=True)
    return ((x.float() - mean) / std).to(torch.bfloat16)


def row_tv_loader(folder, args, step=None):
    import torch
    from torch.utils.data import DataLoader
    dev = args.device if args.device != "cpu" else "cpu"
    ds = _FolderDataset(folder)
    loader = DataLoader(ds, batch_size=args.batch, shuffle=True, num_workers=args.workers,
                        pin_memory=dev != "cpu", persistent_workers=True, prefetch_factor=4, drop_last=True)

    def batches():
        for x, y in _forever(lambda: iter(loader)):
            yield _to_gpu_normalized(x, dev), y.to(dev, non_blocking=True)
    sync = torch.cuda.synchronize if dev != "cpu" else None
    return run_row(f"tv-loader ({args.workers} workers)", batches(), args.seconds, lambda b: b[0].shape[0], step,
                   sync=sync)


def row_tv_gpu(folder, args, step=None):
    import torch
    from torchvision.io import decode_jpeg, read_file
    from torchvision.transforms import v2
    ds = _FolderDataset(folder)
    t = v2.Compose([v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip()])
    rng = np.random.default_rng(0)

    def batches():
        while True:
            order = rng.permutation(len(ds.items))
            for k in range(0, len(order) - args.batch + 1, args.batch):
                datas = [read_file(ds.items[i][0]) for i in order[k:k + args.batch]]
                imgs = decode_jpeg(datas, device="cuda")
                x = torch.stack([t(im) for im in imgs])
                yield _to_gpu_normalized(x, "cuda")
    return run_row("tv-gpu", batches(), args.seconds, lambda b: b.shape[0], step, sync=torch.cuda.synchronize)


# ----------------------------------------------------------------------------------- main
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=50_000)
    ap.add_argument("--dir", default=os.environ.get("FERRY_BENCH_DIR", "/tmp/ferry-bench-images"))
    ap.add_argument("--shard-bytes", type=int, default=1 << 30)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--dali-threads", type=lambda s: [int(v) for v in s.split(",")], default=[4, 8, 16])
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--step-ms", type=float, default=5.0)
    ap.add_argument("--rows", default="limit,ferry,dali,tv-loader,tv-gpu,idle")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    rows = set(args.rows.split(","))
    tars, folder = make_set(args.dir, args.count, args.shard_bytes)
    for p in tars + [folder]:
        warm(p)
    import torch
    cuda = args.device != "cpu" and torch.cuda.is_available()
    if args.device != "cpu" and not cuda:
        raise SystemExit("--device cuda: no CUDA device here (use --device cpu for a smoke test)")
    log(f"{args.count} images, {len(tars)} shards, batch {args.batch}, device {args.device}, "
        f"{os.cpu_count()} CPUs")
    out = []

    def attempt(what, fn, *a, **kw):
        try:
            out.append(fn(*a, **kw))
        except Exception as e:  # noqa: BLE001 - a peer that cannot run says why, the rest run
            log(f"{what:14s} not run: {type(e).__name__}: {e}")
            out.append({"row": what, "error": f"{type(e).__name__}: {e}"})

    if "limit" in rows:
        datas = read_members(tars, max(args.batch * 8, 2048))
        attempt("limit-cpu", row_limit_cpu, datas, args)
        if cuda:
            attempt("limit-gpu", row_limit_gpu, datas, args)
            got = [r for r in out if r["row"].startswith("limit") and "images_s" in r]
            if len(got) == 2:
                total = sum(r["images_s"] for r in got)
                out.append({"row": "limit", "images_s": total})
                log(f"{'limit':14s} {total:9.0f} img/s  (GPU decoder + CPU threads, each alone)")
        else:
            log("limit-gpu      not run: no CUDA device")
    if "ferry" in rows:
        attempt("ferry-tar", row_ferry, "ferry-tar", tars, args)
        attempt("ferry-folder", row_ferry, "ferry-folder", folder, args)
    if "dali" in rows:
        if not cuda or not have("nvidia.dali"):
            log("dali           not run: " + ("no CUDA device" if not cuda else "DALI is not installed"))
        else:
            attempt("dali-tar", row_dali, "tar", tars, args)
            attempt("dali-folder", row_dali, "folder", folder, args)
    if "tv-loader" in rows:
        attempt("tv-loader", row_tv_loader, folder, args)
    if "tv-gpu" in rows:
        if cuda:
            attempt("tv-gpu", row_tv_gpu, folder, args)
        else:
            log("tv-gpu         not run: no CUDA device")
    if "idle" in rows and cuda:
        step = make_step(args.step_ms)
        log(f"GPU idle behind a {args.step_ms} ms step:")
        attempt("ferry-tar+step", row_ferry, "ferry-tar+step", tars, args, step)
        if have("nvidia.dali"):
            attempt("dali-tar+step", row_dali, "tar", tars, args, step)
        attempt("tv-loader+step", row_tv_loader, folder, args, step)
    ref = {r["row"]: r.get("images_s") for r in out}
    if ref.get("limit") and ref.get("ferry-tar"):
        log(f"ferry-tar / limit = {ref['ferry-tar'] / ref['limit']:.2f} (target >= 0.85)")
    for peer, target in (("dali-tar", 1.5), ("tv-loader", 3.0)):
        key = next((k for k in ref if k.startswith(peer) and "+step" not in k and ref[k]), None)
        if key and ref.get("ferry-tar"):
            log(f"ferry-tar / {key} = {ref['ferry-tar'] / ref[key]:.2f} (target >= {target})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": out}, f, indent=1)


if __name__ == "__main__":
    main()
