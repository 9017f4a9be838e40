"""The backend registry: entry points, lazy loading, broken plug-ins, third-party packages."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

from pagedattn.backends import registry
from pagedattn.backends.registry import BackendEntry
from pagedattn.errors import BackendNotFoundError, BackendUnavailableError
from pagedattn.spec import exact_attention, tolerance
from pagedattn.spec.pools import random_paged_inputs

ROOT = Path(__file__).resolve().parents[2]


def test_builtin_table_equals_pyproject() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    declared = project["project"]["entry-points"][registry.ENTRY_POINT_GROUP]
    assert declared == registry.BUILTIN_BACKENDS


def test_importing_and_listing_imports_no_gpu_library() -> None:
    code = (
        "import sys, pagedattn, pagedattn.backends as b; names = b.backend_names();"
        "heavy = [m for m in ('torch', 'triton', 'cupy') if m in sys.modules];"
        "print(names, heavy); assert 'numpy' in names and not heavy, heavy"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_unknown_name_lists_the_registered_ones() -> None:
    with pytest.raises(BackendNotFoundError, match=r"no backend named 'nope'; registered backends: .*numpy"):
        registry.load_backend("nope")


def test_broken_plugin_warns_with_its_name_and_error(monkeypatch: pytest.MonkeyPatch) -> None:
    broken = BackendEntry("broken", "no_such_module_xyz:Thing", "broken-dist", "1.0")
    monkeypatch.setattr(registry, "_from_entry_points", lambda: [broken])
    registry.refresh_backends()
    try:
        with pytest.warns(RuntimeWarning, match=r"Backend 'broken' loading failed: .*no_such_module_xyz") as rec:
            status = registry.backend_status("broken")
        assert len([w for w in rec if "broken" in str(w.message)]) == 1
        assert not status.available and "ModuleNotFoundError" in (status.reason or "")
        assert "numpy" in registry.available_backends()  # the others still work
        with pytest.raises(BackendUnavailableError, match="failed to load"):
            registry.load_backend("broken")
    finally:
        monkeypatch.undo()
        registry.refresh_backends()


def test_duplicate_names_warn_and_keep_the_first() -> None:
    a = BackendEntry("x", "a:A", "dist-a", "1")
    b = BackendEntry("x", "b:B", "dist-b", "1")
    with pytest.warns(RuntimeWarning, match="registered twice"):
        kept = registry.drop_duplicates([a, b])
    assert kept == [a]


def test_backends_command_prints_every_backend() -> None:
    result = subprocess.run([sys.executable, "-m", "pagedattn", "backends"], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    for name in registry.BUILTIN_BACKENDS:
        assert name in result.stdout
    lines = result.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("numpy"))
    continued = [lines[start]]  # a wrapped row continues on lines that start with spaces
    for line in lines[start + 1:]:
        if not line.startswith(" "):
            break
        continued.append(line)
    numpy_row = " ".join(continued)
    assert " available " in numpy_row and "features=" in numpy_row, numpy_row


def test_third_party_package_installs_lists_and_runs(tmp_path: Path) -> None:
    """Build the README's example package in a temporary folder, install it, list and run it."""
    source = tmp_path / "src"
    shutil.copytree(ROOT / "examples" / "third_party_backend", source)
    target = tmp_path / "site"
    install = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(source)]
    try:
        import setuptools  # noqa: F401

        install.insert(4, "--no-build-isolation")
    except ImportError:
        pass
    built = subprocess.run(install, capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(target)])}
    listing = subprocess.run([sys.executable, "-m", "pagedattn", "backends"], cwd=tmp_path, env=env,
                             capture_output=True, text=True)
    assert listing.returncode == 0, listing.stderr
    assert "dense" in listing.stdout and "pagedattn-dense" in listing.stdout
    case = random_paged_inputs([20, 3], [5, 3], block_size=4)
    np.savez(tmp_path / "case.npz", *case.args()[:5], case.query_start_loc)
    code = (
        "import numpy as np; from pagedattn.backends import load_backend;"
        "a = np.load('case.npz'); args = [a[f'arr_{i}'] for i in range(6)];"
        "np.save('out.npy', load_backend('dense').paged_attention(*args))"
    )
    ran = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    out = np.load(tmp_path / "out.npy")
    expected = exact_attention(*case.args())
    bound = tolerance("float32", 16).out_bound(expected.out, expected.value_scale, expected.score_scale,
                                               expected.num_visible)
    assert (np.abs(out - expected.out) <= bound).all()
