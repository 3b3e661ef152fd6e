"""README.md's code runs as written: every ```python block, the ```c block and the `ferry`
command lines of "## The command"; and the reference docs it links to (docs/engine.md,
docs/decoding.md) stay true to the sources.

Each block is taken from README.md (by the heading it sits under), not copied here, so a README
edit that breaks a snippet fails this test. A Python block runs in a namespace of its own: it
gets no name it does not import or define itself. The one translation is the device, which a
machine without a GPU cannot run: device=0 / "cuda" / "cuda:N" -> "cpu" in Python, and
ferry_cuda_buf -> ferry_host_buf in C (whose device pointers and sizes, left to the caller, are
given here). Every translation must match its expected count, so an edited snippet fails loudly
instead of running something else. The files a snippet names are written in a temporary
directory by the reference writers (numpy, safetensors, xarray's netCDF4 engine), and what the
snippet reads or prints is checked against them.

Not run here: the install block (`make`, `make demo`, `make test`, `pip install ...`): `make`
builds what this test uses, and `make test-install` runs `pip install .` into a temporary
directory and checks its `ferry` and `import ferry`."""
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from optional import has

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
BUILD = ROOT / "build"
FERRY = os.environ.get("FERRY_BIN", str(BUILD / "ferry"))


def _section(heading, text=README):
    """The text from the line `heading` to the next heading."""
    at = text.index("\n" + heading + "\n")
    rest = text[at + len(heading) + 2:]
    end = re.search(r"\n#{1,6} ", rest)
    return rest[:end.start()] if end else rest


def _blocks(text, lang):
    """The bodies of the ```lang fenced blocks of `text` ("" : fences without a language)."""
    found, body, open_lang = [], None, None
    for ln in text.splitlines(keepends=True):
        if ln.startswith("```"):
            if body is None:
                open_lang, body = ln[3:].strip(), ""
            else:
                if open_lang == lang:
                    found.append(body)
                body = None
        elif body is not None:
            body += ln
    assert body is None, "an unclosed ``` fence"
    return found


def _block(heading, lang="python"):
    """The one ```lang block under `heading`."""
    found = _blocks(_section(heading), lang)
    assert len(found) == 1, f"README {heading!r}: {len(found)} ```{lang} blocks, expected 1"
    return found[0]


_DEVICE = re.compile(r'device=(?:0|"cuda(?::\d+)?")')


def _on_cpu(code, count):
    """The one translation of a Python block: its `count` GPU devices become "cpu"."""
    code, n = _DEVICE.subn('device="cpu"', code)
    assert n == count, f"README snippet names a GPU device {n} times, expected {count}: update the test"
    return code


def _run(code, what):
    """Run a block as a script of its own: only builtins, nothing the block does not import."""
    ns = {"__name__": "__readme__"}
    exec(compile(code, f"<README {what}>", "exec"), ns)
    return ns


PY_HEADINGS = ["## Python: `ferry.read`", '## xarray: `engine="ferry"`',
               "## PyTorch: `ferry.torch.ArrayDataset`", "## Checkpoints: `ferry.checkpoint`"]


def test_every_block_is_tested():
    """A ```python or ```c block added to README without a test here fails."""
    assert len(_blocks(README, "python")) == len(PY_HEADINGS)
    for h in PY_HEADINGS:
        _block(h)
    assert len(_blocks(README, "c")) == 1 and _block("## C", "c")
    assert len(_blocks(README, "")) == 2                             # install, the command


def test_readme_is_a_first_screen():
    """What ferry is, how to install it and one example of each use come first; the engine's
    internals live in docs/engine.md and docs/decoding.md, which README links to."""
    lines = README.splitlines()
    assert len(lines) <= 150
    assert max(len(ln) for ln in lines) <= 200
    checkpoint = lines.index(PY_HEADINGS[-1])                        # the last example
    closing = next(i for i in range(checkpoint + 2, len(lines)) if lines[i] == "```")
    assert closing < 80, "README's examples end after its first 80 lines"
    for doc in ("docs/engine.md", "docs/decoding.md", "BENCHMARKS.md"):
        assert f"]({doc})" in README and (ROOT / doc).exists()


