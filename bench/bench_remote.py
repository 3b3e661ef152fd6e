"""An object over HTTP into GPU (or host) memory: ferry against the limit and its peers, every
row in one run (issue 40's performance table; its Zarr v3 zstd row is bench/bench_remote_zarr.py).

A loopback nginx (Debian's nginx-light, or nginx unpacked into a folder: --nginx) serves a
--gib GiB .npy file. Rows:

  limit      --streams parallel `curl` range GETs of the file to /dev/null (the server and
             the loopback alone: what any client can take from this nginx)
  ferry      ferry.read(URL) into host memory and into GPU memory (device 0)
  kvikio     KvikIO RemoteFile.open_http(URL).read into a cupy array (its default threads
             and 16), where kvikio is installed
  rtt        with --rtt-ms of round-trip time added on the loopback by `tc qdisc ... netem`
             (root, sch_netem): the limit and ferry again; skipped with the reason when tc fails

Each row: GB/s (1e9 bytes of data a second), best of --reps, and the CPU time of this process
and its curl children over wall time (cores used; nginx's own is not counted). Nothing here is a test: run it by hand or through tools/gpu-run.sh.

    python3 bench/bench_remote.py --gib 4 --rtt-ms 20
"""
from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import ferry  # noqa: E402


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Nginx:
    """nginx on 127.0.0.1 serving `root`, stopped by stop(); its files stay where they are."""

    def __init__(self, exe: str, root: str, workdir: str):
        self.port = free_port()
        user = "user root;\n" if os.geteuid() == 0 else ""
        conf = os.path.join(workdir, "nginx.conf")
        with open(conf, "w") as f:
            f.write(f"""{user}worker_processes auto;
error_log {workdir}/error.log;
pid {workdir}/nginx.pid;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 100000;
    client_body_temp_path {workdir}/body;
    proxy_temp_path {workdir}/proxy;
    fastcgi_temp_path {workdir}/fastcgi;
    uwsgi_temp_path {workdir}/uwsgi;
    scgi_temp_path {workdir}/scgi;
    types {{ }}
    default_type application/octet-stream;
    server {{ listen 127.0.0.1:{self.port}; root {root}; }}
}}
""")
        self.p = subprocess.Popen([exe, "-c", conf, "-p", workdir, "-g", "daemon off;"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if self.p.poll() is not None or time.monotonic() > deadline:
                    self.p.kill()
                    raise SystemExit("nginx did not start: " + self.p.stderr.read().decode(errors="replace")[-400:])
                time.sleep(0.05)
        self.base = f"http://127.0.0.1:{self.port}"

    def stop(self):
        self.p.terminate()
        try:
            self.p.wait(10)
        except subprocess.TimeoutExpired:
            self.p.kill()


def timed(fn, reps: int):
    """Best wall time of reps calls and the CPU time / wall of that call."""
    def cpu():   # this process and its waited-for children (the curl processes of the limit)
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system
    best = None
    for _ in range(reps):
        c0, t0 = cpu(), time.perf_counter()
        fn()
        wall = time.perf_counter() - t0
        cores = (cpu() - c0) / wall if wall > 0 else 0.0
        if best is None or wall < best[0]:
            best = (wall, cores)
    return best


def row(name: str, nbytes: int, res, note: str = ""):
    if res is None:
        print(f"  {name:<44} {'-':>8}   {note}", flush=True)
        return None
    wall, cores = res
    gbs = nbytes / wall / 1e9
    print(f"  {name:<44} {gbs:8.2f} GB/s  {cores:5.2f} cores  {note}", flush=True)
    return gbs


def curl_limit(url: str, size: int, streams: int):
    """`streams` curl processes, each a range of the file, to /dev/null."""
    step = -(-size // streams)
    cmds = []
    for i in range(streams):
        lo, hi = i * step, min(size, (i + 1) * step) - 1
        if lo > hi:
            break
        cmds.append(["curl", "-s", "-f", "-o", "/dev/null", "-r", f"{lo}-{hi}", url])
    ps = [subprocess.Popen(c) for c in cmds]
    for p in ps:
        if p.wait() != 0:
            raise RuntimeError(f"curl failed: {p.args}")


def sync():
    try:
        import torch
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    except ImportError:
        pass


def have_gpu() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


def netem(rtt_ms: float, on: bool) -> str:
    """Add (on) or remove the delay on lo; '' or the reason it failed. Each direction gets
    half the round trip."""
    tc = shutil.which("tc") or "/sbin/tc"
    if on:
        cmd = [tc, "qdisc", "add", "dev", "lo", "root", "netem", "delay", f"{rtt_ms / 2:g}ms"]
    else:
        cmd = [tc, "qdisc", "del", "dev", "lo", "root"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    return "" if r.returncode == 0 else (r.stderr.strip() or f"tc exit {r.returncode}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=4.0, help="GiB of the .npy object (default 4)")
    ap.add_argument("--dir", default=os.environ.get("FERRY_BENCH_DIR", "/tmp/ferry-bench-remote"))
    ap.add_argument("--nginx", default=None, help="nginx executable (default: PATH, /usr/sbin/nginx)")
    ap.add_argument("--streams", type=int, default=16, help="curl processes of the limit row")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rtt-ms", type=float, default=20.0, help="added round trip of the rtt rows (0: none)")
    ap.add_argument("--sweep", default="", help="after the rows, ferry.read -> GPU (host without a GPU) under "
                    "FERRY_REMOTE_REQUEST_SIZE:FERRY_REMOTE_CONNECTIONS pairs, e.g. 2M:32,8M:64,16M:128")
    args = ap.parse_args()
    exe = args.nginx or shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
    if not exe:
        raise SystemExit("no nginx: install nginx-light or pass --nginx PATH")
    os.makedirs(args.dir, exist_ok=True)
    root = os.path.join(args.dir, "www")
    os.makedirs(root, exist_ok=True)
    npy = os.path.join(root, "big.npy")
    n = int(args.gib * (1 << 30)) // 4
    if not os.path.exists(npy) or os.path.getsize(npy) < n * 4:
        a = np.lib.format.open_memmap(npy, mode="w+", dtype="<f4", shape=(n,))
        step = 1 << 26
        for i in range(0, n, step):
            a[i:i + step] = np.arange(i, min(n, i + step), dtype=np.float32)
        a.flush()
        del a
    size = os.path.getsize(npy)
    gpu = have_gpu()
    work = tempfile.mkdtemp(prefix="nginx-", dir=args.dir)
    srv = Nginx(exe, root, work)
    url = f"{srv.base}/big.npy"
    print(f"bench_remote: {size / 1e9:.2f} GB object, nginx {exe}, "
          f"{os.cpu_count()} CPUs, GPU {'yes' if gpu else 'no'}, ferry {ferry.__version__}", flush=True)
    try:
        print("object (.npy over HTTP):")
        for pair in filter(None, args.sweep.split(",")):
            req, conns = pair.split(":")
            os.environ["FERRY_REMOTE_REQUEST_SIZE"], os.environ["FERRY_REMOTE_CONNECTIONS"] = req, conns
            c = ferry.Context()       # the remote knobs are read when a context is made
            dev = 0 if gpu else "cpu"

            def swept(c=c, dev=dev):
                x = ferry.read(url, device=dev, ctx=c)
                if gpu:
                    sync()
                return x
            row(f"sweep: requests {req}, {conns} connections", size, timed(swept, args.reps))
            c.close()
        for k in ("FERRY_REMOTE_REQUEST_SIZE", "FERRY_REMOTE_CONNECTIONS"):
            os.environ.pop(k, None)
        lim = row(f"limit: {args.streams} x curl -> /dev/null", size,
                  timed(lambda: curl_limit(url, size, args.streams), args.reps))
        g = row("ferry.read -> host", size, timed(lambda: ferry.read(url, device="cpu"), args.reps))
        if gpu:
            def ferry_gpu():
                x = ferry.read(url, device=0)
                sync()
                return x
            gd = row("ferry.read -> GPU", size, timed(ferry_gpu, args.reps))
            if lim and gd:
                print(f"  ferry GPU / limit: {gd / lim:.2f}")
        try:
            import cupy
            import kvikio
            import kvikio.defaults   # a submodule: `import kvikio` alone does not bind it
            for threads in (None, 16):
                def kv(threads=threads):
                    if threads:
                        kvikio.defaults.set("num_threads", threads)
                    buf = cupy.empty(size, dtype=cupy.uint8)
                    with kvikio.RemoteFile.open_http(url) as f:
                        f.read(buf)
                    cupy.cuda.runtime.deviceSynchronize()
                kvr = row(f"kvikio RemoteFile -> GPU ({threads or 'default'} threads)", size, timed(kv, args.reps))
                if gpu and kvr and gd:
                    print(f"  ferry GPU / kvikio: {gd / kvr:.2f}")
        except ImportError as e:
            row("kvikio RemoteFile -> GPU", size, None, f"not run: {e}")
        if args.rtt_ms > 0:
            print(f"with {args.rtt_ms:g} ms added round trip (tc netem on lo):")
            why = netem(args.rtt_ms, True)
            if why:
                row("rtt rows", size, None, f"not run: tc netem: {why}")
            else:
                try:
                    row(f"limit: {args.streams} x curl -> /dev/null", size,
                        timed(lambda: curl_limit(url, size, args.streams), 1))
                    r = row("ferry.read -> GPU" if gpu else "ferry.read -> host", size,
                            timed((lambda: (ferry.read(url, device=0), sync())) if gpu else
                                  (lambda: ferry.read(url, device="cpu")), 1))
                    base = gd if gpu else g
                    if r and base:
                        print(f"  ferry with / without the added round trip: {r / base:.2f}")
                finally:
                    netem(args.rtt_ms, False)
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
