"""Staggered prefill windows on vs off: TTFT and throughput in the fleet simulator.

    python -m benchmarks.stagger_bench [--workers 2]

writes ``docs/benchmarks/results/stagger.md`` (raw JSON to ``benchmarks/results/``). Each cell is a
fleet of the fleet benchmark (``benchmarks/fleet_bench.py``: its capacity, arrivals and workloads) run
twice on the same requests, the controller's ``stagger`` set to ``off`` and to ``on``
(``controller/stagger.py``), behind the ``default`` and the ``phase`` router. The simulator is
deterministic: the spread is the seeds'. A cell's difference counts only outside that spread: the
on/off ratio of every seed on the same side of 1 by more than the tolerance.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from benchmarks.fleet_bench import ARRIVALS, PROFILES, SEEDS, Cell, capacity, run_cells
from benchmarks.outputs import SUMMARY_DIR, write_summary
from ebplus.controller.config import ControllerConfig
from ebplus.controller.cost_model import resolve_profile
from ebplus.deploy.routing import make_router
from ebplus.simulator.fleet import simulate_fleet
from ebplus.simulator.sim import Policy, SimConfig
from ebplus.simulator.workloads import build_requests, load_source

ROUTERS = ("default", "phase")
REPLICAS = (4, 16)
LOADS = (0.8, 0.95)
POLICIES = ("eb", "eb+")
SETTINGS = ("off", "on")
REQUESTS_PER_REPLICA = 800  # as the fleet benchmark: the cold start stays a small share of the p99
TOLERANCE = 0.01  # ratios within 1 % of 1 count as no difference even when the seeds agree


@dataclass(frozen=True)
class Run:
    cell: Cell
    router: str
    stagger: str
    ttft_p50_s: float
    ttft_p99_s: float
    tok_per_s: float
    windows: int
    wall_s: float


def run_cell(cell: Cell) -> list[Run]:
    """Each router with the stagger off then on, on the same requests."""
    rate = cell.load * cell.replicas * capacity(cell.profile, cell.workload, cell.policy)
    runs = []
    for router, setting in itertools.product(ROUTERS, SETTINGS):
        reqs = build_requests(load_source(cell.workload), seed=cell.seed, requests=REQUESTS_PER_REPLICA * cell.replicas,
                              rate=rate, burst_cv=ARRIVALS[cell.arrivals])  # fmt: skip
        config = SimConfig(policy=Policy(cell.policy), controller=ControllerConfig(stagger=setting))
        started = time.perf_counter()
        result = simulate_fleet([resolve_profile(cell.profile)], reqs, config, cell.replicas,
                                make_router(router, cell.seed, stale_s=math.inf))  # fmt: skip
        data = result.as_json()
        runs.append(Run(cell, router, setting, data["ttft_p50_s"], data["ttft_p99_s"], data["tok_per_s"],
                        data["windows_opened"], time.perf_counter() - started))  # fmt: skip
    return runs


def verdict(ratios: list[float]) -> str:
    """``lower`` / ``higher`` when every seed's on/off ratio is beyond the tolerance on that side, else ``same``."""
    if all(r < 1 - TOLERANCE for r in ratios):
        return "lower"
    if all(r > 1 + TOLERANCE for r in ratios):
        return "higher"
    return "same"


def _med(values: list[float]) -> str:
    return f"{np.median(values):.2f} ({min(values):.2f}–{max(values):.2f})"


