"""Mutants whose bug shows only when a backend is used as an engine uses it: several plans alive
at once, one plan run on several layers' arrays, an earlier run's output kept by the caller,
attention right after the step's write_kv. Every other cell plans and runs once, and never
attends right after a write; :mod:`pagedattn.conformance.test_plans` is the one that sees them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from pagedattn.conformance.mutants.kernel import SteppedKernelBackend


class PlanStateOnBackend(SteppedKernelBackend):
    bug = "plan keeps its batch on the backend, not in the plan: a run follows the batch planned last"
    models = ("sgl-project/sglang PR 27193 (a re-plan inside a multi-step loop clobbers the per-step attention "
              "metadata: wrong output, not a crash); NVIDIA/TensorRT-LLM PR 15546 (the next step's block offsets "
              "overwrite a reused staging buffer before the previous step's copy ran)")
    killed_by = "test_a_plan_serves_many_runs"

    def _plan(self, problem, block_tables, seq_lens, query_start_loc, alibi_slopes):
        self.planned_last = problem
        return super()._plan(problem, block_tables, seq_lens, query_start_loc, alibi_slopes)

    def _run(self, plan, query, key_cache, value_cache):
        return super()._run(replace(plan, problem=self.planned_last), query, key_cache, value_cache)


class LaunchBindsFirstRunArrays(SteppedKernelBackend):
    bug = ("a plan's launch cache binds the query and caches of its first run: later runs of the plan read "
           "the first run's arrays")
    models = ("flashinfer-ai/flashinfer PR 5080 (an identity-memoised plan replayed without re-pointing it "
              "at the new call's buffers); host-time launch caches that keep argument addresses")
    killed_by = "test_a_plan_serves_many_runs"

    def caches_launch(self, plan) -> bool:
        """Whether ``plan``'s launches are cached with the arrays of its first run: every plan's."""
        return True

    def _plan(self, problem, block_tables, seq_lens, query_start_loc, alibi_slopes):
        return {"bound": None}

    def _run(self, plan, query, key_cache, value_cache):
        if not self.caches_launch(plan):
            return super()._run(plan, query, key_cache, value_cache)
        if plan.state["bound"] is None:
            plan.state["bound"] = (query, key_cache, value_cache)
        return super()._run(plan, *plan.state["bound"])


class OutputBufferPerPlan(SteppedKernelBackend):
    bug = "the plan allocates out (and lse) once and every run returns them: a later run overwrites an earlier out"
    models = ("NVIDIA/TensorRT-LLM PR 17887 (a returned output held in a reused buffer, safe only if consumed "
              "before the next call); output buffers cached per plan to save host time")
    killed_by = "test_a_plan_serves_many_runs"

    def _plan(self, problem, block_tables, seq_lens, query_start_loc, alibi_slopes):
        return {"out": None, "lse": None}

    def _run(self, plan, query, key_cache, value_cache):
        out, lse = super()._run(plan, query, key_cache, value_cache)
        if plan.state["out"] is None:
            plan.state["out"], plan.state["lse"] = np.empty_like(out), None if lse is None else np.empty_like(lse)
        plan.state["out"][...] = out
        if lse is not None:
            plan.state["lse"][...] = lse
        return plan.state["out"], plan.state["lse"]


class WriteKVLandsLate(SteppedKernelBackend):
    bug = ("write_kv runs on a side stream that the next call does not wait for: attention launched right "
           "after it reads the newest slots before they are written (a synchronize waits for it)")
    models = ("tile-ai/TileOPs PR 1215 review (a KV-cache append racing the attention reads of the same pages); "
              "vllm-project/vllm PR 42359 (attention over KV blocks the step has not written yet)")
    killed_by = "test_a_step_writes_then_attends"

    pending: tuple[Any, ...] | None = None

    def _write_kv(self, problem, key, value, key_cache, value_cache, slot_mapping):
        self.pending = (problem, key, value, key_cache, value_cache, slot_mapping)

    def _land(self) -> None:
        if self.pending is not None:
            pending, self.pending = self.pending, None
            super()._write_kv(*pending)

    def synchronize(self):
        self._land()
        super().synchronize()

    def _run(self, plan, query, key_cache, value_cache):
        result = super()._run(plan, query, key_cache, value_cache)
        self._land()  # after the attention has read the caches
        return result


class LaunchCacheKeepsEveryRunsArrays(SteppedKernelBackend):
    bug = ("a plan caches a launch for every (query, key_cache, value_cache) it is run on, keyed by the arrays and "
           "holding them: every step of an engine adds an entry, and no step's arrays are ever freed")
    models = ("sgl-project/sglang PR 40175 review (a plan cache holding views of the last Q/K/V per shape: a "
              "long-running worker runs out of memory); launch caches keyed by argument addresses")
    killed_by = "test_runs_hold_no_memory"

    def _plan(self, problem, block_tables, seq_lens, query_start_loc, alibi_slopes):
        return {"launches": {}}

    def _run(self, plan, query, key_cache, value_cache):
        launches = plan.state["launches"]
        launches.setdefault((id(query), id(key_cache), id(value_cache)), (query, key_cache, value_cache))
        return super()._run(plan, query, key_cache, value_cache)


#: Device slots of :class:`PlanStateInARingOf32`.
PLAN_SLOTS = 32


class PlanStateInARingOf32(SteppedKernelBackend):
    bug = ("plan uploads its batch into one of 32 slots the backend keeps, taken in turn: the 33rd plan "
           "overwrites the first plan's batch, whose runs then follow it")
    models = ("fixed pools of per-plan device buffers sized below the plans an engine keeps (one per CUDA-graph "
              "capture size: 67 in vLLM's default list); ROCm/aiter PR 4916 (a fixed pool of per-launch slots)")
    killed_by = "test_many_plans_stay_independent"

    #: the batch each slot holds, and how many plans were made
    plan_slots: dict[int, Any]
    planned = 0

    def _plan(self, problem, block_tables, seq_lens, query_start_loc, alibi_slopes):
        slot = self.planned % PLAN_SLOTS
        self.planned += 1
        self.__dict__.setdefault("plan_slots", {})[slot] = problem
        return {"slot": slot}

    def _run(self, plan, query, key_cache, value_cache):
        return super()._run(replace(plan, problem=self.plan_slots[plan.state["slot"]]), query, key_cache, value_cache)