# ---------------------------------------------------------------------------------------------
# files the Python snippets name


def _nc3(path, t0=0, **vars_):
    """A netCDF classic file (CDF-2) of float32 (time, lat, lon) variables, written by netCDF4;
    its hourly time axis starts t0 hours after 2020-01-01."""
    import pandas as pd
    import xarray as xr
    steps = next(iter(vars_.values())).shape[0]
    ds = xr.Dataset({k: (("time", "lat", "lon"), v) for k, v in vars_.items()},
                    coords={"time": pd.date_range("2020-01-01", periods=steps, freq="h") + pd.Timedelta(hours=t0)})
    ds.to_netcdf(path, format="NETCDF3_64BIT", engine="netcdf4")
    return ds


needs_nc = pytest.mark.skipif(not has("netCDF4"), reason="writing netCDF files needs netCDF4")


@needs_nc
def test_read_block(tmp_path, monkeypatch, capsys):
    from safetensors.numpy import save_file
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    a = rng.normal(size=(12, 5)).astype(np.float32)
    np.save("a.npy", a)
    wt = rng.normal(size=(4, 6)).astype(np.float32)
    save_file({"w": wt, "b": np.arange(6, dtype=np.int64)}, "m.safetensors")
    t2m = rng.normal(size=(16, 3, 4)).astype(np.float32)
    _nc3("era5.nc", t2m=t2m)
    ns = _run(_on_cpu(_block(PY_HEADINGS[0]), 1), "ferry.read")
    np.testing.assert_array_equal(ns["x"], a)
    np.testing.assert_array_equal(np.asarray(ns["w"]), wt)
    np.testing.assert_array_equal(np.asarray(ns["t2m"]), t2m[0:10])
    printed = eval(capsys.readouterr().out)                           # the stats of the host path
    assert printed["bytes"] >= a.nbytes + wt.nbytes


@needs_nc
def test_xarray_block(tmp_path, monkeypatch):
    import xarray as xr
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(1)
    nc = _nc3("era5.nc", t2m=rng.normal(size=(30, 3, 4)).astype(np.float32))
    os.makedirs("era5")
    parts = [_nc3(f"era5/{i:02d}.nc", t2m=rng.normal(size=(4, 3, 4)).astype(np.float32), t0=4 * i)
             for i in range(2)]
    ns = _run(_on_cpu(_block(PY_HEADINGS[1]), 2), "xarray")
    xr.testing.assert_identical(ns["ds"].load(), nc)
    xr.testing.assert_identical(ns["day"], nc.isel(time=slice(0, 24)))
    assert ns["ens"].chunks                                           # dask-backed
    xr.testing.assert_identical(ns["ens"].load(), xr.concat(parts, "time"))


