"""Backend discovery through the ``pagedattn.backends`` entry-point group, the xarray way.

:func:`list_backends` reads entry-point metadata only (no backend is imported);
:func:`load_backend` imports and instantiates one backend, once (cached until
:func:`refresh_backends`). A backend that fails to import is reported with its error and
never breaks the others. The built-in backends register through the same group in
``pyproject.toml``; from a checkout that is not installed, :data:`BUILTIN_BACKENDS` (kept
equal to pyproject's table by a test) stands in for that metadata.
"""

from __future__ import annotations

import functools
import importlib
import warnings
from dataclasses import dataclass
from importlib.metadata import entry_points

from pagedattn.backends.interface import Backend
from pagedattn.errors import BackendNotFoundError, BackendUnavailableError

ENTRY_POINT_GROUP = "pagedattn.backends"

#: The built-in backends, as in pyproject.toml's ``[project.entry-points."pagedattn.backends"]``.
BUILTIN_BACKENDS: dict[str, str] = {
    "numpy": "pagedattn.backends.numpy.backend:NumpyBackend",
    "triton": "pagedattn.backends.triton.backend:TritonBackend",
    "cupy": "pagedattn.backends.cupy.backend:CupyBackend",
    "torch": "pagedattn.backends.torch.backend:TorchBackend",
}


@dataclass(frozen=True)
class BackendEntry:
    """One registered backend as metadata: name, ``module:Class`` and the distribution."""

    name: str
    value: str
    distribution: str
    distribution_version: str

    @property
    def module(self) -> str:
        return self.value.partition(":")[0]


def _from_entry_points() -> list[BackendEntry]:
    found = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(ep, "dist", None)
        found.append(
            BackendEntry(
                name=ep.name,
                value=ep.value,
                distribution=getattr(dist, "name", "") or "",
                distribution_version=getattr(dist, "version", "") or "",
            )
        )
    return found


def _builtin_entries() -> list[BackendEntry]:
    from pagedattn import __version__

    return [BackendEntry(name, value, "pagedattn", __version__) for name, value in BUILTIN_BACKENDS.items()]


def drop_duplicates(entries: list[BackendEntry]) -> list[BackendEntry]:
    """Keep the first entry of each name; warn when two different targets share a name."""
    kept: dict[str, BackendEntry] = {}
    for entry in entries:
        first = kept.get(entry.name)
        if first is None:
            kept[entry.name] = entry
        elif first.value != entry.value:
            warnings.warn(
                f"Backend {entry.name!r} is registered twice ({first.value} from {first.distribution},"
                f" {entry.value} from {entry.distribution}); using {first.value}.",
                RuntimeWarning,
                stacklevel=3,
            )
    return list(kept.values())


@functools.lru_cache(maxsize=1)
def list_backends() -> tuple[BackendEntry, ...]:
    """Return every registered backend, sorted by name, from metadata only (nothing imported)."""
    entries = _from_entry_points()
    if not any(e.name in BUILTIN_BACKENDS and e.distribution == "pagedattn" for e in entries):
        entries = _builtin_entries() + entries
    return tuple(sorted(drop_duplicates(entries), key=lambda e: e.name))


def backend_names() -> list[str]:
    """Names of all registered backends."""
    return [entry.name for entry in list_backends()]


def _entry(name: str) -> BackendEntry:
    for entry in list_backends():
        if entry.name == name:
            return entry
    raise BackendNotFoundError(
        f"no backend named {name!r}; registered backends: {', '.join(backend_names()) or 'none'}"
    )


@functools.cache
def load_backend_class(name: str) -> type[Backend]:
    """Import the class of backend ``name`` (cached); raise BackendUnavailableError on failure."""
    entry = _entry(name)
    module_name, _, attr = entry.value.partition(":")
    try:
        module = importlib.import_module(module_name)
        cls = getattr(module, attr) if attr else module
    except Exception as error:  # any import failure of a plug-in is reported, not raised raw
        raise BackendUnavailableError(f"backend {name!r} failed to load: {type(error).__name__}: {error}") from error
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise BackendUnavailableError(f"backend {name!r}: {entry.value} is not a pagedattn Backend subclass")
    return cls


@functools.cache
def load_backend(name: str) -> Backend:
    """Return the instance of backend ``name`` (cached); raise if unknown or unavailable here."""
    cls = load_backend_class(name)
    reason = cls.availability()
    if reason is not None:
        raise BackendUnavailableError(f"backend {name!r} is not available: {reason}")
    return cls()


@dataclass(frozen=True)
class BackendStatus:
    """A registered backend's state for listings: its class (if it loads) and why not available."""

    entry: BackendEntry
    backend_class: type[Backend] | None
    reason: str | None

    @property
    def available(self) -> bool:
        return self.reason is None


def backend_status(name: str) -> BackendStatus:
    """Load backend ``name``'s class and availability; failures become a reason, never an exception."""
    entry = _entry(name)
    try:
        cls = load_backend_class(name)
    except BackendUnavailableError as error:
        warnings.warn(f"Backend {name!r} loading failed: {error.__cause__ or error}", RuntimeWarning, stacklevel=2)
        return BackendStatus(entry, None, str(error))
    try:
        reason = cls.availability()
    except Exception as error:
        reason = f"availability check failed: {type(error).__name__}: {error}"
    return BackendStatus(entry, cls, reason)


def available_backends() -> list[str]:
    """Names of the backends that load and can run on this machine."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return [e.name for e in list_backends() if backend_status(e.name).available]


def refresh_backends() -> None:
    """Forget the cached listing and loaded backends (after installing a plug-in)."""
    list_backends.cache_clear()
    load_backend_class.cache_clear()
    load_backend.cache_clear()