def markdown(runs: list[Run], command: str, wall_s: float) -> list[str]:
    groups: dict[tuple, dict[str, list[Run]]] = {}
    for r in sorted(runs, key=lambda r: r.cell.seed):
        c = r.cell
        groups.setdefault((c.profile, c.replicas, c.load, c.arrivals, c.policy, r.router), {}).setdefault(
            r.stagger, []
        ).append(r)
    seeds = sorted({r.cell.seed for r in runs})
    walls = [r.wall_s for r in runs]
    lines = [
        f"Written by `{command}` in {wall_s / 60:.1f} min (one run {min(walls):.1f}–{max(walls):.1f} s); "
        f"workload {runs[0].cell.workload}, {REQUESTS_PER_REPLICA} requests per replica, seeds "
        f"{', '.join(map(str, seeds))}. Each ratio is stagger on over off on the same requests, per seed; shown "
        "as the median (min–max). *Verdict*: lower / higher only when every seed's ratio is more than "
        f"{TOLERANCE:.0%} on that side of 1, else same (a difference inside the seeds' spread is none).",
        "",
        "| profile | R | load | arrivals | policy | router | TTFT p99 off (s) | p99 on/off | p99 | TTFT p50 on/off "
        "| p50 | tok/s on/off | tok/s | windows on/off |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    tally: dict[str, dict[str, int]] = {m: {"lower": 0, "same": 0, "higher": 0} for m in ("p99", "p50", "tok")}
    for key, by in sorted(groups.items()):
        off, on = by["off"], by["on"]
        ratio = {
            "p99": [b.ttft_p99_s / a.ttft_p99_s for a, b in zip(off, on, strict=True)],
            "p50": [b.ttft_p50_s / a.ttft_p50_s for a, b in zip(off, on, strict=True)],
            "tok": [b.tok_per_s / a.tok_per_s for a, b in zip(off, on, strict=True)],
        }
        verdicts = {m: verdict(v) for m, v in ratio.items()}
        for m, v in verdicts.items():
            tally[m][v] += 1
        windows = [b.windows / a.windows for a, b in zip(off, on, strict=True) if a.windows]
        lines.append(
            f"| {key[0]} | {key[1]} | {key[2]:.0%} | {key[3]} | {key[4]} | {key[5]} | "
            f"{_med([r.ttft_p99_s for r in off])} | {_med(ratio['p99'])} | {verdicts['p99']} | {_med(ratio['p50'])} "
            f"| {verdicts['p50']} | {_med(ratio['tok'])} | {verdicts['tok']} | "
            f"{_med(windows) if windows else '–'} |"
        )
    lines += [""] + [
        f"- {name}: lower with the stagger in {t['lower']} cells, higher in {t['higher']}, no difference in {t['same']}."
        for name, t in (("TTFT p99", tally["p99"]), ("TTFT p50", tally["p50"]), ("tok/s", tally["tok"]))
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(SUMMARY_DIR / "stagger.md"), help="Markdown summary")
    parser.add_argument("--workers", type=int, default=2, help="simulator processes (default 2)")
    parser.add_argument("--profiles", nargs="+", default=list(PROFILES), metavar="NAME")
    parser.add_argument("--workload", default="paper", metavar="NAME")
    parser.add_argument("--replicas", nargs="+", type=int, default=list(REPLICAS), metavar="R")
    parser.add_argument("--loads", nargs="+", type=float, default=list(LOADS), metavar="SHARE")
    parser.add_argument("--arrivals", nargs="+", choices=list(ARRIVALS), default=list(ARRIVALS))
    parser.add_argument("--policies", nargs="+", choices=list(POLICIES), default=list(POLICIES))
    parser.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS), metavar="SEED")
    args = parser.parse_args(argv)
    axes = (args.profiles, [args.workload], args.replicas, args.loads, args.arrivals, args.policies, args.seeds)
    cells = [Cell(*c) for c in itertools.product(*axes)]
    cells.sort(key=lambda c: (c.seed, c.replicas))  # seeds interleaved: every cell's first seed before any second
    print(f"stagger: {len(cells)} cells x {len(ROUTERS) * len(SETTINGS)} runs on {args.workers} processes",
          file=sys.stderr)  # fmt: skip
    runs, wall = run_cells("stagger", run_cell, cells, args.workers)
    command = "python -m benchmarks.stagger_bench " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = markdown(runs, command, wall)
    write_summary(Path(args.out), "Staggered windows: generated results", lines, [asdict(r) for r in runs], "stagger")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
