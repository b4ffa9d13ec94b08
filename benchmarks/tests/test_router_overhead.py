"""The router overhead benchmark drives the deployment's board router as Ray Serve and the board channel do."""

from __future__ import annotations

import asyncio

from benchmarks.router_overhead import drive


def test_every_decision_is_the_phase_routers_and_timed_on_both_clocks() -> None:
    seen = asyncio.run(drive(replicas=8, decisions=200, per_pull=10, in_flight=16, seed=0))
    assert seen["decisions"] == 200 and seen["fallbacks"] == 0  # the boards were fresh: no power of two choices
    for clock in ("decision_us", "decision_cpu_us"):
        assert seen[clock]["n"] == 200 and 0 < seen[clock]["p50"] <= seen[clock]["p99"]
    assert 0 < seen["pull_us"]["p50"] <= seen["pull_us"]["p99"]
