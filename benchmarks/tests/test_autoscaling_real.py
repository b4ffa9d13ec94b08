"""The real-deployment autoscaling benchmark's pure parts: the trace, replica-seconds, scale events, the SLO figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.autoscaling_real import (
    CONFIG,
    TRACE,
    Phase,
    arrivals,
    deployment_config,
    replica_seconds,
    scale_events,
    slo_figures,
)
from ebplus.deploy.config import load_config
from harness.load import Outcome

REPO = Path(__file__).resolve().parents[2]


def test_the_trace_is_the_same_for_a_seed_and_follows_its_phases() -> None:
    phases = [Phase(2, 30), Phase(9, 60), Phase(2, 30)]
    times = arrivals(phases, seed=0)
    assert times == arrivals(phases, seed=0) and times != arrivals(phases, seed=1)
    assert times == sorted(times) and times[0] > 0 and times[-1] < 120
    counts = [sum(lo <= t < lo + 30 for t in times) for lo in (0, 30, 60, 90)]
    assert 30 <= counts[0] <= 95 and 180 <= counts[1] + counts[2] <= 900 and 30 <= counts[3] <= 95


def test_replica_seconds_hold_each_sample_until_the_next_within_the_window() -> None:
    samples = [(0.2, 1), (10.0, 2), (30.0, 1)]
    assert replica_seconds(samples, 0.0, 40.0) == pytest.approx(10 * 1 + 20 * 2 + 10 * 1)
    assert replica_seconds(samples, 5.0, 20.0) == pytest.approx(5 * 1 + 10 * 2)
    assert replica_seconds([], 0.0, 10.0) == 0.0
    assert replica_seconds(samples, 10.0, 10.0) == 0.0


def test_scale_events_are_the_changes_of_the_count() -> None:
    samples = [(0.0, 1), (0.5, 1), (12.3, 2), (12.8, 2), (80.1, 1)]
    assert scale_events(samples) == [
        {"t": 12.3, "kind": "up", "from": 1, "to": 2},
        {"t": 80.1, "kind": "down", "from": 2, "to": 1},
    ]
    assert scale_events([(0.0, 1)]) == []


def test_attainment_counts_failed_requests_and_those_without_a_first_token_as_misses() -> None:
    outcomes = [
        Outcome(0, "chat-stream", started=0.0, ended=1.0, first=0.5, ok=True),
        Outcome(1, "chat-stream", started=0.0, ended=3.0, first=2.0, ok=True),
        Outcome(2, "chat-stream", started=0.0, ended=1.0, ok=False, error="APIError"),
        Outcome(3, "completion-stream", started=1.0, ended=1.8, first=1.9, ok=True),
    ]
    out = slo_figures(outcomes, ttft_s=1.0)
    assert out["requests"] == 4 and out["failed"] == 1
    assert out["attainment"] == pytest.approx(2 / 4)
    assert out["ttft_p50_s"] == 0.9 and out["ttft_p99_s"] == 2.0


def test_the_runs_differ_only_in_the_policy_and_carry_the_target(tmp_path: Path) -> None:
    base = load_config(REPO / CONFIG)
    default = load_config(deployment_config(REPO / CONFIG, "default", 1.5, tmp_path / "a.yaml"))
    first = load_config(deployment_config(REPO / CONFIG, "policy-first", 1.5, tmp_path / "b.yaml"))
    assert (default.replicas.autoscaling.policy, first.replicas.autoscaling.policy) == ("default", "policy-first")
    assert first.replicas.autoscaling.model_copy(update={"policy": "default"}) == default.replicas.autoscaling
    assert default.controller.planner.slo.ttft_p99_s == first.controller.planner.slo.ttft_p99_s == 1.5
    assert (base.replicas.autoscaling.min_replicas, base.replicas.autoscaling.max_replicas) == (1, 2)
    assert max(p.rate for p in TRACE) > 2 * TRACE[0].rate == 2 * TRACE[-1].rate
