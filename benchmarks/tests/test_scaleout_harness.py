"""The scale-out harness's pure parts: config updates, classification of what clients saw, the tables."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.scaleout_bench import render
from ebplus.controller import persistence
from ebplus.deploy.config import load_config
from harness import nodeloss, rollout
from harness.load import LoadResult, Outcome
from harness.multinode import MULTINODE_CONFIG, rollout_config


def test_rollouts_change_an_engine_argument_and_switch_autoscaling_on(tmp_path: Path) -> None:
    base = load_config(MULTINODE_CONFIG)
    first, second = load_config(rollout_config(tmp_path, 1)), load_config(rollout_config(tmp_path, 2))
    assert base.replicas.autoscaling is None and first.replicas.autoscaling is not None
    assert first.engine.max_num_batched_tokens != base.engine.max_num_batched_tokens
    assert second.engine.max_num_batched_tokens == base.engine.max_num_batched_tokens
    assert second.replicas.autoscaling == first.replicas.autoscaling
    assert first.controller == base.controller  # an engine change must not upgrade the controller


def test_thresholds_at_a_version_take_each_replicas_newest_decision() -> None:
    history = [
        {"version": 3, "replica_id": "a", "update": {"k": 2, "n": 16, "active": "eb"}},
        {"version": 5, "replica_id": "a", "update": {"k": 3, "n": 14, "active": "eb"}},
        {"version": 5, "replica_id": "b", "update": {"k": 3, "n": 14, "active": "eb"}},
        {"version": 9, "replica_id": "a", "update": {"k": 1, "n": 8, "active": "mb"}},
    ]
    assert rollout.thresholds_at(history, 6) == {"a": [3, 14, "eb"], "b": [3, 14, "eb"]}
    assert rollout.thresholds_at(history, 2) == {}


def test_the_previous_release_state_maps_onto_the_live_fleet() -> None:
    state = rollout.previous_release_state(["r1", "r2", "r3"], 42)
    assert state["schema_version"] == 1 and state["version"] == 42 and sorted(state["replicas"]) == ["r1", "r2", "r3"]
    assert "outputs" in state["workload"]  # the previous layout, as that code wrote it
    assert persistence.parse(state).version == 42


def outcome(i: int, started: float, ended: float, error: str = "") -> Outcome:
    return Outcome(i, "chat-stream", started, ended, ok=not error, error=error, statuses=[200])


def test_failures_are_split_by_whether_they_were_on_the_lost_node() -> None:
    result = LoadResult(
        outcomes=[
            outcome(0, 9.0, 12.0, "APIError: the model replica serving this request failed; retry the request"),
            outcome(1, 9.5, 10.5),
            outcome(2, 11.0, 13.0, "InternalServerError 503: back-pressure"),
            outcome(3, 9.8, 25.0, "truncated: stream ended without a finish reason"),
        ]
    )
    out = nodeloss.classify(result, t_kill=10.0)
    assert out["in_flight_at_kill"] == 3 and out["in_flight_ended_within_s"] == 15.0
    assert [f["started_s"] for f in out["failed_in_flight_on_lost_node"]] == [-1.0]
    assert [f["started_s"] for f in out["failed_other"]] == [1.0, -0.2]  # a later request; a truncation is never excused
    assert out["silently_truncated"] == 1 and out["longest_request_s"] == 15.2


def test_the_tables_render_from_the_scenarios_figures() -> None:
    kill = {
        "victim": "w1", "lost": {"controller": True, "replicas": ["a"], "pids": 9}, "silently_truncated": 0,
        "in_flight_ended_within_s": 12.5, "longest_request_s": 13.1, "failed_other": [],
        "failed_in_flight_on_lost_node": [{}], "converged_after_serving_s": 2.0, "load": {"sent": 200, "failed": 1},
        "node_declared_dead_s": 13.4, "controller_back_s": 15.0, "controller_restored": True,
        "replacement_serving_s": 60.2, "thresholds_applied_s": 62.2, "in_flight_at_kill": 6,
    }  # fmt: skip
    results = {
        "args": {"rate": 3.0, "watch_s": 10.0},
        "machine": {"when": "now", "cpus": 2},
        "wall_s": 100,
        "node_kills": [kill],
        "rolling_updates": [{"load": {"sent": 80, "failed": 0}, "replicas_before": ["a"], "replicas_after": ["b"],
                             "deploy_s": 95.0, "controller_kept": True}],
        "autoscale": {"load_shape": {"low_rate_per_s": 0.5, "ramp_concurrency": 6}, "replicas": [2, 3, 2],
                      "load": {"sent": 300, "failed": 0}, "seeded": {"c": {"on_fleet_plan": True}}, "scaled_up_s": 50.0, "scaled_down_s": 20.0,
                      "forgot_removed_s": 26.0},
        "controller_upgrade": {"resumed_plans": {"a": [1, 16, "eb"]}, "planted_plans": {"a": [1, 16, "eb"]},
                               "restored": True, "migration_logged": "line", "estimate_kept": True, "cold_replicas": [],
                               "schema_found": 1, "load": {"sent": 40, "failed": 0}, "restart_s": 3.0},
        "newer_state": {"restored": False, "pids_seen": 1, "kept_aside": True, "logged": "line"},
    }  # fmt: skip
    text = render(results, "python -m benchmarks.scaleout_bench")
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert len(rows) == 2 + 5 + 1  # two headers, five must-show rows, one kill
    assert all(row.rstrip().endswith("| yes |") for row in rows[1:6]), text
    json.dumps(results)  # the raw file is plain JSON