def test_array_dataset_block(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(2)
    os.makedirs("train")
    for s in range(2):                                                # 2 shards of 300: 600 samples
        np.save(f"train/x_{s}.npy", rng.normal(size=(300, 3)).astype(np.float32))
        np.save(f"train/y_{s}.npy", rng.integers(0, 10, 300).astype(np.int64))
    ns = _run(_on_cpu(_block(PY_HEADINGS[2]), 1), "ArrayDataset")
    # 600 samples an epoch in batches of 256 (the last one short), two epochs
    want = [f"{e} ({n}, 3) ({n},)" for e in range(2) for n in (256, 256, 88)]
    assert capsys.readouterr().out.splitlines() == want
    assert isinstance(ns["state"], dict) and ns["state"]


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")   # dcp.save in one process
def test_checkpoint_block(tmp_path, monkeypatch):
    import torch
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    monkeypatch.chdir(tmp_path)
    ns = _run(_on_cpu(_block(PY_HEADINGS[3]), 2), "checkpoints")
    want = {k: v.detach().clone() for k, v in ns["model"].state_dict().items()}
    got = load_file("step1000.safetensors")                          # safetensors reads ferry's file
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    assert all(torch.equal(ns["sd"][k], want[k]) for k in want)
    dcp_to_torch_save("ckpt/", "ckpt.pt")                             # torch's own DCP reader
    back = torch.load("ckpt.pt")
    assert all(torch.equal(back[k], want[k]) for k in want)


def test_install_block_is_covered_by_make():
    """The install block is not run here (`make` built what this file uses; `make test-install`
    runs `pip install .` into a temporary directory and checks its `ferry` command and `import
    ferry`); this checks that it names what those targets provide. CI (.ci/run) runs `make test`,
    README's test command."""
    block = _blocks(_section("## Install, demo, test"), "")
    assert len(block) == 1
    cmds = [ln.split("#")[0].strip() for ln in block[0].splitlines()]
    assert [c for c in cmds if c] == ["make", "make demo", "make test", "pip install .",
                                      "pip install '.[xarray,torch]'"]
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    makefile = (ROOT / "Makefile").read_text()
    assert all(re.search(r"^%s:" % t, makefile, re.M) for t in ("all", "demo", "test", "test-install"))
    assert "pip install" in (ROOT / "tools" / "test-install.sh").read_text()
    import tomllib
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == "ferry-io" and {"xarray", "torch"} <= set(project["optional-dependencies"])


# ---------------------------------------------------------------------------------------------
# the C block, compiled with README's link line

needs_lib = pytest.mark.skipif(not (BUILD / "libferry.a").exists(), reason="build/libferry.a not built (make lib)")


def _link_line():
    m = re.search(r"Link C programs with `build/libferry\.a \$\(cat build/libferry\.libs\)`", README)
    assert m, "README's link line changed: update this test"
    return [str(BUILD / "libferry.a")] + (BUILD / "libferry.libs").read_text().split()


def _compile_run(tmp_path, name, prelude, body, epilogue):
    """main() { prelude; body; epilogue }, the block's #include lines above it, linked as README says."""
    includes = [ln for ln in body.splitlines() if ln.startswith("#include")]
    body = "\n".join(ln for ln in body.splitlines() if not ln.startswith("#include"))
    assert includes == ["#include <ferry.h>"]
    src = tmp_path / f"{name}.c"
    src.write_text("#include <stdint.h>\n#include <stdio.h>\n#include <stdlib.h>\n" + "\n".join(includes)
                   + "\nint main(void) {\n" + prelude + "\n" + body + "\n" + epilogue + "\n}\n")
    exe = tmp_path / name
    cc = subprocess.run([os.environ.get("CC", "cc"), "-std=c11", "-Wall", "-Werror", "-Wno-unused-variable",
                         "-I", str(ROOT / "include"), str(src), "-o", str(exe)] + _link_line(),
                        capture_output=True, text=True)
    assert cc.returncode == 0, cc.stderr
    r = subprocess.run([str(exe)], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


@needs_lib
@needs_nc
def test_c_block(tmp_path, monkeypatch):
    # no GPU: the device buffers become host buffers, and only those two calls change
    block = _block("## C", "c").replace("ferry_cuda_buf(0, dptr, n)", "ferry_host_buf((void *)dptr, n)", 1)
    block = block.replace("ferry_cuda_buf(0, dptr2, m)", "ferry_host_buf((void *)dptr2, m)", 1)
    assert "ferry_cuda_buf" not in block, "README's C block changed: update the translation"
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(4)
    raw = rng.integers(0, 256, 1 << 20, dtype=np.uint8)
    raw.tofile("a.bin")
    t2m = rng.normal(size=(10, 721, 1440)).astype(np.float32)         # the shape the block selects from
    _nc3("era5.nc", t2m=t2m)                                          # big-endian on disk
    want = t2m[0:10, 0:721, 0:1440:2]
    n = 256 << 10
    prelude = (f"size_t n = {n}; uintptr_t dptr = (uintptr_t)malloc(n);\n"
               f"size_t m = {want.nbytes}; uintptr_t dptr2 = (uintptr_t)malloc(m);")
    epilogue = ('if (moved < 0) { fprintf(stderr, "%s\\n", ferry_errmsg(ctx)); return 1; }\n'
                'FILE *out = fopen("dst.bin", "wb"); fwrite((void *)dptr, 1, n, out); fclose(out);\n'
                'out = fopen("dst2.bin", "wb"); fwrite((void *)dptr2, 1, m, out); fclose(out);\n'
                "ferry_plan_destroy(plan); ferry_dataset_close(ds); ferry_file_close(f); ferry_ctx_destroy(ctx);\n"
                "return got == (int64_t)n && moved >= (int64_t)m ? 0 : 1;   /* moved: bytes read from the file */")
    _compile_run(tmp_path, "readme", prelude, block, epilogue)
    np.testing.assert_array_equal(np.fromfile("dst.bin", dtype=np.uint8), raw[:n])
    np.testing.assert_array_equal(np.fromfile("dst2.bin", dtype=np.float32).reshape(want.shape), want)


# ---------------------------------------------------------------------------------------------
# the reference docs README links to

DOCS = ROOT / "docs"


def _knobs_in_sources():
    """Every FERRY_* environment variable the sources read: their "FERRY_..." string literals
    (the library reads each through getenv or a table of such names; the Python package
    through os.environ)."""
    found = set()
    for top, exts in ((ROOT / "src", (".c", ".h")), (ROOT / "python" / "ferry", (".py", ".c", ".h"))):
        for path in top.rglob("*"):
            if path.suffix in exts:
                found |= set(re.findall(r'"(FERRY_[A-Z0-9_]+)"', path.read_text(errors="replace")))
    return found


def _knob_rows(doc, heading):
    table = _section(heading, (DOCS / doc).read_text())
    return {m for m in re.findall(r"^\| `(FERRY_[A-Z0-9_]+)` \|", table, re.M)}


def test_engine_md_lists_every_setting():
    """docs/engine.md's settings table names exactly the variables the sources read; the
    decoder's table in docs/decoding.md is part of it."""
    in_src = _knobs_in_sources()
    documented = _knob_rows("engine.md", "## Settings (`FERRY_*` environment variables)")
    assert in_src - documented == set(), "read by the sources, missing from docs/engine.md"
    assert documented - in_src == set(), "in docs/engine.md, read by no source"
    decoding = _knob_rows("decoding.md", "## Settings")
    assert decoding and decoding <= documented


def test_reference_docs_are_reference():
    """README, docs/engine.md and docs/decoding.md describe the code as it is: no run diary
    (sessions, rounds, times of day, dates), and no code block without a test (this file and
    test_docs_loops.py run the ones there are)."""
    diary = re.compile(r"\bsessions?\b|\b(first|second|third|fourth|fifth|\w+th) round\b|\b20\d\d-\d\d-\d\d\b"
                       r"|\b\d{1,2}:\d{2}( UTC| run| at\b|[–-]\d)", re.I)             # not slices: 0:10
    for name, text in (("README.md", README), ("docs/engine.md", (DOCS / "engine.md").read_text()),
                       ("docs/decoding.md", (DOCS / "decoding.md").read_text())):
        hits = [ln for ln in text.splitlines() if diary.search(ln)]
        assert not hits, f"{name}: run history belongs in git and BENCHMARKS.md: {hits}"
        if name != "README.md":
            assert not _blocks(text, "python") and not _blocks(text, "c"), f"{name}: an untested code block"


# ---------------------------------------------------------------------------------------------
# "## The command"

needs_cli = pytest.mark.skipif(not os.path.exists(FERRY), reason=f"{FERRY} not built (make cli)")


def _commands():
    lines = _block("## The command", "").splitlines()
    cmds = [ln[2:].split("#")[0].split() for ln in lines if ln.startswith("$ ")]
    assert len(cmds) == len(lines) and all(c[0] == "ferry" for c in cmds)
    return cmds


def _ferry(args, cwd):
    r = subprocess.run([FERRY, *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"ferry {' '.join(args)}: exit {r.returncode}\n{r.stdout}{r.stderr}"
    return r.stdout


@needs_cli
@pytest.mark.skipif(not has("zarr"), reason="writing the Zarr store needs zarr")
def test_command_lines(tmp_path):
    import json
    import zarr
    from safetensors.numpy import save_file
    save_file({"embed.weight": np.zeros((8, 4), np.float32), "head.bias": np.zeros(3, np.int64)},
              str(tmp_path / "model.safetensors"))
    root = zarr.open_group(str(tmp_path / "store.zarr"), mode="w")
    root.create_array("temp", shape=(6, 4), chunks=(3, 4), dtype="float32")[:] = 1.5
    root.create_group("sub").create_group("deep").create_array("q", shape=(1,), dtype="u1")
    (tmp_path / "data.bin").write_bytes(os.urandom(1 << 16))
    raw = (tmp_path / "model.safetensors").read_bytes()
    base = 8 + int.from_bytes(raw[:8], "little")                     # data follow the JSON header
    header = json.loads(raw[8:base])
    lo, hi = (base + o for o in header["embed.weight"]["data_offsets"])

    def store(out):
        (var,) = json.loads(out)["variables"]
        return (var["name"], var["shape"], var["chunks"], var["typestr"], var["codecs"]) == \
            ("temp", [6, 4], [3, 4], "<f4", "bytes zstd")

    # what each line of README says the command prints, checked on its output
    checks = {
        ("info", "model.safetensors"):                               # tensors: dtype, shape, byte ranges
            lambda out: re.search(r"embed\.weight +<f4 +\(8, 4\) +bytes \[%d, %d\)" % (lo, hi), out)
            and "head.bias" in out,
        ("info", "--json", "store.zarr"): store,                     # the same for machines
        ("info", "data.bin"):                                        # size and page-cache residency
            lambda out: "(65536 bytes)" in out and "in page cache" in out,
        ("bench", "--size", "4G"):                                   # every path beside the limits
            lambda out: "limit: parallel pread" in out and "ferry file -> host memory" in out
            and "page cache warm" in out and "paths used" in out,
        ("bench", "--records", "150528,8192"):                       # beside the parallel pread limit
            lambda out: "records of 150528 bytes" in out and "records of 8192 bytes" in out
            and "pread limit" in out,
        ("info",): lambda out: "CUDA:" in out and "cuFile:" in out and "GPU kernels:" in out,
        ("info", "--knobs"):                                         # every setting it checks
            lambda out: "FERRY_GPU_CALL" in out and "default" in out,
        ("info", "--depth", "2", "store.zarr"):                      # a group and its subgroups
            lambda out: "store.zarr: zarr" in out and "store.zarr/sub: zarr" in out
            and "store.zarr/sub/deep: zarr" in out,
        ("--help",): lambda out: "ferry info" in out and "ferry bench" in out,
    }
    # a test machine runs the benchmarks small: only sizes, counts and repetitions change, and the
    # cold reads are left out (as root they drop the whole machine's page cache: drop_caches)
    small = {("bench", "--size", "4G"): ["bench", "--size", "64M", "--reps", "1", "--no-cold"],
             ("bench", "--records", "150528,8192"): ["bench", "--records", "150528,8192", "--size", "16M",
                                                     "--count", "64", "--batch", "16", "--reps", "1"]}
    cmds = [tuple(c[1:]) for c in _commands()]
    assert sorted(cmds) == sorted(checks), "README's command lines changed: update this test"
    for cmd in cmds:
        out = _ferry(small.get(cmd, list(cmd)), tmp_path)
        assert checks[cmd](out), f"ferry {' '.join(cmd)} does not print what README says:\n{out}"
    assert not (tmp_path / "ferry-bench.bin").exists()               # bench removes its file,
    assert "stays for the next run" in _section("## The command")     # --records keeps its (README says so)
    assert (tmp_path / "ferry-records.bin").stat().st_size == 16 << 20
