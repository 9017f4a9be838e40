"""Which way a test process runs Triton's kernels: in its CPU interpreter or on a GPU.

``triton.jit`` reads ``TRITON_INTERPRET`` when a kernel module is imported, so one process runs
the kernels one way only. The modules that test the triton backend in the interpreter select it
where the caller left the variable unset and no CUDA device exists. On a CUDA machine they run
only where the caller set it (``tox`` does), so that ``pytest -m gpu tests/backends/triton`` runs
the ``gpu`` tests on the GPU instead of skipping them as interpreted.
"""

from __future__ import annotations

import os

import pytest


def interpreter_setting() -> str:
    """``TRITON_INTERPRET``'s value for a module of interpreter tests, set before any kernel module is
    imported: ``"1"``; on a CUDA machine where the caller left it unset, skip the module instead."""
    if "TRITON_INTERPRET" not in os.environ:
        import torch

        if torch.cuda.is_available():
            pytest.skip("runs in Triton's CPU interpreter: on a CUDA machine, set TRITON_INTERPRET=1 (tox does)",
                        allow_module_level=True)
    return "1"
