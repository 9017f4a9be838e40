"""Shared by every test: the tests folder on the import path (its helper modules), and fixtures."""

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def numpy_unavailable(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The numpy backend reports itself unavailable (and the registry knows it) during the test."""
    from pagedattn.backends.numpy.backend import NumpyBackend
    from pagedattn.backends.registry import refresh_backends

    monkeypatch.setattr(NumpyBackend, "availability", classmethod(lambda cls: "no such device in this test"))
    refresh_backends()
    yield
    monkeypatch.undo()
    refresh_backends()
