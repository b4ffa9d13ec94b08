"""The fleet routing benchmark's cells and its page (a small grid: the code, not the figures)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import fleet_bench


def test_a_cell_runs_every_router_on_the_same_requests_and_the_page_reports_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fleet_bench, "REQUESTS_PER_REPLICA", 150)
    cell = fleet_bench.Cell("h200", "paper", 3, 0.8, "poisson", "eb", 3)
    runs = fleet_bench.run_cell(cell)
    assert [r.router for r in runs] == ["default", "least-loaded", "phase"]
    assert all(r.tok_per_s > 0 and r.ttft_p99_s >= r.ttft_p50_s for r in runs)
    lines = fleet_bench.markdown(runs, "python -m benchmarks.fleet_bench --test", 1.0)
    row = next(line for line in lines if line.startswith("| h200 | paper | 3 | 80% | poisson | eb |"))
    assert row.count("|") == 15
    assert "EB cells at 80 % load meeting the target" in lines[-1]
    fleet_bench.plot(runs, tmp_path / "fleet.png")
    assert (tmp_path / "fleet.png").stat().st_size > 0
