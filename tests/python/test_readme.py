"""README.md's code runs as written: every ```python block, every ```c block and the `ferry`
command lines of "## The command".

Each block is taken from README.md (by the heading it sits under), not copied here, so a README
edit that breaks a snippet fails this test. What a machine without a GPU cannot run is
translated, and only that — device=0 / "cuda" -> "cpu", ferry_cuda_buf -> ferry_host_buf — and
every translation must match (so an edited snippet fails loudly instead of running something
else). The names a snippet leaves to the reader (model, torch_tensor, dptr, n, g, stream...) are
small real objects given here; the files it names are written in a temporary directory by the
reference writers (numpy, safetensors, xarray's netCDF4 engine, zarr). Results are checked
against those libraries where that is cheap.

Not run here: the install block (`make`, `make demo`, `make test`) and the pip block
(`pip install .`, `pip install '.[xarray,torch]'`): `make test-install` runs `pip install .`
into a temporary directory and checks its `ferry` and `import ferry`, and `make` itself is
what builds everything this test uses."""
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


def _section(heading):
    """README's text from the line `heading` to the next heading."""
    at = README.index("\n" + heading + "\n")
    rest = README[at + len(heading) + 2:]
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


def _translate(code, subs):
    """Apply (old, new, count): `old` must occur exactly `count` times."""
    for old, new, count in subs:
        assert code.count(old) == count, \
            f"README snippet has {code.count(old)} x {old!r}, expected {count}: update the translation"
        code = code.replace(old, new)
    return code


def _exec(code, names, what):
    exec(compile(code, f"<README {what}>", "exec"), names)
    return names


def _exec_lines(code, names, what, after=None):
    """Run a block whose every line is a whole statement one line at a time, calling
    after(i, names) after line i, so that what each line makes can be checked."""
    lines = [ln for ln in code.splitlines() if ln.strip()]
    for i, ln in enumerate(lines):
        _exec(ln, names, f"{what}, line {i + 1}")
        if after:
            after(i, names)
    return lines


PY_HEADINGS = ["## Python", '### xarray: `engine="ferry"`', "### PyTorch: `ferry.torch.ArrayDataset`",
               "### Training on xarray data: `ferry.torch.XarrayDataset` and `ferry.dali`",
               "### Checkpoints: `ferry.checkpoint`"]


def test_every_python_block_is_tested():
    """A ```python block added to README without a test here fails."""
    assert len(_blocks(README, "python")) == len(PY_HEADINGS)
    for h in PY_HEADINGS:
        _block(h)
    assert len(_blocks(README, "c")) == 2 and len(_blocks(_section("## The C API"), "c")) == 2
    assert len(_blocks(README, "")) == 4                             # install, pip, the command, layout


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
def test_python_block(tmp_path, monkeypatch):
    import torch
    from safetensors.numpy import save_file
    import ferry
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    a = rng.normal(size=(12, 5)).astype(np.float32)
    np.save("a.npy", a)
    wt = rng.normal(size=(4, 6)).astype(np.float32)
    save_file({"w": wt, "b": np.arange(6, dtype=np.int64)}, "m.safetensors")
    t2m = rng.normal(size=(16, 3, 4)).astype(np.float32)
    _nc3("era5.nc", t2m=t2m)
    t = rng.normal(size=(6, 3, 4)).astype(np.float32)
    _nc3("b.nc", t=t)
    import xarray as xr
    xr.Dataset({"t2m": (("time", "lat", "lon"), t2m)}).to_netcdf(
        "era5_nc4.nc", engine="netcdf4", encoding={"t2m": {"zlib": True, "chunksizes": (4, 3, 4)}})

    code = _translate(_block("## Python"), [('"w", device=0)', '"w", device="cpu")', 1)])
    torch_tensor = torch.empty(a.shape, dtype=torch.float32)
    opened = []                                                       # each `f` the block opens

    def after(i, ns):
        if ns.get("f") is not None and all(ns["f"] is not g for g in opened):
            opened.append(ns["f"])
    ns = {"torch_tensor": torch_tensor}
    assert len(_exec_lines(code, ns, "## Python", after)) == 8
    assert len(opened) == 2 and opened[1] is ns["f"]
    assert "t2m" in opened[0].variables                               # ferry.open("era5.nc"): netCDF classic
    np.testing.assert_array_equal(np.asarray(opened[0]["t2m"][0:10]), t2m[0:10])
    np.testing.assert_array_equal(ns["x"], a)
    np.testing.assert_array_equal(np.asarray(ns["w"]), wt)
    np.testing.assert_array_equal(np.asarray(ns["xs"][0]), a)
    np.testing.assert_array_equal(np.asarray(ns["xs"][1]), t[0:4])
    np.testing.assert_array_equal(torch_tensor.numpy(), a)            # filled in place
    assert "t2m" in ns["f"].variables                                 # the netCDF-4 file, through h5py
    np.testing.assert_array_equal(np.asarray(ns["f"]["t2m"][0:10]), t2m[0:10])
    assert ferry.stats()["host"]["bytes"] > 0


