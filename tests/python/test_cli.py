"""The `ferry` command's option parsing (getopt_long): --opt=value and
--opt value both work, bad values and unknown options exit 2 with a message,
and `ferry info` alone says which GPU kernel image this build carries."""
import json
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FERRY = os.environ.get("FERRY_BIN", os.path.join(ROOT, "build", "ferry"))

pytestmark = pytest.mark.skipif(not os.path.exists(FERRY), reason=f"{FERRY} not built (make cli)")


def run(*args):
    return subprocess.run([FERRY, *args], capture_output=True, text=True, timeout=120)


def test_equals_syntax_accepted_and_runs(tmp_path):
    assert run("bench", "--size=4G", "--help").returncode == 0
    r = run("bench", "--size=8M", "--reps=1", "--no-cold", "--no-latency", f"--file={tmp_path / 'b.bin'}",
            "--threads", "2", "--json")
    assert r.returncode == 0, r.stderr
    assert '"what"' in r.stdout and not (tmp_path / "b.bin").exists()


def test_records_reread_submits_the_datasets_flag(tmp_path):
    """--reread: the batches go as FERRY_REREAD jobs (as the datasets' do), and the run says so;
    its records of 1 MiB (AUTO's O_DIRECT size) are read through the page cache, cold or warm."""
    f = tmp_path / "r.bin"
    r = run("bench", "--records", "1M", "--size", "16M", "--count", "32", "--batch", "8", "--reps", "1",
            "--threads", "2", "--cold", "--reread", f"--file={f}")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "(FERRY_REREAD)" in r.stdout
    assert "read with O_DIRECT 0.00 GB" in r.stdout, r.stdout
    plain = run("bench", "--records", "1M", "--size", "16M", "--count", "32", "--batch", "8", "--reps", "1",
                "--threads", "2", "--cold", f"--file={f}")
    assert plain.returncode == 0 and "(FERRY_REREAD)" not in plain.stdout


@pytest.mark.parametrize("args,needle", [
    (("bench", "--threads", "abc"), "--threads: \"abc\""),
    (("bench", "--threads=0"), "--threads"),
    (("bench", "--threads=9999"), "--threads"),
    (("bench", "--reps", "3x"), "--reps"),
    (("bench", "--device=-1"), "--device"),
    (("bench", "--size=4Q"), "--size"),
    (("bench", "--size="), "--size"),
    (("bench", "--size"), "needs a value"),
    (("bench", "--bogus"), "unknown option --bogus"),
    (("bench", "stray"), "unexpected argument"),
    # the small-record benchmark parses as strictly (it took "--reps abc" as 1 before)
    (("bench", "--records", "4096", "--reps", "abc"), "--reps: \"abc\""),
    (("bench", "--records=4096", "--threads=0"), "--threads"),
    (("bench", "--records", "4096", "--device", "x"), "--device"),
    (("bench", "--records", "4096", "--count", "10", "--batch", "20"), "below --batch"),
    (("bench", "--records", "4096", "--bogus"), "unknown option --bogus"),
    # record sizes are sizes like any other ("4K,abc" once looped forever at the K)
    (("bench", "--records", "4K,abc"), "--records: \"abc\""),
    (("bench", "--records", ","), "--records"),
    (("info", "--bogus", "x"), "unknown option --bogus"),
    (("info", "-q"), "unknown option -q"),
    (("frobnicate",), "unknown command"),
])
def test_bad_options_exit_2_with_a_message(args, needle):
    r = run(*args)
    assert r.returncode == 2, (args, r.returncode, r.stdout, r.stderr)
    assert needle in r.stderr


def test_info_without_path_names_the_kernel_source():
    r = run("info")
    assert r.returncode == 0 and "GPU kernels:" in r.stdout
    d = json.loads(run("info", "--json").stdout)
    assert d["kernels"] in ("embedded fatbin", "none") and d["version"]


