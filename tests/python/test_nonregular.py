"""A FIFO (or device) named like a data file is refused at once, never waited on:
ferry.read, ferry.open and `ferry info` used to block forever on a FIFO x.npy."""
import os
import subprocess
import sys

import pytest

import ferry

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture()
def fifo(tmp_path):
    p = tmp_path / "x.npy"
    os.mkfifo(p)
    return str(p)


def run_guarded(code):
    """Run code in a fresh interpreter with a deadline: a hang fails, not blocks."""
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30)


def test_read_and_open_refuse_fifo(fifo):
    r = run_guarded(f"import ferry\n"
                    f"for fn in (ferry.read, ferry.open):\n"
                    f"    try:\n        fn({fifo!r})\n    except ferry.FerryError as e:\n        print('refused:', e)\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("is a FIFO, not a regular file") == 2, r.stdout


def test_info_refuses_fifo(fifo):
    exe = os.environ.get("FERRY_BIN") or os.path.join(ROOT, "build", "ferry")
    if not os.path.exists(exe):
        pytest.skip("build/ferry not built")
    r = subprocess.run([exe, "info", fifo], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert "FIFO" in r.stderr


def test_device_refused():
    with pytest.raises(ferry.FerryError, match="character device"):
        ferry.read("/dev/zero")
