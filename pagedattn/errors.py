"""The project's documented error types.

Every public entry point checks its arguments before any kernel runs and raises
:class:`PagedAttentionError` (a :class:`ValueError`) naming the argument, what was
expected and what was received. A case a backend does not support raises
:class:`UnsupportedError`, a subclass, naming the capability that is missing.
"""

from __future__ import annotations


class PagedAttentionError(ValueError):
    """Bad input: the message names the argument, the expected and the received value."""

    def __init__(self, argument: str, problem: str) -> None:
        self.argument = argument
        self.problem = problem
        super().__init__(f"{argument}: {problem}")


class UnsupportedError(PagedAttentionError):
    """A valid case outside a backend's declared capabilities."""

    def __init__(self, argument: str, problem: str, *, backend: str = "", capability: str = "") -> None:
        self.backend = backend
        self.capability = capability
        prefix = f"backend {backend!r} does not support this: " if backend else ""
        super().__init__(argument, prefix + problem)


class OutOfBlocksError(PagedAttentionError):
    """The block allocator has fewer free blocks than a request needs; nothing was changed."""


class BackendNotFoundError(LookupError):
    """No registered backend has the requested name; the message lists those installed."""


class BackendUnavailableError(RuntimeError):
    """A registered backend cannot run here (import failed, no device); the message says why."""
