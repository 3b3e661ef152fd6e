"""How ferry finds nvCOMP and says so: `ferry info` without a path names the
library it loaded, or why it did not (FERRY_NVCOMP=off, a path that does not
load, a version whose batched API ferry does not speak); decode="gpu" without
nvCOMP is an error, never a silent CPU decode. Each case runs in a fresh
process (the library is loaded once per process)."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
FERRY = os.environ.get("FERRY_BIN", os.path.join(ROOT, "build", "ferry"))


def info(**env):
    e = dict(os.environ)
    e.update(env)
    r = subprocess.run([FERRY, "info"], capture_output=True, text=True, env=e, timeout=60)
    assert r.returncode == 0, r.stderr
    # "  nvCOMP: loaded ...", "  decode: auto ..." (other lines: the version, the engine)
    return dict(line.strip().split(": ", 1) for line in r.stdout.splitlines() if ": " in line)


@pytest.fixture(scope="module")
def machine(ctx):
    if not os.path.exists(FERRY):
        pytest.skip(f"{FERRY} not built")
    return info()


def test_info_names_what_loaded(machine):
    nv = machine["nvCOMP"]
    assert nv.startswith("loaded nvCOMP ") and " from /" in nv or "not found" in nv, nv
    assert machine["decode"].startswith("auto")


def test_off_and_bad_paths_say_why(machine):
    assert info(FERRY_NVCOMP="off")["nvCOMP"] == "nvCOMP disabled (FERRY_NVCOMP=off)"
    bad = info(FERRY_NVCOMP="/nonexistent/libnvcomp.so.6")["nvCOMP"]
    assert bad.startswith("FERRY_NVCOMP=/nonexistent/libnvcomp.so.6: ") and "No such file" in bad, bad
    assert info(FERRY_DECODE="gpu")["decode"].startswith("gpu")


def test_unsupported_version_refused(machine):
    lib = os.environ.get("FERRY_NVCOMP", "")
    if "cudasim" not in lib:
        pytest.skip("needs the stand-in nvCOMP (its version is set by FERRY_NVCOMPSIM_VERSION)")
    nv = info(FERRY_NVCOMPSIM_VERSION="4200")["nvCOMP"]
    assert "is nvCOMP 4.2.0" in nv and "5.x and 6.x only" in nv, nv
    assert info(FERRY_NVCOMPSIM_VERSION="5300")["nvCOMP"].startswith("loaded nvCOMP 5.3.0")


def test_forced_gpu_without_nvcomp_is_an_error(machine, tmp_path):
    code = r"""
import sys, numpy as np, zlib
from ferry import _ferry as F
c = F.Context()
p = sys.argv[1]
raw = np.arange(1024, dtype='<f4').tobytes()
open(p, 'wb').write(zlib.compress(raw))
dst = F.empty((1024,), '<f4', device=0, ctx=c)
pl = F.Plan()
pl.extent(path=p, offset=0, length=len(open(p, 'rb').read()), codecs=[('zlib', 0)], decoded_size=len(raw), dst=dst)
try:
    c.run(pl, decode='gpu')
    print('ran')
except F.FerryError as e:
    print('error:', e)
c.run(pl, decode='cpu')
h = np.empty(1024, '<f4'); c.memcpy(h, dst)
print('cpu ok' if h.tobytes() == raw else 'cpu wrong')
"""
    e = dict(os.environ, FERRY_NVCOMP="off", PYTHONPATH=os.path.join(ROOT, "python"))
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "c.z")], capture_output=True, text=True, env=e,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "error: " in out and "decode \"gpu\" was asked for but nvCOMP cannot run" in out and "FERRY_NVCOMP=off" in out, out
    assert "cpu ok" in out, out