@needs_nc
@pytest.mark.skipif(not has("zarr"), reason="writing the Zarr store needs zarr")
@pytest.mark.filterwarnings("ignore:Consolidated metadata is currently not part")
def test_xarray_block(tmp_path, monkeypatch):
    import xarray as xr
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(1)
    nc = _nc3("era5.nc", t2m=rng.normal(size=(12, 3, 4)).astype(np.float32))
    surface = xr.Dataset({"sp": (("time", "lat", "lon"), rng.normal(size=(5, 3, 4)).astype(np.float32))})
    surface.to_zarr("era5.zarr", group="surface", mode="w")
    parts = [_nc3(f"era5_{i}.nc", t2m=rng.normal(size=(4, 3, 4)).astype(np.float32), t0=4 * i) for i in range(2)]

    code = _translate(_block('### xarray: `engine="ferry"`'),
                      [('engine="ferry", device=0)', 'engine="ferry", device="cpu")', 1),
                       ("device=0, parallel=True", 'device="cpu", parallel=True', 1)])
    # each line is one statement: run them one by one to check every `ds` the block makes
    made = []
    _exec_lines(code, {}, "xarray", lambda i, ns: made.append(ns.get("ds")))
    assert len(made) == 6 and made[0] is None                         # the import line
    xr.testing.assert_identical(made[1].load(), nc)
    xr.testing.assert_identical(made[2].load(), xr.open_zarr("era5.zarr", group="surface").load())
    assert made[3].chunks                                             # dask-backed
    xr.testing.assert_identical(made[3].load(), xr.concat(parts, "time"))
    xr.testing.assert_identical(made[4].load(), nc)


