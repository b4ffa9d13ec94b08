"""The fleet routing benchmark's cells and its page (a small grid: the code, not the figures)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from benchmarks import fleet_bench


def test_a_cell_runs_every_router_on_the_same_requests_and_the_page_reports_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cell = fleet_bench.Cell("h200", "paper", 3, 0.8, "poisson", "eb", 3, per_replica=150)
    runs = fleet_bench.run_cell(cell)
    assert [r.router for r in runs] == ["default", "least-loaded", "phase"]
    assert fleet_bench.grid(fleet_bench.parse(["--replicas", "3", "--requests-per-replica", "150"]))[0].per_replica == 150
    assert all(r.tok_per_s > 0 and r.loaded_tok_per_s and r.ttft_p99_s >= r.ttft_p50_s for r in runs)
    assert all(r.ttft_p99_warm_s is not None and r.ttft_p99_warm_s > 0 for r in runs)
    assert all(r.cold_share is not None and 0 < r.cold_share < 1 for r in runs)  # the first plan came mid-run
    lines = fleet_bench.markdown(runs, "python -m benchmarks.fleet_bench --test", 1.0)
    row = next(line for line in lines if line.startswith("| h200 | paper | 3 | 80% | poisson | eb |"))
    cells = [c.strip() for c in row.split("|")[1:-1]]
    assert len(cells) == 19
    assert cells[15] == f"{phase_warm_ratio(runs):.2f}"
    assert cells[16] == f"{runs[2].cold_share:.1%}"
    assert all(r.drain_spread_s is not None and r.drain_spread_s >= 0 for r in runs)
    assert cells[17] == f"{runs[0].drain_spread_s:.1f} / {runs[2].drain_spread_s:.1f}"
    assert runs[2].tpot_p99_s and runs[0].tpot_p99_s and cells[18] == f"{runs[2].tpot_p99_s / runs[0].tpot_p99_s:.3f}"
    phase, default = runs[2], runs[0]
    assert cells[12:14] == [f"{phase.tok_per_s / default.tok_per_s:.3f}",
                            f"{phase.loaded_tok_per_s / default.loaded_tok_per_s:.3f}"]  # fmt: skip
    assert any("EB cells at 80 % load meeting the target" in line for line in lines)
    assert any(line.startswith("Cells where the phase router's tokens/s") for line in lines)
    assert any(line.startswith("Cells where the phase router's loaded tokens/s") for line in lines)
    fleet_bench.plot(runs, tmp_path / "fleet.png")
    assert (tmp_path / "fleet.png").stat().st_size > 0


def phase_warm_ratio(runs: list[fleet_bench.Run]) -> float:
    default, phase = runs[0], runs[2]
    assert default.ttft_p99_warm_s and phase.ttft_p99_warm_s
    return phase.ttft_p99_warm_s / default.ttft_p99_warm_s


def test_the_warm_p99_leaves_out_the_arrivals_before_the_first_plan() -> None:
    result = SimpleNamespace(arrival_s=np.arange(100.0)[::-1], first_token_s=np.arange(100.0)[::-1] + 0.01)
    result.first_token_s[90:] += 5.0  # the ten that arrived first (before 9.5 s) waited 5 s more
    assert fleet_bench.warm_ttft_p99(result, 9.5) == (pytest.approx(0.01), pytest.approx(0.1))  # type: ignore[arg-type]
    assert fleet_bench.warm_ttft_p99(result, 0.5)[0] == pytest.approx(5.01)  # type: ignore[arg-type]
    assert fleet_bench.warm_ttft_p99(result, None) == (None, None)  # type: ignore[arg-type]  # no plan made
    assert fleet_bench.warm_ttft_p99(result, 100.0) == (None, None)  # type: ignore[arg-type]  # none after it


def test_the_page_names_each_cell_short_of_the_better_baseline(monkeypatch: pytest.MonkeyPatch) -> None:
    cell = fleet_bench.Cell("rtx-pro-6000", "capped-uniform", 4, 0.95, "poisson", "eb", 3)

    def run(router: str, tok: float, loaded: float | None) -> fleet_bench.Run:
        return fleet_bench.Run(cell, router, 0.1, 1.0, tok, 0.2, 1.0, loaded)

    runs = [run("default", 100.0, 50.0), run("least-loaded", 101.0, 49.0), run("phase", 99.5, 50.0)]
    lines = fleet_bench.markdown(runs, "test", 1.0)
    assert "tokens/s (median over the seeds) is more than 1 % below the better baseline's: 1: " \
        "rtx-pro-6000 capped-uniform 4 95% poisson eb (0.985)." in " ".join(lines)
    assert any(line.endswith("loaded tokens/s (median over the seeds) is more than 1 % below the better "
                             "baseline's: 0.") for line in lines)  # fmt: skip
    # and each single run short of the better of the other two routers, by seed and router: here the phase
    # router's run, 99.5 against least-loaded's 101; the default router's 100 is 0.990 of it, not short
    assert lines[-3:] == ["- default: 0.", "- least-loaded: 0.",
                          "- phase: 1: rtx-pro-6000 capped-uniform 4 95% poisson eb seed 3 (0.985)."]  # fmt: skip
    assert lines[-4].startswith("Single runs where a router's tokens/s is more than 1 % below the better of the other")
    behind = [run("default", 98.0, 50.0), run("least-loaded", 100.5, 49.0), run("phase", 99.6, 50.0)]
    assert fleet_bench.markdown(behind, "test", 1.0)[-3:] == [
        "- default: 1: rtx-pro-6000 capped-uniform 4 95% poisson eb seed 3 (0.975).",
        "- least-loaded: 0.",
        "- phase: 0.",
    ]
    old = [run("default", 100.0, None), run("least-loaded", 101.0, None), run("phase", 99.5, None)]
    assert not any("loaded tokens/s" in line for line in fleet_bench.markdown(old, "test", 1.0))


def test_the_cold_threshold_is_the_controllers_and_changes_what_the_fleet_runs_before_its_first_plan(
    capsys: pytest.CaptureFixture[str],
) -> None:
    cells = fleet_bench.grid(fleet_bench.parse(["--quick", "--theta-cold", "0.03"]))
    assert {c.theta_cold for c in cells} == {0.03}
    assert fleet_bench.grid(fleet_bench.parse(["--quick"]))[0].theta_cold is None  # the controller's default
    with pytest.raises(SystemExit):
        fleet_bench.parse(["--theta-cold", "1.5"])
    assert "planner.theta_cold: Input should be less than 1" in capsys.readouterr().err
    cell = fleet_bench.Cell("h200", "capped-uniform", 2, 0.8, "poisson", "eb", 3, per_replica=150)
    default, low = (fleet_bench.run_cell(c)[0] for c in (cell, replace(cell, theta_cold=0.01)))
    assert low.ttft_p99_s != default.ttft_p99_s  # the cold start ran on another k


def test_an_mb_fleet_has_no_controller_and_so_no_cold_start() -> None:
    runs = fleet_bench.run_cell(fleet_bench.Cell("h200", "paper", 2, 0.8, "poisson", "mb", 3, per_replica=100))
    assert [r.router for r in runs] == ["default", "least-loaded", "phase"]
    assert all(r.tok_per_s > 0 and r.ttft_p99_warm_s is None and r.cold_share is None for r in runs)
    row = next(line for line in fleet_bench.markdown(runs, "test", 1.0) if line.startswith("| h200 | paper | 2 |"))
    assert "| – | – | " + f"{runs[0].drain_spread_s:.1f} / {runs[2].drain_spread_s:.1f} |" in row  # no first plan


def test_the_phase_routers_load_cap_is_its_own_and_reaches_every_cell(capsys: pytest.CaptureFixture[str]) -> None:
    assert {c.load_cap for c in fleet_bench.grid(fleet_bench.parse(["--quick"]))} == {1.25}  # the router's default
    uncapped = fleet_bench.grid(fleet_bench.parse(["--quick", "--phase-load-cap", "inf"]))
    assert {c.load_cap for c in uncapped} == {float("inf")}
    with pytest.raises(SystemExit):
        fleet_bench.parse(["--phase-load-cap", "0.5"])
    assert "load_cap must be at least 1" in capsys.readouterr().err
