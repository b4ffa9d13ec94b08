"""Autoscaling in the fleet simulator (simulator/autoscaling.py) and in Ray Serve (deploy/autoscaling.py).

The simulator's scaler adds replicas after Serve's delay and their start-up, drains the newest first, pays
for starting and draining ones, and asks the same :func:`~ebplus.controller.scaling.decide` a deployment's
policy asks; Serve's policy class answers from the controller's last decision without waiting for the next.
"""

from __future__ import annotations

import json
import math
import types

import pytest

from ebplus.controller.config import ControllerConfig, PlannerConfig, SloConfig
from ebplus.controller.cost_model import resolve_profile
from ebplus.deploy.routing import make_router
from ebplus.simulator.autoscaling import Autoscaler, ScalingConfig
from ebplus.simulator.fleet import simulate_fleet
from ebplus.simulator.latency import SloTargets
from ebplus.simulator.sim import Policy, SimConfig, simulate
from ebplus.simulator.workloads import PhaseSpec, Schedule, build_requests, load_source

H200 = resolve_profile("h200")
CONFIG = SimConfig(
    policy=Policy.EBPLUS,
    controller=ControllerConfig(planner=PlannerConfig(slo=SloConfig(ttft_p99_s=2.0))),
    slo=SloTargets(ttft_s=2.0),
)


@pytest.fixture(scope="module")
def capacity() -> float:
    """One H200 replica's saturated request rate on the paper workload, in EB+."""
    return simulate(H200, build_requests(load_source("paper"), seed=0, requests=3000), CONFIG).req_per_s


def burst(capacity: float, requests: int = 3000) -> Schedule:
    loads = [(0.5, 0.2), (2.5, 0.6), (0.5, 0.2)]
    return Schedule(
        name="burst",
        phases=[PhaseSpec(workload="paper", requests=round(s * requests), rate=load * capacity) for load, s in loads],
    )


def scaled(capacity: float, policy: str, **settings: object) -> tuple[dict, Autoscaler]:
    reqs = build_requests(burst(capacity), seed=3)
    scaler = Autoscaler(ScalingConfig(policy=policy, max_replicas=4, target_ongoing_requests=256, **settings))
    out = simulate_fleet([H200], reqs, CONFIG, 1, make_router("phase", 3, stale_s=math.inf), scaler).as_json()
    return out, scaler


@pytest.mark.parametrize("policy", ["default", "policy-first"])
def test_a_burst_adds_replicas_that_serve_then_they_go(capacity: float, policy: str) -> None:
    out, scaler = scaled(capacity, policy, startup_s=20.0, upscale_delay_s=10.0, downscale_delay_s=20.0)
    assert out["requests"] == 3000  # every request served, once
    ups = [e for e in scaler.events if e.replicas > 1]
    assert ups and out["replicas"] > 1, scaler.events
    first = min(e.at for e in ups)
    assert first >= 10.0  # the burst had to last the upscale delay
    # the first replica added serves (a later one may start as the trace ends), paid for from when it was asked
    assert out["routed"][1] > 0
    assert out["replica_seconds"] > out["sim_seconds"]  # more than one replica for a while
    assert out["replica_seconds"] < 4 * out["sim_seconds"]
    if policy == "policy-first":
        assert scaler.decisions and {d.action for d in scaler.decisions} >= {"up"}


def test_without_a_burst_no_replica_is_added(capacity: float) -> None:
    reqs = build_requests(Schedule(name="calm", phases=[PhaseSpec(workload="paper", requests=1500, rate=0.5 * capacity)]), seed=3)
    scaler = Autoscaler(ScalingConfig(policy="policy-first", max_replicas=4, upscale_delay_s=5.0))
    out = simulate_fleet([H200], reqs, CONFIG, 1, make_router("phase", 3, stale_s=math.inf), scaler).as_json()
    assert out["scale_events"] == 0 and out["replicas"] == 1
    assert out["replica_seconds"] == pytest.approx(out["sim_seconds"], rel=0.05)


def test_bad_scaling_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="min_replicas"):
        ScalingConfig(policy="default", min_replicas=3, max_replicas=2)
    with pytest.raises(ValueError, match="unknown autoscaling policy"):
        ScalingConfig(policy="fastest")  # type: ignore[arg-type]


class _Ref:
    def __init__(self, value: str) -> None:
        self.value = value


def test_serves_policy_answers_with_the_controllers_last_decision_without_waiting(monkeypatch) -> None:
    import ray

    from ebplus.controller import actor
    from ebplus.deploy.autoscaling import PolicyFirst

    asked: list[tuple] = []
    ready: set[int] = set()

    def scaling(*args: object) -> _Ref:
        asked.append(args)
        return _Ref(json.dumps({"target": len(asked) + 1}))

    controller = types.SimpleNamespace(scaling=types.SimpleNamespace(remote=scaling))
    monkeypatch.setattr(actor, "get_controller", lambda: controller)
    monkeypatch.setattr(ray, "wait", lambda refs, timeout: ([r for r in refs if id(r) in ready], []))
    monkeypatch.setattr(ray, "get", lambda ref: ref.value)
    policy = PolicyFirst(model="tiny", utilization=0.9, down=0.6)
    ctx = types.SimpleNamespace(current_num_replicas=1, target_num_replicas=1, policy_state={"k": 1})
    assert policy(ctx) == (1, {"k": 1})  # nothing back yet: Serve's target stands
    assert asked == [("tiny", 1, 0.9, 0.6)]
    assert policy(ctx)[0] == 1 and len(asked) == 1  # still in flight: not asked again, nothing waited for
    ready.add(id(policy._pending))
    assert policy(ctx)[0] == 2 and len(asked) == 2  # the answer, and the next question sent