def test_array_dataset_block(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(2)
    os.makedirs("train")
    for s in range(2):                                                # 2 shards of 300: 2 full batches of 256
        np.save(f"train/x_{s}.npy", rng.normal(size=(300, 3)).astype(np.float32))
        np.save(f"train/y_{s}.npy", rng.integers(0, 10, 300).astype(np.int64))
    code = _translate(_block("### PyTorch: `ferry.torch.ArrayDataset`"),
                      [('device="cuda"', 'device="cpu"', 1), ("range(90)", "range(2)", 1),
                       ("        ...\n", "        seen.append({k: tuple(v.shape) for k, v in batch.items()})\n", 1)])
    ns = _exec(code, {"seen": []}, "ArrayDataset")
    # 600 samples an epoch in batches of 256 (the last one short), two epochs
    assert ns["seen"] == [{"x": (n, 3), "y": (n,)} for n in (256, 256, 88)] * 2
    assert isinstance(ns["state"], dict) and ns["state"]


@needs_nc
@pytest.mark.skipif(not has("nvidia.dali"), reason="the block builds a DALI pipeline")
def test_xarray_dataset_block(tmp_path, monkeypatch):
    import xarray as xr
    import ferry.dali
    import ferry.torch
    from nvidia.dali import fn
    from test_docs_loops import _era5_files
    monkeypatch.chdir(tmp_path)
    _era5_files(np.random.default_rng(3))                             # era5/00.nc, era5/01.nc: 24 steps
    code = _translate(_block("### Training on xarray data: `ferry.torch.XarrayDataset` and `ferry.dali`"),
                      [('device="cuda"', 'device="cpu"', 1),
                       ("    ...\n", "    seen.append({k: tuple(v.shape) for k, v in batch.items()})\n", 1)])
    ns = _exec(code, {"xr": xr, "ferry": ferry, "fn": fn, "seen": []}, "XarrayDataset")
    # 24 steps, 2 input steps, target at lead 6: 17 samples, batches of 8; t2m (1) and z (3 levels)
    assert [b["x"] for b in ns["seen"]] == [(8, 8, 6, 8), (8, 8, 6, 8), (1, 8, 6, 8)]
    assert [b["y"] for b in ns["seen"]] == [(8, 4, 6, 8), (8, 4, 6, 8), (1, 4, 6, 8)]
    x, y = ns["pipe"].run()                                           # the pipeline runs, flipped
    assert len(x) == 8 and x.as_array().shape == (8, 8, 6, 8) and y.as_array().shape == (8, 4, 6, 8)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")   # dcp.save in one process, as README
def test_checkpoint_block(tmp_path, monkeypatch):
    import torch
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    import ferry.checkpoint
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    want = {k: v.clone() for k, v in model.state_dict().items()}
    code = _translate(_block("### Checkpoints: `ferry.checkpoint`"),
                      [('device="cuda:0"', 'device="cpu"', 1)])

    def after(i, ns):
        if i == 2:                                                    # saved and loaded: now spoil the
            with torch.no_grad():                                     # model, so that load_into shows
                for p in model.parameters():                          # that it restores it
                    p.zero_()
        if i == 3:
            assert all(torch.equal(v, want[k]) for k, v in model.state_dict().items())
    ns = {"model": model, "dcp": dcp}
    assert len(_exec_lines(code, ns, "checkpoints", after)) == 6
    ns["fut"].result()
    for path in ("step1000.safetensors", "step2000.safetensors"):
        got = load_file(path)                                         # safetensors reads ferry's files
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    assert all(torch.equal(ns["sd"][k], want[k]) for k in want)
    dcp_to_torch_save("ckpt/", "ckpt.pt")                             # torch's own reader
    back = torch.load("ckpt.pt")
    assert all(torch.equal(back[k], want[k]) for k in want)


def test_install_blocks_are_covered_by_make():
    """The install and pip blocks are not run here (`make` built what this file uses; `make
    test-install` runs `pip install .` into a temporary directory and checks its `ferry` command
    and `import ferry`); this checks that they name what those targets provide."""
    make = [ln.split("#")[0].strip() for ln in _blocks(_section("## Install, demo, test"), "")[0].splitlines()]
    assert [c for c in make if c] == ["make", "make demo", "make test"]
    makefile = (ROOT / "Makefile").read_text()
    assert all(re.search(r"^%s:" % t, makefile, re.M) for t in ("all", "demo", "test", "test-install"))
    pip = [ln.split("#")[0].strip() for ln in _blocks(_section("### pip"), "")[0].splitlines()]
    assert pip == ["pip install .", "pip install '.[xarray,torch]'"]
    assert "pip install" in (ROOT / "tools" / "test-install.sh").read_text()
    import tomllib
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {"xarray", "torch"} <= set(extras)


# ---------------------------------------------------------------------------------------------
# the C API blocks, compiled with README's link line

needs_lib = pytest.mark.skipif(not (BUILD / "libferry.a").exists(), reason="build/libferry.a not built (make lib)")


def _link_line():
    m = re.search(r"Link with `build/libferry\.a ([^`]*)` \(add `(-l\w+)` when the build\s+found (\w+)\)",
                  _section("## The C API"))
    assert m, "README's link line changed: update this test"
    libs = m.group(1).split()
    # "when the build found libdeflate": the archive says whether it did
    nm = subprocess.run(["nm", "-u", str(BUILD / "libferry.a")], capture_output=True, text=True).stdout
    if re.search(r"\b%s_" % m.group(3), nm):
        libs.append(m.group(2))
    return [str(BUILD / "libferry.a")] + libs


def _compile_run(tmp_path, name, prelude, body, epilogue):
    """main() { prelude; body; epilogue }, README's #include lines above it, linked as README says."""
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
def test_c_engine_block(tmp_path):
    block = _blocks(_section("## The C API"), "c")[0]
    # no GPU: the device buffers become host buffers, and only those three calls change
    block = _translate(block, [("ferry_cuda_buf(0, dptr, n)", "ferry_host_buf((void *)dptr, n)", 3)])
    mark = "/* many extents, many files, one job: plans */"
    assert block.count(mark) == 1
    head, tail = block.split(mark)
    rng = np.random.default_rng(4)
    a, b = rng.integers(0, 256, 1 << 20, dtype=np.uint8), rng.integers(0, 256, 1 << 20, dtype=np.uint8)
    a.tofile(tmp_path / "a.bin")
    b.tofile(tmp_path / "b.bin")
    n, off0, off1 = 256 << 10, 8192, 4096
    len0 = len1 = n // 2
    prelude = (f"size_t n = {n}; uintptr_t dptr = (uintptr_t)malloc(n);\n"
               f"int64_t off0 = {off0}, len0 = {len0}, off1 = {off1}, len1 = {len1};\n"
               "ferry_file *g; void *stream = NULL;   /* the legacy default stream */")
    # g: the second file of the plan, opened as the block opens f
    body = head + '\nif (ferry_file_open(ctx, "b.bin", FERRY_READ, &g) < 0) return 1;\n' + mark + tail
    epilogue = ('FILE *out = fopen("dst.bin", "wb"); fwrite((void *)dptr, 1, n, out); fclose(out);\n'
                'printf("%lld %lld %llu\\n", (long long)got, (long long)bytes,\n'
                '       (unsigned long long)st.path[FERRY_PATH_HOST].bytes);\n'
                "ferry_plan_destroy(plan); ferry_file_close(f); ferry_file_close(g); ferry_ctx_destroy(ctx);\n"
                "return got == (int64_t)n && bytes == (int64_t)n ? 0 : 1;")
    got, moved, host = map(int, _compile_run(tmp_path, "engine", prelude, body, epilogue).split())
    assert got == moved == n and host == 2 * n                        # the pread, then the plan
    dst = np.fromfile(tmp_path / "dst.bin", dtype=np.uint8)
    np.testing.assert_array_equal(dst, np.concatenate([a[off0:off0 + len0], b[off1:off1 + len1]]))


@needs_lib
@needs_nc
def test_c_dataset_block(tmp_path, monkeypatch):
    block = _blocks(_section("## The C API"), "c")[1]
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(5)
    t2m = rng.normal(size=(10, 721, 1440)).astype(np.float32)        # the shape the block selects from
    _nc3("era5.nc", t2m=t2m)                                          # big-endian on disk
    want = t2m[0:10, 0:721, 0:1440:2]
    prelude = ("ferry_ctx *ctx; ferry_plan *plan;\n"
               "if (ferry_ctx_create(&ctx, NULL) < 0 || ferry_plan_create(&plan) < 0) return 1;\n"
               f"size_t size = {want.nbytes}; void *host = malloc(size);\n"
               "ferry_buf dst = ferry_host_buf(host, size);")
    epilogue = ('if (v < 0) { fprintf(stderr, "%s\\n", ferry_errmsg(ctx)); return 1; }\n'
                "int64_t moved = ferry_run(ctx, plan, NULL);\n"
                'if (moved < 0) { fprintf(stderr, "%s\\n", ferry_errmsg(ctx)); return 1; }\n'
                'FILE *out = fopen("dst.bin", "wb"); fwrite(host, 1, size, out); fclose(out);\n'
                "ferry_plan_destroy(plan); ferry_dataset_close(ds); ferry_ctx_destroy(ctx);\n"
                "return 0;")
    _compile_run(tmp_path, "dataset", prelude, "#include <ferry.h>\n" + block, epilogue)
    np.testing.assert_array_equal(np.fromfile(tmp_path / "dst.bin", dtype=np.float32).reshape(want.shape), want)


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
        ("--help",): lambda out: "ferry info" in out and "ferry bench" in out,
    }
    # a dev box runs the benchmarks small: only sizes, counts and repetitions change, and the
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
