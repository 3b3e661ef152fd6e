"""Shared by the Python tests: a module-scoped engine context."""
import pytest


@pytest.fixture(scope="module")
def ctx():
    """A ferry context of 4 workers, closed after the module's tests."""
    F = pytest.importorskip("ferry._ferry")
    c = F.Context(threads=4)
    yield c
    c.close()
