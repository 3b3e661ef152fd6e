"""The knobs' table (src/engine/config.c, `ferry info --knobs`) is the one list of the FERRY_*
variables the library reads: every "FERRY_*" literal under src/ is a row of it, the engine reads
the environment only through it (getenv in config.c; ferry_knob everywhere else, which honours
no_env), and the only other readers are the process-wide loaders below the engine (CUDA, cuFile,
nvCOMP, NVRTC, nvJPEG, zlib, remote objects), whose rows say so (scope "process")."""
import json
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FERRY = os.environ.get("FERRY_BIN", os.path.join(ROOT, "build", "ferry"))
pytestmark = pytest.mark.skipif(not os.path.exists(FERRY), reason=f"{FERRY} not built (make cli)")


def table():
    r = subprocess.run([FERRY, "info", "--knobs", "--json"], capture_output=True, text=True, check=True)
    return {row["name"]: row for row in json.loads(r.stdout)}


def sources():
    for top, _, files in os.walk(os.path.join(ROOT, "src")):
        for f in files:
            if f.endswith((".c", ".h")):
                path = os.path.join(top, f)
                yield os.path.relpath(path, ROOT), open(path, errors="replace").read()


def test_every_variable_the_library_reads_is_a_row():
    rows = table()
    lib = {rel: text for rel, text in sources() if not rel.startswith("src/cli/")}
    literals = {m for text in lib.values() for m in re.findall(r'"(FERRY_[A-Z0-9_]+)"', text)}
    assert literals - set(rows) == set(), "read by the library, missing from the knobs' table (config.c)"
    for name, row in rows.items():
        assert row["doc"] and row["default"] and row["grammar"], name
        assert row["scope"] in ("context", "first use", "process"), name


def test_the_engine_reads_the_environment_through_the_table():
    rows = table()
    for rel, text in sources():
        code = re.sub(r"/\*.*?\*/|//[^\n]*", "", text, flags=re.S)   # comments may name getenv
        calls = re.findall(r"\bgetenv\(([^)]*)\)", code)
        if not calls or rel.startswith("src/cli/") or rel == "src/engine/config.c":
            continue
        assert not rel.startswith(("src/engine/", "src/base/", "src/formats/")), \
            f"{rel} reads the environment: read a knob through ferry_knob (engine/knobs.h) instead"
        for arg in calls:   # the loaders below the engine: each variable a process-scope row
            m = re.match(r'"(FERRY_[A-Z0-9_]+)"', arg.strip())
            if m:
                assert rows[m.group(1)]["scope"] == "process", (rel, m.group(1))


def test_a_knob_set_badly_is_named(tmp_path):
    """A context knob is checked when a context is made (here by `ferry info`'s context); a
    process one is listed with its value."""
    env = dict(os.environ, FERRY_GPU_SLOTS="nine")
    r = subprocess.run([FERRY, "info"], capture_output=True, text=True, env=env)
    assert r.returncode != 0 and "FERRY_GPU_SLOTS" in (r.stdout + r.stderr) and "nine" in (r.stdout + r.stderr)
    env = dict(os.environ, FERRY_NVCOMP="/nowhere/libnvcomp.so")
    d = json.loads(subprocess.run([FERRY, "info", "--knobs", "--json"], capture_output=True, text=True,
                                  env=env).stdout)
    row = next(x for x in d if x["name"] == "FERRY_NVCOMP")
    assert row["value"] == "/nowhere/libnvcomp.so" and row["scope"] == "process"
