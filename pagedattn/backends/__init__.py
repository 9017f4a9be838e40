"""Backends: the interface every backend implements, and the entry-point registry.

Importing this package imports no GPU library; backends are loaded on demand.
"""

from pagedattn.backends.capabilities import ALL_FEATURES, Capabilities
from pagedattn.backends.interface import Backend, Plan
from pagedattn.backends.registry import (
    ENTRY_POINT_GROUP,
    available_backends,
    backend_names,
    backend_status,
    list_backends,
    load_backend,
    refresh_backends,
)

__all__ = [
    "ALL_FEATURES",
    "ENTRY_POINT_GROUP",
    "Backend",
    "Capabilities",
    "Plan",
    "available_backends",
    "backend_names",
    "backend_status",
    "list_backends",
    "load_backend",
    "refresh_backends",
]