def test_info_knobs_lists_the_table():
    """`ferry info --knobs`: the FERRY_* tuning variables ferry checks, with their grammar, default
    and doc; --json gives the same rows and the value of each one set."""
    r = run("info", "--knobs")
    assert r.returncode == 0 and "FERRY_GPU_SLOTS" in r.stdout and "default" in r.stdout
    env = dict(os.environ, FERRY_GPU_TAIL="off")
    d = json.loads(subprocess.run([FERRY, "info", "--knobs", "--json"], capture_output=True, text=True,
                                  env=env).stdout)
    rows = {x["name"]: x for x in d}
    assert rows["FERRY_GPU_TAIL"]["value"] == "off" and rows["FERRY_GPU_SLOTS"]["value"] is None
    assert all(x["doc"] and x["default"] for x in d)


def test_info_codecs_is_the_table_in_docs():
    """`ferry info --codecs`: which decoder takes each codec under each policy, printed from the
    code that decides; docs/decoding.md carries the same table, row for row (issue 38 item 18:
    gzip stays on the CPU and, under decode="gpu", is counted as a fallback)."""
    r = run("info", "--codecs")
    assert r.returncode == 0, r.stderr
    rows = r.stdout.splitlines()
    assert rows[0].startswith("| codec | `auto` | `gpu` | `cpu` |") and len(rows) == 11
    gzip = next(x for x in rows if x.startswith("| gzip |"))
    assert "| CPU | CPU, counted in gpu_cpu_fallbacks |" in gzip
    assert next(x for x in rows if x.startswith("| zstd |")).startswith("| zstd | GPU | GPU | CPU |")
    docs = open(os.path.join(ROOT, "docs", "decoding.md")).read()
    assert r.stdout in docs, "docs/decoding.md's codec table differs from `ferry info --codecs`: paste it again"
    d = json.loads(subprocess.run([FERRY, "info", "--codecs", "--json"], capture_output=True, text=True).stdout)
    assert [x["codec"] for x in d] == [x.split(" | ")[0][2:] for x in rows[2:]]


def test_info_options_after_paths(tmp_path):
    np = pytest.importorskip("numpy")
    np.save(tmp_path / "a.npy", np.zeros(3, np.float32))
    r = run("info", str(tmp_path / "a.npy"), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["variables"][0]["dtype"] == "f4"


def test_bench_cold_drops_only_its_own_file(tmp_path):
    """Cold runs drop the bench file's pages (posix_fadvise), never the machine's whole page
    cache, unless --drop-caches asks for it: traced, no write to /proc/sys/vm/drop_caches."""
    import shutil
    strace = shutil.which("strace")
    if not strace:
        pytest.skip("strace is not installed")
    args = ["bench", "--size=8M", "--reps=1", "--no-latency", f"--file={tmp_path / 'c.bin'}", "--threads", "2"]
    traced = subprocess.run([strace, "-f", "-e", "trace=openat,fadvise64", FERRY, *args],
                            capture_output=True, text=True, timeout=300)
    assert traced.returncode == 0, traced.stdout + traced.stderr
    assert "FADV_DONTNEED" in traced.stderr
    assert "drop_caches" not in traced.stderr
    assert "--drop-caches" in run("bench", "--help").stdout
    if os.geteuid() == 0:
        opted = subprocess.run([strace, "-f", "-e", "trace=openat", FERRY, *args, "--drop-caches"],
                               capture_output=True, text=True, timeout=300)
        assert opted.returncode == 0 and "/proc/sys/vm/drop_caches" in opted.stderr


def _dcp_dirs(tmp_path):
    torch = pytest.importorskip("torch")
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    import warnings
    sd = {"w": torch.arange(12.0).reshape(3, 4), "b": torch.zeros(5, dtype=torch.bfloat16), "step": 7}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(sd, storage_writer=dcp.FileSystemWriter(str(tmp_path / "torch_dcp")))
        from ferry.checkpoint import FerryWriter
        dcp.save(sd, storage_writer=FerryWriter(str(tmp_path / "ferry_dcp")))
    return tmp_path / "torch_dcp", tmp_path / "ferry_dcp"


def test_info_describes_dcp_directories(tmp_path):
    """torch's and ferry's DCP checkpoints: every entry with its dtype and shape, the data files'
    bytes; read by a pickle reader that runs nothing (below: a crafted .metadata)."""
    for d in _dcp_dirs(tmp_path):
        r = run("info", str(d))
        assert r.returncode == 0, r.stderr
        assert "torch.distributed.checkpoint" in r.stdout
        assert "2 tensors, 1 bytes item" in r.stdout, r.stdout
        assert "float32" in r.stdout and "(3, 4)" in r.stdout and "bfloat16" in r.stdout
        j = json.loads(run("info", "--json", str(d)).stdout)
        assert j["format"] == "dcp" and j["total_bytes"] == sum(j["files"].values()) > 0
        ent = {e["name"]: e for e in j["entries"]}
        assert ent["w"]["shape"] == [3, 4] and ent["w"]["dtype"] == "float32" and ent["step"]["kind"] == "bytes"


def test_info_dcp_metadata_runs_no_code(tmp_path):
    import pickle

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'pwned'}",))
    d = tmp_path / "evil"
    d.mkdir()
    (d / ".metadata").write_bytes(pickle.dumps(Evil(), protocol=4))
    r = run("info", str(d))
    assert r.returncode == 1 and "Metadata" in r.stderr and ".metadata" in r.stderr
    assert not (tmp_path / "pwned").exists()
    (d / ".metadata").write_bytes(b"\x80\x04\x95garbage")
    r = run("info", str(d))
    assert r.returncode == 1 and "pickle byte" in r.stderr


