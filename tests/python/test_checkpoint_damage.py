"""Damaged checkpoints are refused with a FerryError naming the file (issue 15 item 0b,
issue 16 items 5 and 6): header-length flips (the C parser's checks, reached unchanged),
crc32c=True covering the header's structure and values, strict and bounded tree decoding."""
import json
import struct

import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

from ferry import checkpoint as ck  # noqa: E402
from ferry.checkpoint import FerryError  # noqa: E402


def _header(p):
    data = p.read_bytes()
    n, = struct.unpack("<Q", data[:8])
    return data, n


def _st_refuses(q):
    try:
        safetensors_torch.load_file(str(q))
    except Exception:
        return True
    return False


@pytest.mark.parametrize("writer", ["ferry", "safetensors"])
def test_header_length_bit_flips_refused(tmp_path, writer):
    sd = {"a": torch.arange(3000, dtype=torch.float32), "b": torch.ones(7, dtype=torch.int16)}
    p = tmp_path / "good.safetensors"
    if writer == "ferry":
        ck.save(sd, p)
    else:
        safetensors_torch.save_file(sd, str(p))
    data, n = _header(p)
    for bit in range(64):
        bad = bytearray(data)
        bad[bit // 8] ^= 1 << (bit % 8)
        q = tmp_path / ("flip%d.safetensors" % bit)
        q.write_bytes(bad)
        assert _st_refuses(q), bit          # the reference refuses every one of them
        with pytest.raises(FerryError, match=str(q.name)):
            ck.load(q)
        with pytest.raises(FerryError, match=str(q.name)):
            with ck.safe_open(q) as f:
                f.get_tensor("a")


def _flip_in_tree(p, old, new):
    data, n = _header(p)
    hdr = data[8:8 + n]
    assert hdr.count(old) == 1, (old, hdr[:300])
    hdr = hdr.replace(old, new)
    q = p.with_name("flipped-" + p.name)
    q.write_bytes(data[:8] + hdr + data[8 + n:])
    return q


def test_crc_covers_tree_values(tmp_path):
    sd = {"model": {"w": torch.randn(4, 4)}, "optim": {"param_groups": [{"lr": 0.5}]},
          "step": 1000}
    p = tmp_path / "c.safetensors"
    ck.save(sd, p, crc32c=True)
    assert ck.load(p)["optim"]["param_groups"][0]["lr"] == 0.5
    q = _flip_in_tree(p, b'\\"lr\\",0.5', b'\\"lr\\",8.5')   # one bit: '0' -> '8'
    with pytest.raises(FerryError, match="flipped-c.safetensors.*CRC32C"):
        ck.load(q)
    with pytest.raises(FerryError, match="CRC32C"):
        ck.safe_open(q)
    q = _flip_in_tree(p, b'\\"step\\"', b'\\"stup\\"')       # a renamed key
    with pytest.raises(FerryError, match="CRC32C"):
        ck.load(q)
    assert ck.load(q, verify=False)["stup"] == 1000        # verify=False: no checks at all
    # without crc32c the flip is read as data: that is what crc32c=True is for
    p2 = tmp_path / "nocrc.safetensors"
    ck.save(sd, p2)
    q2 = _flip_in_tree(p2, b'\\"lr\\",0.5', b'\\"lr\\",8.5')
    assert ck.load(q2)["optim"]["param_groups"][0]["lr"] == 8.5


def test_crc_covers_tensor_names_and_shapes(tmp_path):
    sd = {"layer.weight": torch.randn(6, 4), "layer.bias": torch.randn(4)}
    p = tmp_path / "n.safetensors"
    ck.save(sd, p, crc32c=True, metadata={"note": "x"})
    for old, new in [(b'"layer.bias"', b'"layer.bia3"'), (b'"note":"x"', b'"note":"y"'),
                     (b'"shape":[6,4]', b'"shape":[4,6]')]:
        q = _flip_in_tree(p, old, new)
        with pytest.raises(FerryError, match="CRC32C"):
            ck.load(q)


def test_crc_sharded_index_covered(tmp_path):
    sd = {"a": torch.randn(100), "b": torch.randn(100), "cfg": {"lr": 0.5}}
    p = tmp_path / "s.safetensors"
    ck.save(sd, p, crc32c=True, max_shard_size=500)
    idx = tmp_path / "s.safetensors.index.json"
    got = ck.load(p)
    assert got["cfg"]["lr"] == 0.5
    text = idx.read_text()
    assert text.count('\\"lr\\",0.5') == 1
    idx.write_text(text.replace('\\"lr\\",0.5', '\\"lr\\",8.5'))
    with pytest.raises(FerryError, match="index.json.*CRC32C"):
        ck.load(p)


def _with_tree(tmp_path, tree_text, name="t.safetensors"):
    p = tmp_path / name
    safetensors_torch.save_file({"x": torch.ones(2)}, str(p),
                                metadata={"ferry.tree": tree_text})
    return p


@pytest.mark.parametrize("tree,where", [
    ('{"d":[["a",{"f":"zero"}]]}', "at a"),
    ('{"d":[["a",{"dt":"nonsense"}]]}', "at a"),
    ('{"d":[["a",{"b":"!!!notbase64"}]]}', "at a"),
    ('{"d":[["a",{"np":["<i1",300]}]]}', "at a"),
    ('{"d":[["a",{"np":["|O",1]}]]}', "at a"),
    ('{"d":[["a",{"np":"x"}]]}', "at a"),
    ('{"d":[["a",{"S":[1,"x"]}]]}', "at a"),
    ('{"d":[["a",{"T":"nope"}]]}', "at a"),
    ('{"d":[["a",{"T":5}]]}', "at a"),
    ('{"d":[["a",{"dev":"warp:9"}]]}', "at a"),
    ('{"d":[["a",{"l":5}]]}', "at a"),
    ('{"d":[["a",{"zz":1}]]}', "at a"),
    ('{"d":[["a",{"d":[[{"l":[]},1]]}]]}', "at a"),
    ('{"d":[["a",{"nd":["x","<f4x"]}]]}', "at a"),
    ('{"d":[["a",{"nd":["x","<i8"]}]]}', "at a"),
    ('{"d":[["a"]]}', "at <root>"),
    ('[1,2', "not JSON"),
    ('{"d":[["a",{"f":"nan","x":1}]]}', "at a"),
])
def test_damaged_tree_values_raise_ferry_error(tmp_path, tree, where):
    p = _with_tree(tmp_path, tree)
    with pytest.raises(FerryError) as ei:
        ck.load(p)
    msg = str(ei.value)
    assert "t.safetensors" in msg and where in msg, msg


def test_deep_tree_bounded(tmp_path):
    for depth in (600, 100000):
        p = _with_tree(tmp_path, '{"l":[' * depth + "1" + "]}" * depth, "deep%d.safetensors" % depth)
        with pytest.raises(FerryError, match="deep%d.safetensors.*(nested|deeper)" % depth):
            ck.load(p)
    ok = {"k": 1}
    for _ in range(150):                       # what save writes, save can read back
        ok = {"k": ok}
    p = tmp_path / "ok.safetensors"
    ck.save({"t": torch.ones(1), "n": ok}, p)
    got = ck.load(p)["n"]
    for _ in range(150):
        got = got["k"]
    assert got == {"k": 1}


@pytest.mark.parametrize("shape", [[0, 2 ** 63 - 1, 2 ** 63 - 1], [2 ** 63 - 1, 0, 3, 2 ** 62]])
def test_zero_size_shapes_torch_cannot_lay_out(tmp_path, shape):
    h = json.dumps({"x": {"dtype": "F32", "shape": shape, "data_offsets": [0, 0]}}).encode()
    p = tmp_path / "z.safetensors"
    p.write_bytes(struct.pack("<Q", len(h)) + h)
    # refused by the C parser (strides overflow) or, where it lets the shape through, by
    # ferry.checkpoint before torch.empty: a FerryError naming the file and the tensor
    with pytest.raises(FerryError, match="z.safetensors: (byte \\d+: tensor \"x\"|tensor 'x' of shape)"):
        ck.load(p)
    with pytest.raises(FerryError, match="z.safetensors"):
        with ck.safe_open(p) as f:
            f.get_slice("x")[:]
