"""What Zarr metadata claims costs nothing until chunks exist (issue 36.4).

A 300-byte zarr.json may claim 2^40 one-element chunks. Reading 10^7 elements
of such a store, none of whose chunks exist, plans a single fill (it took a
plan record per chunk, 12 GB, and 56 s): run in a subprocess under a 4 GiB
address-space limit, it must finish in bounded time with the fill value; the
whole array, 8 TiB, is a FerryError naming the file and the size the result
would have, not a MemoryError with no message."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

import ferry

ZARR_JSON = {"zarr_format": 3, "node_type": "array", "shape": [2 ** 40], "data_type": "float64",
             "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [1]}},
             "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
             "fill_value": 1.5, "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}]}
ZARRAY = {"zarr_format": 2, "shape": [2 ** 40], "chunks": [1], "dtype": "<f8", "fill_value": 1.5, "order": "C",
          "filters": None, "compressor": None}

CHILD = textwrap.dedent("""
    import resource, sys, time
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    import numpy as np
    import ferry
    t = time.monotonic()
    a = ferry.read(sys.argv[1], selection=(slice(5, 5 + 10 ** 7),))
    assert a.shape == (10 ** 7,) and a.dtype == np.float64, (a.shape, a.dtype)
    assert bool(np.all(a == 1.5)), "not the fill value"
    print("seconds", time.monotonic() - t)
""")


def _store(tmp_path, v):
    p = str(tmp_path / f"claims{v}.zarr")
    os.makedirs(p)
    name, doc = ("zarr.json", ZARR_JSON) if v == 3 else (".zarray", ZARRAY)
    with open(os.path.join(p, name), "w") as f:
        json.dump(doc, f)
    return p


@pytest.mark.parametrize("v", [2, 3])
def test_claimed_chunks_read_under_a_memory_limit(tmp_path, v):
    p = _store(tmp_path, v)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, "-c", CHILD, p], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert float(r.stdout.split()[-1]) < 60


@pytest.mark.parametrize("v", [2, 3])
def test_whole_claimed_array_says_how_large(tmp_path, v):
    p = _store(tmp_path, v)
    with pytest.raises(ferry.FerryError) as ei:
        ferry.read(p)
    msg = str(ei.value)
    assert p in msg and str(8 * 2 ** 40) in msg and "8.0 TiB" in msg, msg
