"""Backends for the conformance suite's own tests: a narrow one and one that declares nothing."""

from __future__ import annotations

from pagedattn.backends.capabilities import Capabilities
from pagedattn.backends.numpy.backend import NumpyBackend


class NarrowBackend(NumpyBackend):
    """The reference, declaring float32, block size 16, NHD and varlen only."""

    name = "narrow"

    def capabilities(self) -> Capabilities:
        return Capabilities(dtypes=("float32",), cache_dtypes=("float32",), block_sizes=(16,),
                            kv_layouts=("NHD",), features=frozenset({"varlen"}))


class NothingBackend(NumpyBackend):
    """Declares no dtype at all: every cell is unsupported, so it passes zero cases."""

    name = "nothing"

    def capabilities(self) -> Capabilities:
        return Capabilities(dtypes=(), cache_dtypes=(), features=frozenset())
