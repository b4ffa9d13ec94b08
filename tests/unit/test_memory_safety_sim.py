"""Memory safety of the policy in simulation: N capped at the planner's N* does not overflow the KV cache.

The real planner sizes N* for a profile's KV capacity from an estimate of the
workload; the simulator (the engine model, the real phase machine) then runs EB at
N = N* and above it. Pre-existing: ``test_sim.py::test_online_limits_n_to_avoid_preemption``
(the online loop cuts preemptions by >10x). The engine counterpart is
``tests/engine/test_memory_safety.py``.
"""

from __future__ import annotations

import pytest

from bench.sim import Policy, SimConfig, simulate
from bench.workloads import LengthSpec, Workload, build_requests
from controller.cost_model import resolve_profile
from controller.estimator import WorkloadEstimator
from controller.planner import Plan, PlannerConfig, ThresholdPlanner

KV = 60_000  # tokens: an H200 profile with a small cache, so N* is ~140 rather than thousands


def plan_for(reqs, eps: float, max_num_seqs: int = 1024) -> Plan:
    est = WorkloadEstimator(window=len(reqs), input_window=len(reqs), update_every=1, min_samples=30, first_update=30)
    for i, o in zip(reqs.input_len, reqs.output_len, strict=True):
        est.observe(int(i), int(o))
    profile = resolve_profile("h200")
    planner = ThresholdPlanner(PlannerConfig(max_num_seqs=max_num_seqs, eps=eps))
    return planner.plan(est.update(), profile.cost_model(), KV, n_obs=max_num_seqs)


def eb_preemptions(reqs, plan: Plan, n: int) -> int:
    profile = resolve_profile("h200").model_copy(update={"kv_capacity_tokens": KV})
    k = max(1, int(plan.theta * n))
    return simulate(profile, reqs, SimConfig(policy=Policy.EB, k=k, n=n)).preemptions


@pytest.fixture(scope="module")
def reqs():
    wl = Workload(
        name="balanced",
        input=LengthSpec(dist="uniform", mean=256, jitter=0.5),
        output=LengthSpec(dist="uniform", mean=256, jitter=0.5),
    )
    return build_requests(wl, seed=0, requests=4000)  # saturated: the queue never empties


def test_n_star_never_overflows_and_30_percent_more_does(reqs) -> None:
    # eps is an overflow probability per step: over ~10^4 steps "none" needs eps well below 1e-4
    plan = plan_for(reqs, eps=1e-6)
    assert 100 < plan.n_cap < 200
    assert eb_preemptions(reqs, plan, plan.n_cap) == 0
    assert eb_preemptions(reqs, plan, int(1.3 * plan.n_cap)) > 1000


def test_default_eps_trades_a_few_overflows_for_n(reqs) -> None:
    """With the default eps = 0.01 N* is a few percent larger; overflows are rare, not absent."""
    plan = plan_for(reqs, eps=PlannerConfig().eps)
    strict = plan_for(reqs, eps=1e-6)
    assert strict.n_cap < plan.n_cap <= 1.1 * strict.n_cap
    at_cap, above = eb_preemptions(reqs, plan, plan.n_cap), eb_preemptions(reqs, plan, int(1.3 * plan.n_cap))
    assert at_cap < above / 10
