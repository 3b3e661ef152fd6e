#!/usr/bin/env python3
"""A Zarr v3 zstd store over HTTP (issue 40's row): ferry against zarr-python
+ fsspec's HTTP file system, on one loopback web server in one run.

Writes N float32 variables (time x lat x lon, one zstd chunk per time step and
variable, 361x720 by default) with zarr-python, consolidated, serves the
directory from loopback nginx (Debian's nginx-light, when found) or Python's
http.server with Range support (--server python), then times

  ferry.read   ferry.read(URL, var, device=D) for every variable, one context
  xr.load      xr.open_dataset(URL, engine="ferry", device=D).load()
  zarr+fsspec  zarr.open_group(URL) (zarr-python's FsspecStore over aiohttp) and
               [...] of every variable, then cupy.asarray for a GPU (the path
               users have today)

best of --reps, GB/s of the decoded arrays, each row's ratio to zarr+fsspec;
every row is checked against the arrays written.

    python3 bench/bench_remote_zarr.py --device 0
    python3 bench/bench_remote_zarr.py --device cpu --vars 2 --steps 20 --smoke
"""
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
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
from harness import Dev, best, have, log  # noqa: E402


def data(i, nt, ny, nx):
    base = np.linspace(0, 1, ny * nx, dtype=np.float32).reshape(ny, nx)
    return np.stack([base * (t + 1) + 10 * i for t in range(nt)])


def write(path, names, nt, ny, nx):
    import zarr
    from zarr.codecs import ZstdCodec
    g = zarr.open_group(path, mode="w", zarr_format=3)
    for i, n in enumerate(names):
        a = g.create_array(n, shape=(nt, ny, nx), chunks=(1, ny, nx), dtype="float32", compressors=[ZstdCodec(level=3)],
                           dimension_names=("time", "lat", "lon"), fill_value=0.0)
        a[...] = data(i, nt, ny, nx)
    zarr.consolidate_metadata(path)


def serve_nginx(root, tmp):
    exe = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
    if not exe:
        return None
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    user = "user root;\n" if os.geteuid() == 0 else ""
    conf = os.path.join(tmp, "nginx.conf")
    with open(conf, "w") as f:
        f.write(f"""{user}worker_processes 4;
error_log {tmp}/error.log;
pid {tmp}/nginx.pid;
events {{ worker_connections 1024; }}
http {{
    access_log off; sendfile on; keepalive_requests 100000;
    client_body_temp_path {tmp}/body; proxy_temp_path {tmp}/proxy; fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi; scgi_temp_path {tmp}/scgi;
    server {{ listen 127.0.0.1:{port}; root {root}; }}
}}
""")
    p = subprocess.Popen([exe, "-c", conf, "-p", tmp, "-g", "daemon off;"], stderr=subprocess.PIPE)
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return f"http://127.0.0.1:{port}", p.terminate
        except OSError:
            if p.poll() is not None:
                return None
            time.sleep(0.05)
    p.kill()
    return None


def serve_python(root):
    from rangeserver import RangeServer
    s = RangeServer()
    for r, _, fs in os.walk(root):
        for f in fs:
            full = os.path.join(r, f)
            with open(full, "rb") as fh:
                s.put(os.path.relpath(full, root), fh.read())
    s.start()
    return f"http://127.0.0.1:{s.port}", s.stop


def _engine():
    """engine="ferry" where the package is installed (its entry point), else the class itself."""
    import xarray as xr
    if "ferry" in xr.backends.list_engines():
        return "ferry"
    from ferry.xarray import FerryBackendEntrypoint
    return FerryBackendEntrypoint


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="0")
    ap.add_argument("--vars", type=int, default=4)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--ny", type=int, default=361)
    ap.add_argument("--nx", type=int, default=720)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--server", choices=("auto", "nginx", "python"), default="auto")
    ap.add_argument("--smoke", action="store_true", help="small and quick: 2 variables, 8 steps, 1 rep")
    a = ap.parse_args()
    if a.smoke:
        a.vars, a.steps, a.ny, a.nx, a.reps = 2, 8, 91, 180, 1
    if not have("zarr"):
        sys.exit("needs zarr-python (the writer and the baseline)")
    import ferry
    dev = Dev(a.device)
    tmp = tempfile.mkdtemp(prefix="bench_remote_zarr.")
    stop = None
    try:
        names = [f"v{i}" for i in range(a.vars)]
        root = os.path.join(tmp, "www")
        os.makedirs(root)
        write(os.path.join(root, "s.zarr"), names, a.steps, a.ny, a.nx)
        want = {n: data(i, a.steps, a.ny, a.nx) for i, n in enumerate(names)}
        nbytes = sum(w.nbytes for w in want.values())
        got = serve_nginx(root, tmp) if a.server in ("auto", "nginx") else None
        if got is None and a.server == "nginx":
            sys.exit("nginx did not start (tools/setup.sh installs nginx-light)")
        server = "nginx"
        if got is None:
            got, server = serve_python(root), "python http.server"
        base, stop = got
        url = base + "/s.zarr"
        log(f"{a.vars} x {a.steps} x {a.ny} x {a.nx} float32 ({nbytes / 1e9:.2f} GB decoded), zstd, "
            f"served by {server} at {base}, device {dev.device}")
        rows = {}
        ctx = ferry.Context()

        def ferry_read():
            return {n: ferry.read(url, n, device=dev.device, ctx=ctx) for n in names}

        def xr_load():
            import xarray as xr
            return {n: v.data for n, v in xr.open_dataset(url, engine=_engine(), device=dev.device).load().items()}

        def zarr_fsspec():
            import zarr
            g = zarr.open_group(url, mode="r")
            return {n: dev.to(g[n][...]) for n in names}

        todo = [("ferry.read", ferry_read)]
        if have("xarray"):
            todo.append(("xr.load", xr_load))
        if have("fsspec") and have("aiohttp"):
            todo.append(("zarr+fsspec", zarr_fsspec))
        for name, fn in todo:
            t, out = best(lambda: (fn(), dev.sync())[0], a.reps)
            for n in names:
                if not dev.equal(out[n], dev.to(want[n])):
                    sys.exit(f"{name}: {n} differs from the written array")
            rows[name] = t
        ref = rows.get("zarr+fsspec")
        for name, t in rows.items():
            ratio = f"  {ref / t:5.2f} x zarr+fsspec" if ref else ""
            print(f"{name:12s} {nbytes / t / 1e9:8.3f} GB/s{ratio}")
    finally:
        if stop:
            stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
