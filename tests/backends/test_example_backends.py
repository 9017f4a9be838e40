"""The example backends: the README shows examples/tiny_backend.py, and each example passes the cells it declares."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def readme_backend_code() -> str:
    """The Python block of the README's "A minimal backend" section."""
    section = (ROOT / "README.md").read_text().split("## A minimal backend", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README: no python block under 'A minimal backend'"
    return match.group(1)


def test_readme_shows_the_example_file() -> None:
    example = (ROOT / "examples" / "tiny_backend.py").read_text()
    body = example.split('"""\n', 1)[1].lstrip("\n")  # the file less its module docstring
    assert readme_backend_code() == body


@pytest.mark.parametrize(("folder", "backend"), [
    ("examples", "tiny_backend:TinyBackend"),
    ("examples/third_party_backend", "pagedattn_dense:DenseBackend"),
])
def test_example_passes_its_cells_and_reports_the_rest_unsupported(folder: str, backend: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / folder)]), "PYTHONHASHSEED": "0"}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "pagedattn.conformance.plugin", "-p", "no:cacheprovider", "-q",
         "--pyargs", "pagedattn.conformance", "--backend", backend, "--hypothesis-profile=quick"],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )
    tail = result.stdout[-2000:] + result.stderr[-2000:]
    assert result.returncode == 0, tail
    summary = result.stdout.strip().splitlines()[-1]
    assert re.search(r"\d+ passed", summary) and "failed" not in summary and "unsupported" in summary, summary
