"""FerryReader plans every box of a stored tensor through the C planner
(ferry_plan_array, issue 10 item 1): a load planner asking for sub-boxes of the
stored tensors (what resharding asks for) gets bytes equal to those
torch.distributed.checkpoint's own FileSystemReader gives on a directory its
FileSystemWriter wrote, for boxes that cut leading, trailing and middle
dimensions, 0-d and 1-element tensors, empty boxes and columns of tensors
large enough that the planner must not read the whole span."""
import random

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")
from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner  # noqa: E402
from torch.distributed.checkpoint.metadata import MetadataIndex  # noqa: E402
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, ReadItem  # noqa: E402

from ferry import checkpoint as ck  # noqa: E402


class BoxPlanner(DefaultLoadPlanner):
    """Reads the boxes {fqn: [(offsets, lengths)]} of the stored (whole) tensors,
    each into a tensor of its own."""

    def __init__(self, boxes, device="cpu"):
        super().__init__()
        self.boxes = boxes
        self.device = device
        self.out = {}

    def create_local_plan(self):
        items = []
        for fqn, bs in self.boxes.items():
            for i, (off, lens) in enumerate(bs):
                items.append(ReadItem(type=LoadItemType.TENSOR,
                                      dest_index=MetadataIndex(fqn, (i,) + tuple(off)),
                                      dest_offsets=torch.Size([0] * len(off)),
                                      storage_index=MetadataIndex(fqn, (0,) * len(off)),
                                      storage_offsets=torch.Size(off), lengths=torch.Size(lens)))
        return LoadPlan(items)

    def resolve_tensor(self, read_item):
        fqn = read_item.dest_index.fqn
        dt = self.metadata.state_dict_metadata[fqn].properties.dtype
        key = (fqn, read_item.dest_index.offset)
        if key not in self.out:
            self.out[key] = torch.full(tuple(read_item.lengths), 7, dtype=dt, device=self.device)
        return self.out[key]

    def commit_tensor(self, read_item, tensor):
        pass


def _boxes(shape, rng, n):
    """n random boxes of shape, plus the whole tensor and one element."""
    out = [((0,) * len(shape), tuple(shape))]
    if all(shape):
        out.append((tuple(s - 1 for s in shape), (1,) * len(shape)))
    for _ in range(n):
        off, lens = [], []
        for s in shape:
            a = rng.randrange(0, s + 1)
            b = rng.randrange(a, s + 1)
            off.append(a); lens.append(b - a)
        out.append((tuple(off), tuple(lens)))
    return out


def _state():
    g = torch.Generator().manual_seed(5)
    return {"m3": torch.randn(6, 7, 9, generator=g),                   # 3-d: any dim cut
            "m4": torch.randint(-99, 99, (3, 4, 5, 6), generator=g, dtype=torch.int16),
            "v": torch.randn(31, generator=g).to(torch.bfloat16),
            "one": torch.tensor([3.5]), "s": torch.tensor(2.5, dtype=torch.float64),
            "wide": torch.randn(300, 700, generator=g),                 # 840 KB: columns not grouped whole
            "tall": torch.arange(40000 * 3, dtype=torch.int32).reshape(40000, 3)}


def _save_both(tmp_path, sd):
    a, b = tmp_path / "torch", tmp_path / "ferry"
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(str(a)), no_dist=True)
    dcp.save(sd, storage_writer=ck.FerryWriter(str(b)), no_dist=True)
    return a, b


def _bytes(t):
    return t.reshape(-1).view(torch.uint8).numpy().tobytes()


def _load(reader, boxes, device="cpu"):
    p = BoxPlanner(boxes, device)
    dcp.load({k: None for k in boxes}, storage_reader=reader, planner=p, no_dist=True)
    return p.out


def test_boxes_of_every_shape_equal_torch_filesystem_reader(tmp_path):
    sd = _state()
    a, b = _save_both(tmp_path, sd)
    rng = random.Random(11)
    boxes = {k: _boxes(tuple(t.shape), rng, 25 if t.dim() else 0) for k, t in sd.items()}
    boxes["s"] = [((), ())]
    # named cuts: leading, trailing, middle dims; a column of the wide tensor; a
    # strided-looking cut through every dim; empty boxes
    boxes["m3"] += [((2, 0, 0), (3, 7, 9)), ((0, 0, 4), (6, 7, 2)), ((0, 3, 0), (6, 1, 9)),
                    ((1, 2, 3), (4, 3, 5)), ((0, 0, 0), (0, 7, 9)), ((5, 6, 8), (1, 1, 1))]
    boxes["wide"] += [((0, 350), (300, 1)), ((0, 0), (300, 350)), ((100, 0), (1, 700)),
                      ((0, 699), (300, 1)), ((10, 10), (280, 680))]
    boxes["tall"] += [((0, 1), (40000, 1)), ((39999, 0), (1, 3)), ((123, 0), (20000, 2))]
    want = _load(dcp.FileSystemReader(str(a)), boxes)
    got = _load(ck.FerryReader(str(b)), boxes)
    assert set(got) == set(want) and len(want) > 100
    for key, w in want.items():
        g = got[key]
        assert g.dtype == w.dtype and g.shape == w.shape, key
        assert _bytes(g) == _bytes(w), key
        fqn, idx = key
        off, lens = idx[1:], g.shape
        ref = sd[fqn][tuple(slice(o, o + n) for o, n in zip(off, lens))]
        assert torch.equal(g, ref), key


def test_box_outside_the_stored_tensor_is_a_clear_error(tmp_path):
    sd = {"w": torch.arange(12.0).reshape(3, 4)}
    dcp.save(sd, storage_writer=ck.FerryWriter(str(tmp_path)), no_dist=True)
    with pytest.raises(CheckpointException) as ei:      # DCP wraps the reader's FerryError
        _load(ck.FerryReader(str(tmp_path)), {"w": [((4, 0), (1, 4))]})
    msg = str(ei.value)
    assert "FerryError" in msg and 'variable "w": dimension 0: selection 4:5:1 outside 0..3' in msg, msg
