"""tools/circles.py, the check `make test-c` runs on the library's objects: it
finds a circle (two files calling each other) and fails, and passes a file
graph without one; the library itself, as built, has none."""
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "tools", "circles.py")

pytestmark = pytest.mark.skipif(not shutil.which("cc") or not shutil.which("nm"), reason="needs cc and nm")


def build(tmp_path, files):
    src, obj = tmp_path / "src", tmp_path / "build" / "src"
    for rel, text in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (obj / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
        subprocess.run(["cc", "-c", str(src / rel), "-o", str(obj / rel)[:-2] + ".o"], check=True)
    return subprocess.run([sys.executable, TOOL, str(tmp_path / "build"), "--src", str(src)],
                          capture_output=True, text=True)


def test_a_circle_fails(tmp_path):
    r = build(tmp_path, {
        "engine/a.c": "int b_fn(void);\nint a_fn(void) { return b_fn(); }\n",
        "engine/b.c": "int a_fn(void);\nint b_fn(void) { return 1; }\nint b_up(void) { return a_fn(); }\n",
    })
    assert r.returncode == 1, r.stdout
    assert "circle of 2 files: engine/a.c, engine/b.c" in r.stdout
    assert "engine/b.c -> engine/a.c: a_fn" in r.stdout


def test_a_chain_passes(tmp_path):
    r = build(tmp_path, {
        "base/low.c": "int low(void) { return 1; }\n",
        "engine/a.c": "int low(void);\nint a_fn(void) { return low(); }\n",
        "engine/b.c": "int a_fn(void);\nint b_fn(void) { return a_fn(); }\n",
    })
    assert r.returncode == 0, r.stdout
    assert "0 circle(s)" in r.stdout


def test_the_library_has_no_circle():
    build_dir = os.path.join(ROOT, "build")
    if not os.path.isdir(os.path.join(build_dir, "src", "engine")):
        pytest.skip("the library is not built (make lib)")
    r = subprocess.run([sys.executable, TOOL, "--quiet", build_dir], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout
    assert " 0 circle(s)" in r.stdout