def test_info_describes_hf_checkpoint_directories(tmp_path):
    torch = pytest.importorskip("torch")
    st = pytest.importorskip("safetensors.torch")
    st.save_file({"a": torch.zeros(4, 4), "b": torch.ones(3)}, str(tmp_path / "model-00001-of-00002.safetensors"))
    st.save_file({"c": torch.zeros(2, dtype=torch.bfloat16)}, str(tmp_path / "model-00002-of-00002.safetensors"))
    index = {"metadata": {"total_size": 80},
             "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
                            "c": "model-00002-of-00002.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    r = run("info", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "3 tensors, 80 bytes in 2 files" in r.stdout, r.stdout
    assert "model-00002-of-00002.safetensors" in r.stdout
    one = tmp_path / "one"
    one.mkdir()
    st.save_file({"x": torch.ones(2)}, str(one / "model.safetensors"))
    r = run("info", str(one))
    assert r.returncode == 0 and "1 tensor, 8 bytes in 1 file" in r.stdout, r.stdout


def test_info_zarr_groups_to_a_depth(tmp_path):
    zarr = pytest.importorskip("zarr")
    g = zarr.open_group(str(tmp_path / "z.zarr"), mode="w")
    g.create_array("x", shape=(4,), dtype="f4")
    sub = g.create_group("sub")
    sub.create_array("y", shape=(2, 3), dtype="i2")
    sub.create_group("deep").create_array("q", shape=(1,), dtype="u1")
    r = run("info", str(tmp_path / "z.zarr"))
    assert "z.zarr/sub: zarr" in r.stdout and "z.zarr/sub/deep" not in r.stdout.split("groups")[-1].split("\n", 1)[-1]
    r = run("info", "--depth", "2", str(tmp_path / "z.zarr"))
    assert "z.zarr/sub/deep: zarr" in r.stdout
    assert "z.zarr/sub" not in run("info", "--depth=0", str(tmp_path / "z.zarr")).stdout.replace('["sub"]', "")
    j = json.loads(run("info", "--json", "--depth", "2", str(tmp_path / "z.zarr")).stdout)
    assert j["subgroups"][0]["subgroups"][0]["variables"][0]["name"] == "q"
    assert run("info", "--depth", "-1", str(tmp_path)).returncode == 2
