"""The cupy backend's options: constructor arguments with documented defaults, the environment
supplying only those defaults, and bad values named; planning obeys them (CPU)."""

from __future__ import annotations

import pytest
from cases import poisoned_case

from pagedattn.backends.cupy.backend import CupyBackend
from pagedattn.backends.cupy.options import ENVIRONMENT, CupyOptions, resolve
from pagedattn.backends.cupy.planning import build_work, choose_kernel
from pagedattn.conformance.checks import problem_of
from pagedattn.errors import PagedAttentionError


def test_defaults_are_the_documented_ones() -> None:
    assert resolve({}) == CupyOptions(
        prefill="auto", decode="mma", split_kv=True, wgmma_ctas=2, wgmma_schedule="overlap",
        sync=False,
    )


def test_the_environment_supplies_defaults_and_the_constructor_wins() -> None:
    environ = {
        ENVIRONMENT["prefill"]: "mma", ENVIRONMENT["decode"]: "simt",
        ENVIRONMENT["split_kv"]: "0", ENVIRONMENT["wgmma_ctas"]: "1",
        ENVIRONMENT["wgmma_schedule"]: "serial", ENVIRONMENT["sync"]: "1", ENVIRONMENT["merge"]: "kernel",
    }
    assert resolve(environ) == CupyOptions("mma", "simt", False, 1, "serial", True, merge="kernel")
    given = resolve(environ, prefill="wgmma", split_kv=True, sync=False)
    assert (given.prefill, given.split_kv, given.sync, given.decode) == ("wgmma", True, False, "simt")
    assert resolve({ENVIRONMENT["prefill"]: ""}).prefill == "auto", "an empty variable is unset"


def test_a_backend_reads_the_environment_once_when_built(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENVIRONMENT["decode"], "simt")
    backend = CupyBackend()
    monkeypatch.delenv(ENVIRONMENT["decode"])
    assert backend.options.decode == "simt", "fixed when the backend was built"
    assert CupyBackend().options.decode == "mma"
    assert CupyBackend(decode="simt", split_kv=False).options == CupyOptions(decode="simt", split_kv=False)


@pytest.mark.parametrize(
    "given, argument",
    [
        ({"prefill": "fast"}, "prefill"),
        ({"decode": "tensor"}, "decode"),
        ({"wgmma_ctas": 3}, "wgmma_ctas"),
        ({"wgmma_ctas": True}, "wgmma_ctas"),
        ({"wgmma_schedule": "eager"}, "wgmma_schedule"),
        ({"merge": "after"}, "merge"),
        ({"merge": True}, "merge"),
        ({"split_kv": 1}, "split_kv"),
        ({"sync": "yes"}, "sync"),
        ({"num_splits": -1}, "num_splits"),
        ({"num_splits": True}, "num_splits"),
    ],
)
def test_a_bad_option_raises_naming_it(given: dict, argument: str) -> None:
    with pytest.raises(PagedAttentionError) as error:
        CupyBackend(**given)
    assert error.value.argument == argument


@pytest.mark.parametrize("name, text", [("split_kv", "yes"), ("wgmma_ctas", "two"), ("sync", "true"),
                                             ("num_splits", "-4")])
def test_a_bad_environment_value_raises_naming_the_variable(name: str, text: str) -> None:
    with pytest.raises(PagedAttentionError) as error:
        resolve({ENVIRONMENT[name]: text})
    assert error.value.argument == ENVIRONMENT[name]


def test_unknown_options_are_refused() -> None:
    with pytest.raises(TypeError, match="colour"):
        resolve({}, colour="red")


def _problem(**shape):  # type: ignore[no-untyped-def]
    return problem_of(poisoned_case("options", **shape))


def test_split_kv_off_gives_every_item_its_whole_range() -> None:
    problem = _problem(seq_lens=[16384, 16384], num_q_heads=32, num_kv_heads=8, head_dim=64,
                       dtype="float16")
    choice = choose_kernel(problem)
    split = build_work(problem, choice, slots=396)
    whole = build_work(problem, choice, slots=396, split_kv=False)
    assert split.num_partials > 0 and len(split.merges) > 0
    assert whole.num_partials == 0 and len(whole.merges) == 0
    assert len(whole.items) == 2 * 8, "one item per (sequence, KV head)"
    assert (whole.items[:, 6] == 0).all() and (whole.items[:, 7] >= 16384).all()


def test_decode_option_picks_the_decode_kernel() -> None:
    problem = _problem(seq_lens=[300, 40], num_q_heads=8, num_kv_heads=2, head_dim=64)
    assert choose_kernel(problem, CupyOptions(decode="mma")).spec.module == "paged_attention_decode"
    simt = choose_kernel(problem, CupyOptions(decode="simt"))
    assert (simt.spec.module, simt.rows) == ("paged_attention", 4)
