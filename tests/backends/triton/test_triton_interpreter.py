"""The cached builtin scan of Triton's interpreter patches exactly what the interpreter's own scan does."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is needed (pip install 'pagedattn[triton]')", allow_module_level=True)

import triton
import triton.language as tl
from triton.runtime import interpreter

from pagedattn.backends.triton import interpreter as cached_scan


class RecordingScope(interpreter._LangPatchScope):  # type: ignore[misc]
    """A patch scope that also remembers which attributes it set."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[tuple[Any, str]] = []

    def set_attr(self, obj: Any, name: str, value: Any) -> None:
        self.names.append((obj, name))
        super().set_attr(obj, name, value)


def patched_names(patch_builtin: Any, namespaces: tuple[Any, ...]) -> list[tuple[Any, str]]:
    scope = RecordingScope()
    try:
        for namespace in namespaces:
            patch_builtin(namespace, interpreter.interpreter_builder, scope)
        return scope.names
    finally:
        scope.restore()


def test_a_scan_inside_a_launch_leaves_no_name_out_afterwards() -> None:
    """A launch of a kernel that sees only ``triton.language`` replaces ``reduce`` and
    ``associative_scan`` of ``triton.language.core`` too; a helper that sees ``core`` scans it
    inside that launch; once the launch restores them, both scans patch them again."""
    cached_scan.install()
    launch = interpreter._patch_lang(test_a_scan_inside_a_launch_leaves_no_name_out_afterwards)
    try:
        assert not tl.core.is_builtin(tl.core.associative_scan)
        patched_names(interpreter._patch_builtin, (tl.core,))  # the helper's scan
    finally:
        launch.restore()
    expected = patched_names(cached_scan.original_patch_builtin, (tl.core,))
    assert (tl.core, "associative_scan") in expected and (tl.core, "reduce") in expected
    assert patched_names(interpreter._patch_builtin, (tl.core,)) == expected


def test_cached_scan_patches_what_the_interpreter_scan_patches() -> None:
    cached_scan.install()
    cached_scan.install()  # idempotent: the original stays the interpreter's own
    original = cached_scan.original_patch_builtin
    assert original is not None and original.__module__ == "triton.runtime.interpreter"
    namespaces = (tl, tl.tensor, tl.math, tl.core, tl.core.tensor_descriptor_base)
    expected = patched_names(original, namespaces)
    assert expected, "the interpreter found no builtins: the test would show nothing"
    assert patched_names(interpreter._patch_builtin, namespaces) == expected
    assert patched_names(interpreter._patch_builtin, namespaces) == expected  # from the cache


def test_a_helper_inside_a_patched_scope_finds_nothing_left_to_patch() -> None:
    cached_scan.install()
    outer = RecordingScope()
    try:
        interpreter._patch_builtin(tl, interpreter.interpreter_builder, outer)
        assert patched_names(interpreter._patch_builtin, (tl,)) == []
        assert patched_names(cached_scan.original_patch_builtin, (tl,)) == []
    finally:
        outer.restore()


def test_a_tensor_used_as_an_index_raises_no_warning() -> None:
    import warnings

    import numpy as np

    cached_scan.install()
    scope = interpreter._LangPatchScope()
    try:
        interpreter._patch_lang_tensor(tl.tensor, scope)
        value = tl.core.tensor(interpreter.TensorHandle(np.array([5], np.int32), tl.int32), tl.int32)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert [10, 11, 12, 13, 14, 15][value] == 15
    finally:
        scope.restore()


def test_a_launch_on_nan_data_raises_no_warning_and_keeps_ieee_results(monkeypatch: pytest.MonkeyPatch) -> None:
    import warnings

    import numpy as np

    from pagedattn.backends.triton.backend import TritonBackend
    from pagedattn.spec.pools import random_paged_inputs

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    case = random_paged_inputs([32], num_q_heads=2, num_kv_heads=1, head_dim=16, block_size=16)
    query = case.query.copy()
    query[0, 0, 3] = np.nan  # every score of row (token 0, head 0) is NaN: its maximum is of an all-NaN slice
    key_cache, value_cache = case.key_cache.copy(), case.value_cache.copy()
    block = case.block_tables[0, 0]
    key_cache[block, 2, 0, :] = np.inf  # key of position 2: every row's score is +inf or -inf or NaN
    value_cache[block, 1, 0, 3] = np.inf  # value of position 1, dim 3
    backend = TritonBackend()
    dev = backend.to_device
    caches = dev(key_cache), dev(value_cache)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan = backend.plan(dev(query), *caches, dev(case.block_tables), dev(case.seq_lens))
        out = backend.run(plan, dev(query), *caches)
    out = backend.to_numpy(out)
    assert not np.isfinite(out[0]).all()  # IEEE: the rows see +inf keys and an inf value


@triton.jit
def _add_one(x):
    return x + 1


@triton.jit
def _helpers_kernel(out_ptr, CALLS: tl.constexpr):
    x = tl.zeros([8], tl.int32)
    for _ in tl.static_range(CALLS):
        x = _add_one(x) + tl.max(x, 0) * 0
    tl.store(out_ptr + tl.arange(0, 8), x + tl.program_id(0))


def _patches_of_one_launch(monkeypatch: pytest.MonkeyPatch, helper_calls: int) -> tuple[int, list[int]]:
    """Attributes the interpreter set during one launch of a kernel calling a helper of its own
    module ``helper_calls`` times and ``tl.max`` (whose module sees ``triton.language.core``)
    as often, and what the kernel stored."""
    import torch

    cached_scan.install()
    out = torch.zeros(8, dtype=torch.int32)
    counts = []
    set_attr = interpreter._LangPatchScope.set_attr

    def counting_set_attr(self: Any, obj: Any, name: str, value: Any) -> None:
        counts.append(1)
        set_attr(self, obj, name, value)

    monkeypatch.setattr(interpreter._LangPatchScope, "set_attr", counting_set_attr)
    _helpers_kernel[(2,)](out, CALLS=helper_calls)
    return len(counts), out.tolist()


@pytest.mark.skipif(not isinstance(_helpers_kernel, interpreter.InterpretedFunction),
                    reason="the kernel was defined without TRITON_INTERPRET=1")
def test_a_launch_patches_the_language_once_however_many_helper_calls_it_makes(monkeypatch: pytest.MonkeyPatch) -> None:
    few, stored_few = _patches_of_one_launch(monkeypatch, 2)
    many, stored_many = _patches_of_one_launch(monkeypatch, 12)
    assert stored_few == [3] * 8 and stored_many == [13] * 8  # program 1 wrote last
    assert few > 0 and many == few


def test_a_launch_runs_from_a_frame_too_large_for_a_16_kib_chunk() -> None:
    code = cached_scan.call_in_own_chunk.__code__
    assert code.co_stacksize == cached_scan.LAUNCH_FRAME_SLOTS
    assert (code.co_stacksize + code.co_nlocals) * 8 > 16 << 10
    assert cached_scan.call_in_own_chunk(lambda a, b=0: (a, b), 1, b=2) == (1, 2)
    with pytest.raises(ZeroDivisionError):
        cached_scan.call_in_own_chunk(lambda: 1 / 0)
