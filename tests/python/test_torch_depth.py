"""How many groups (plans) a dataset keeps in flight: prefetch + 1 batches, and on CUDA at least
enough to fill twice the engine's staging buffers (the engine is kept busy by bytes queued, not
by batches); prefetch=0 keeps no read-ahead; tiny batches are capped."""
import pytest

pytest.importorskip("torch")

from ferry.torch.groups import _MAX_GROUPS, _groups_in_flight  # noqa: E402

MiB = 1 << 20
STAGING = 16 * 3 * 2 * MiB          # the default engine: 16 workers x 3 buffers of 2 MiB


def test_host_destinations_count_batches():
    assert _groups_in_flight(4, 1, 38_535_168, 0) == 5
    assert _groups_in_flight(4, 16, 32 * MiB, 0) == 2            # grouped: whole reads
    assert _groups_in_flight(0, 1, 38_535_168, 0) == 1


def test_cuda_fills_twice_the_staging():
    assert _groups_in_flight(4, 1, 256 * 150_528, STAGING) == 6    # 192 MiB / 38.5 MB, rounded up
    assert _groups_in_flight(4, 16, 16 * 2 * MiB, STAGING) == 6    # token reads: 2 before
    assert _groups_in_flight(4, 1, 256 * MiB, STAGING) == 5        # large batches: prefetch rules
    assert _groups_in_flight(4, 1, 1024, STAGING) == _MAX_GROUPS   # tiny batches: capped
    assert _groups_in_flight(0, 1, 1024, STAGING) == 1             # no read-ahead asked: none
