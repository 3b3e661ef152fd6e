"""Shared by the GPU tests: `ctx`, a ferry Context per module that skips the
module with the driver's reason where there is no CUDA device."""
import pytest

from ferry import _ferry as F


@pytest.fixture(scope="module")
def ctx():
    c = F.Context()
    if c.cuda_device_count() == 0:
        pytest.skip("no CUDA device: " + (c.cuda_status or "driver not available"))
    yield c
    c.close()
