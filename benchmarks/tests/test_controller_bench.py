"""The controller benchmark's latency split (a push's wait for the event loop, then its handling) and its table."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import pytest

from benchmarks import controller_bench, controller_fleet
from benchmarks.controller_fleet import FleetShape, bench_latency, bench_snapshot, warm_fleet

#: A fleet small enough for a unit test: four replicas, a few records a push.
SMALL = FleetShape(replicas=4, completions=8, steps=8, running=8, concurrency=16, warm_steps=64)


def test_a_pushs_latency_is_split_into_its_wait_for_the_loop_and_its_handling() -> None:
    fleet, telemetry = warm_fleet(SMALL, seed=0)
    out = bench_latency(fleet, telemetry, seconds=1.0, rate=100.0, recompute_every_s=0.2)
    assert out["recomputes"]["n"] >= 1
    for window in ("idle", "during_recompute"):
        total, wait, handling = out[window], out["wait"][window], out["handling"][window]
        if total["n"] == 0:
            continue
        assert wait["n"] == handling["n"] == total["n"]
        # each part of a push is at most its whole, so the slowest part is at most the slowest whole
        assert 0 <= wait["max_ms"] <= total["max_ms"] and 0 <= handling["max_ms"] <= total["max_ms"]
    assert out["idle"]["n"] + out["during_recompute"]["n"] == 100


@pytest.mark.parametrize("control", ["lock_free_s", "busy_s"])
def test_each_control_holds_the_rounds_but_changes_nothing_and_restores_the_recompute(control: str) -> None:
    fleet, telemetry = warm_fleet(SMALL, seed=0)
    version = fleet.version
    children = set(multiprocessing.active_children())
    out = bench_latency(fleet, telemetry, seconds=1.0, rate=100.0, recompute_every_s=0.2, **{control: 0.05})
    assert set(multiprocessing.active_children()) == children  # the busy control's spinner is gone
    assert out["recomputes"]["n"] >= 1
    assert out["recomputes"]["median_ms"] >= 50.0  # the rounds lasted the sleep they were given
    assert fleet.version == version  # no re-plan ran: nothing was published
    assert out["idle"]["n"] + out["during_recompute"]["n"] == 100
    assert "recompute" not in vars(fleet)  # the fleet's own recompute is back
    fleet.recompute("after")
    assert fleet.version == version + 1


def test_the_snapshot_is_the_whole_fleet_and_is_shown_where_it_was_measured() -> None:
    fleet, _ = warm_fleet(SMALL, seed=0)
    snapshot = bench_snapshot(fleet, repeats=2)
    assert snapshot["n"] == 2 and snapshot["mb"] > 0.1  # four replicas' step windows, at least
    current = {**_round(1.0), "snapshot": {"median_ms": 180.0, "mb": 104.5}}
    table = controller_bench.markdown(_one_run_report(current, baseline=_round(1.0)))
    assert "| the fleet pickled, MB | 104.5 (104.5–104.5) | – |" in table


def _round(scale: float) -> dict:
    pct = {"n": 100, "median_ms": 1.0 * scale, "p99_ms": 2.0 * scale, "max_ms": 3.0 * scale}
    parts = {"idle": pct, "during_recompute": {**pct, "p99_ms": 3.0 * scale}}
    return {
        "ingest": {"completions_per_s": 100_000.0, "updates_per_s": 2.0},
        "recompute": {"median_ms": 50.0},
        "update": {"median_ms": 0.8},
        "latency": {**parts, "wait": parts, "handling": parts, "recomputes": {"median_ms": 70.0}},
    }


def _one_run_report(current: dict, baseline: dict) -> dict:
    """What ``controller_bench`` reports after one run of each version."""
    report: dict = {"replicas": 4, "runs": 1, "seconds": 1.0}
    for name, one in (("current", current), ("baseline", baseline)):
        report[name] = {"summary": controller_bench.summarize([controller_bench.metrics(one)])}
    return report


def test_the_table_shows_each_part_of_the_p99_in_each_window() -> None:
    rounds = [controller_bench.metrics(_round(scale)) for scale in (1.0, 2.0, 1.5)]
    summary = controller_bench.summarize(rounds)
    assert summary["p99_wait_during_ms"] == {"median": 4.5, "min": 3.0, "max": 6.0}
    table = controller_bench.markdown({"replicas": 4, "runs": 3, "seconds": 1.0, "current": {"summary": summary}})
    assert "| ingest p99 idle: waiting for the event loop, ms | 3.000 (2.000–4.000) | – |" in table
    assert "| ingest p99 during a recompute: handled by the actor, ms | 4.500 (3.000–6.000) | – |" in table
    assert "| ingest p99 during a recompute ≤ 1.5× idle p99, in every run | 1.50 (1.50–1.50)× | – | yes |" in table
    rounds[1]["p99_ratio"] = 1.6  # one run over: not met, whatever the median
    table = controller_bench.markdown(
        {"replicas": 4, "runs": 3, "seconds": 1.0, "current": {"summary": controller_bench.summarize(rounds)}}
    )
    assert "| ingest p99 during a recompute ≤ 1.5× idle p99, in every run | 1.50 (1.50–1.60)× | – | **no** |" in table


def test_the_controls_are_shown_for_the_code_that_measured_them_only() -> None:
    current = {**_round(1.0), "lock_free_latency": _round(2.0)["latency"], "busy_latency": _round(3.0)["latency"]}
    report = _one_run_report(current, baseline=_round(1.0))
    table = controller_bench.markdown(report)
    lock_free, busy = f"control, {controller_bench.LOCK_FREE}", f"control, {controller_bench.BUSY}"
    assert f"| {lock_free}: ingest p99 during it / idle | 1.50 (1.50–1.50) | – |" in table
    assert f"| {lock_free}: its p99 wait for the loop, ms | 6.000 (6.000–6.000) | – |" in table
    assert f"| {busy}: its p99 wait for the loop, ms | 9.000 (9.000–9.000) | – |" in table
    report["current"] = report["baseline"]  # a run without the controls: no row for them
    table = controller_bench.markdown(report)
    assert lock_free not in table and busy not in table


def test_the_busy_control_spins_in_another_process_at_the_lowest_priority() -> None:
    """What the busy control stands for is a CPU kept busy outside this process, not this process's own work."""
    fleet, _ = warm_fleet(SMALL, seed=0)
    with controller_fleet._busy_elsewhere_recomputes(fleet, 0.2):
        (spinner,) = [c for c in multiprocessing.active_children() if c.name == "ebplus-bench-spinner"]
        started = time.process_time()
        fleet.recompute("control")
        assert time.process_time() - started < 0.1  # this process waited; the spinner spent the 0.2 s
        assert os.getpriority(os.PRIO_PROCESS, spinner.pid) == controller_fleet.SPINNER_NICE


def test_the_worker_file_runs_by_path_under_a_baseline_interpreter() -> None:
    """``controller_bench`` runs the worker by path: it must not import the checkout's benchmark package."""
    source = controller_bench.WORKER.read_text()
    assert Path(controller_fleet.__file__) == controller_bench.WORKER
    assert "from benchmarks" not in source and "import benchmarks" not in source
