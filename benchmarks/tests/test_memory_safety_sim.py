"""Memory safety of the policy in simulation: N capped at the planner's N* does not overflow the KV cache.

The real planner sizes N* for a profile's KV capacity from an estimate of the
workload (``benchmarks/memory_safety.py``); the simulator (the engine model, the real
phase machine) then runs EB at N = N* and above it. Pre-existing:
``test_sim.py::test_online_limits_n_to_avoid_preemption`` (the online loop cuts
preemptions by >10x). The engine counterpart is ``tests/engine/test_memory_safety.py``.
"""

from __future__ import annotations

import pytest

from benchmarks.memory_safety import sim_plan, sim_preemptions, sim_requests
from ebplus.controller.config import PlannerConfig


@pytest.fixture(scope="module")
def reqs():
    return sim_requests("uniform")  # 4,000 saturated requests: the queue never empties


def test_n_star_never_overflows_and_30_percent_more_does(reqs) -> None:
    # eps is an overflow probability per step: over ~10^4 steps "none" needs eps well below 1e-4
    plan = sim_plan(reqs, eps=1e-6)
    assert 100 < plan.n_cap < 200
    assert sim_preemptions(reqs, plan, plan.n_cap) == 0
    assert sim_preemptions(reqs, plan, int(1.3 * plan.n_cap)) > 1000


def test_default_eps_trades_a_few_overflows_for_n(reqs) -> None:
    """With the default eps = 0.01 N* is a few percent larger; overflows are rare, not absent."""
    plan = sim_plan(reqs, eps=PlannerConfig().eps)
    strict = sim_plan(reqs, eps=1e-6)
    assert strict.n_cap < plan.n_cap <= 1.1 * strict.n_cap
    at_cap, above = sim_preemptions(reqs, plan, plan.n_cap), sim_preemptions(reqs, plan, int(1.3 * plan.n_cap))
    assert at_cap < above / 10
