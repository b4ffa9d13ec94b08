"""KV held in whole blocks, and admission only when a whole sequence fits, as vLLM does."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from ebplus.controller.cost_model import HardwareProfile, resolve_profile
from ebplus.simulator.sim import Policy, SimConfig, simulate
from ebplus.simulator.workloads import LengthSpec, Workload, build_requests

CPU = resolve_profile("cpu-smollm2")
BLOCK = 128
POLICIES = [
    SimConfig(policy=Policy.MB, n=64, budget=512, record_steps=True, kv_block=BLOCK),
    SimConfig(policy=Policy.EB, k=8, n=64, budget=512, record_steps=True, kv_block=BLOCK),
    SimConfig(policy=Policy.EBPLUS, n=64, budget=512, record_steps=True, kv_block=BLOCK),
]
IDS = ["mb", "eb8", "eb+"]


def fixed(inp: int, out: int) -> Workload:
    return Workload(input=LengthSpec(dist="fixed", mean=inp), output=LengthSpec(dist="fixed", mean=out))


def kv_bound(config: SimConfig, kv: int = 40 * BLOCK, jump: bool = True):
    w = Workload(
        input=LengthSpec(dist="uniform", mean=128, jitter=0.5), output=LengthSpec(dist="uniform", mean=128, jitter=0.5)
    )
    reqs = build_requests(w, seed=1, requests=150, concurrency=64)
    prof = CPU.model_copy(update={"kv_capacity_tokens": kv})
    return simulate(prof, reqs, dataclasses.replace(config, jump=jump)), reqs


@pytest.mark.parametrize("config", POLICIES, ids=IDS)
def test_blocks_are_held_whole_and_never_overcommitted(config: SimConfig) -> None:
    res, reqs = kv_bound(config)
    used = np.array(res.step_log.kv_used)
    assert np.all(used % BLOCK == 0) and used.max() <= 40 * BLOCK
    assert res.prefill_tokens + res.decode_tokens == reqs.input_len.sum() + reqs.output_len.sum() - len(reqs) + (
        res.recompute_tokens
    )
    if config.policy is Policy.MB:
        assert res.preemptions > 0  # the setting really is KV-bound


@pytest.mark.parametrize("config", POLICIES, ids=IDS)
def test_jumping_over_decode_steps_changes_nothing_with_blocks(config: SimConfig) -> None:
    fast, _ = kv_bound(config)
    slow, _ = kv_bound(config, jump=False)
    assert fast.steps == slow.steps and fast.preemptions == slow.preemptions
    assert fast.step_log.kv_used == slow.step_log.kv_used
    np.testing.assert_allclose(fast.finish_s, slow.finish_s, rtol=1e-9)


def test_a_part_filled_block_counts_whole() -> None:
    """64-token requests on 10 blocks of 128: ten run at once, not the 21 whose prompts fit token by token."""
    reqs = build_requests(fixed(60, 4), seed=0, requests=100)
    prof = CPU.model_copy(update={"kv_capacity_tokens": 10 * BLOCK})
    blocks = simulate(prof, reqs, SimConfig(policy=Policy.MB, n=64, budget=2048, kv_block=BLOCK))
    tokens = simulate(prof, reqs, SimConfig(policy=Policy.MB, n=64, budget=2048))
    assert blocks.max_running == 10
    assert tokens.max_running == 10 * BLOCK // 60  # admitted on their prompts, token by token


def test_admission_waits_until_the_whole_sequence_fits() -> None:
    """A 600-token prompt chunked by a 256-token budget is not started while only its first chunk fits."""
    prof = HardwareProfile(
        name="t", kv_capacity_tokens=1000, alpha_p=1e-3, beta_p=1e-5, alpha_d=1e-3, beta_d=1e-5, beta_mb=(1e-5, 0, 0)
    )
    reqs = build_requests(fixed(600, 50), seed=0, requests=4)
    res = simulate(prof, reqs, SimConfig(policy=Policy.MB, n=8, budget=256))
    assert res.preemptions == 0 and res.recompute_tokens == 0
    assert res.max_running == 1


def test_config_rejects_a_zero_block() -> None:
    with pytest.raises(ValueError, match="kv_block must be >= 1"):
        SimConfig(policy=Policy.MB, kv_block=0)
