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


def test_info_options_after_paths(tmp_path):
    np = pytest.importorskip("numpy")
    np.save(tmp_path / "a.npy", np.zeros(3, np.float32))
    r = run("info", str(tmp_path / "a.npy"), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["variables"][0]["dtype"] == "f4"
