"""The decision benchmark: what the closed loop and the latency rule cost and buy, in the simulator.

``python -m benchmarks.decisions`` writes ``docs/benchmarks/results/decisions.md`` (and
``decisions-latency.png``; raw JSON to ``benchmarks/results/``) with three tables:

1. *loop cost*: EB+ with the closed loop against EB+ without it (``planner.loop.enabled:
   false``) where the model is right: the calibrated profiles, the paper workload at
   c = 32 / 512 / 2048, seeds 3-5. The ratio is throughput with / without; each seed runs
   both variants on the same requests (the simulator is deterministic, so no interleaving
   is needed: its spread is the seeds').
2. *pinned profiles*: costs the model lacks (``h200-switch``: a per-phase-switch cost;
   ``rtx-pro-6000-mixcurve``: a non-quadratic mixing curve, see ``benchmarks/pinned.py``).
   MB, a fixed-k EB sweep, online EB and EB+ with and without the loop; the mode EB+ ends
   in and its throughput over max(MB, best fixed-k EB).
3. *latency against k*: H200, paper workload, c = 1024: fixed k from 1 to 256 with their
   throughput, TTFT p50/p99 and stall p99, and EB+'s k with the latency rule
   (``slo.tolerance`` 0.01, the default) and without it (0): TTFT p50 and stall p50, and
   the trade-off plot.

Open-loop goodput (Poisson and bursty arrivals, latency targets) is ``bench-sim``'s
(``benchmarks/bench_open.py``): there EB+ is told the targets it is scored by.
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from benchmarks.outputs import SUMMARY_DIR, save_plot, write_summary
from benchmarks.pinned import MIXCURVE_PROFILE, SWITCH_PROFILE, sim_profile
from ebplus.controller.config import ControllerConfig, LoopConfig, PlannerConfig, SloConfig
from ebplus.simulator.sim import Policy, SimConfig, simulate
from ebplus.simulator.workloads import build_requests, load_source

PROFILES = ("h200", "rtx-pro-6000", "l40s", "b300", "cpu-smollm2")
CONCURRENCY = (32, 512, 2048)
REQUESTS = {32: 1000, 512: 4000, 2048: 8000, 1024: 6000}
SEEDS = (3, 4, 5)
N = 2048
PINNED = ((SWITCH_PROFILE, 32), (MIXCURVE_PROFILE, 512))
PINNED_K = (1, 2, 4, 8, 16, 32, 64)
LATENCY_K = (1, 2, 4, 8, 16, 32, 64, 128, 256)
VARIANTS = {
    "open": PlannerConfig(loop=LoopConfig(enabled=False)),
    "loop": PlannerConfig(),
    "k*": PlannerConfig(slo=SloConfig(tolerance=0.0)),  # latency rule off: k = theta* x N
}


@dataclass(frozen=True)
class Run:
    """One simulated run and what the tables need of it."""

    profile: str
    concurrency: int
    policy: str
    k: int | None
    variant: str
    seed: int
    tok_per_s: float = 0.0
    ttft_p50_s: float = 0.0
    stall_p50_s: float = 0.0  # of each request's longest gap between two tokens
    final_mode: str = ""
    typical_k: float = 0.0
    switches: int = 0


def simulate_run(run: Run) -> Run:
    """Run one cell on the paper workload (closed loop at ``run.concurrency``)."""
    requests = build_requests(load_source("paper"), seed=run.seed, requests=REQUESTS[run.concurrency],
                              concurrency=run.concurrency)  # fmt: skip
    controller = ControllerConfig(planner=VARIANTS[run.variant]) if run.variant else None
    res = simulate(sim_profile(run.profile), requests,
                   SimConfig(policy=Policy(run.policy), k=run.k, n=N, controller=controller))  # fmt: skip
    ttft = res.first_token_s - res.arrival_s
    timeline = res.timeline
    # the mode it served the bulk of its traffic in: the last before the final drain
    busy = [a for t, _, _, a in timeline if t <= np.percentile(res.finish_s, 90)]
    return Run(
        profile=run.profile,
        concurrency=run.concurrency,
        policy=run.policy,
        k=run.k,
        variant=run.variant,
        seed=run.seed,
        tok_per_s=res.tok_per_s,
        ttft_p50_s=float(np.median(ttft)),
        stall_p50_s=float(np.median(res.stall_s)),
        final_mode=busy[-1] if busy else run.policy,
        typical_k=float(np.median([k for _, k, _, _ in timeline])) if timeline else float(run.k or 0),
        switches=res.mode_switches,
    )


def grid(quick: bool) -> list[Run]:
    """Every cell of the three tables."""
    seeds = SEEDS[:1] if quick else SEEDS
    profiles = PROFILES[:1] if quick else PROFILES
    runs = [
        Run(p, c, "eb+", None, v, s) for p in profiles for c in CONCURRENCY for s in seeds for v in ("open", "loop")
    ]
    for p, c in PINNED[:1] if quick else PINNED:
        runs += [Run(p, c, "mb", None, "", s) for s in seeds]
        runs += [Run(p, c, "eb", k, "", s) for k in PINNED_K if k < c for s in seeds]
        runs += [Run(p, c, "eb", None, "loop", s) for s in seeds]
        runs += [Run(p, c, "eb+", None, v, s) for v in ("open", "loop") for s in seeds]
    lat_seeds = seeds[:1]
    runs += [Run("h200", 1024, "eb", k, "", s) for k in (LATENCY_K[::3] if quick else LATENCY_K) for s in lat_seeds]
    runs += [Run("h200", 1024, "eb", None, v, s) for v in ("k*", "loop") for s in lat_seeds]
    return runs


def _spread(values: list[float]) -> str:
    return f"{np.median(values):.4f} ({min(values):.4f}-{max(values):.4f})"


def _cells(runs: list[Run], **match: object) -> list[Run]:
    return [r for r in runs if all(getattr(r, k) == v for k, v in match.items())]


def markdown(runs: list[Run], command: str) -> list[str]:
    """The three tables (see the module docstring)."""
    out = [f"Generated by `{command}` (`benchmarks/decisions.py`).", "", "## Loop cost where the model is right", "",
           "| profile | c | EB+ with loop / without, median (min-max over seeds) | switches with / without |",
           "|---|---|---|---|"]  # fmt: skip
    for p in dict.fromkeys(r.profile for r in runs if r.policy == "eb+" and r.concurrency in CONCURRENCY):
        if p in (SWITCH_PROFILE, MIXCURVE_PROFILE):
            continue
        for c in CONCURRENCY:
            loop, open_ = (
                _cells(runs, profile=p, concurrency=c, policy="eb+", variant="loop"),
                _cells(runs, profile=p, concurrency=c, policy="eb+", variant="open"),
            )
            if not loop:
                continue
            ratios = [a.tok_per_s / b.tok_per_s for a, b in zip(loop, open_, strict=True)]
            sw = f"{sum(r.switches for r in loop)} / {sum(r.switches for r in open_)}"
            out.append(f"| {p} | {c} | {_spread(ratios)} | {sw} |")
    out += ["", "## Pinned profiles: costs the model lacks", "",
            "| profile | c | MB tok/s | best fixed k (tok/s) | online EB | EB+ open loop (mode) | EB+ closed loop (mode) "
            "| EB+ / max(MB, best k) open / closed |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for p, c in PINNED:
        mb = _cells(runs, profile=p, concurrency=c, policy="mb")
        if not mb:
            continue
        mean = lambda cells: float(np.mean([r.tok_per_s for r in cells]))  # noqa: E731
        fixed = {k: mean(_cells(runs, profile=p, concurrency=c, policy="eb", k=k)) for k in PINNED_K if k < c}
        best_k = max(fixed, key=fixed.get)
        ref = max(mean(mb), fixed[best_k])
        online = mean(_cells(runs, profile=p, concurrency=c, policy="eb", k=None))
        ebp = {v: _cells(runs, profile=p, concurrency=c, policy="eb+", variant=v) for v in ("open", "loop")}
        modes = {v: "/".join(sorted({r.final_mode for r in cells})) for v, cells in ebp.items()}
        out.append(
            f"| {p} | {c} | {mean(mb):,.0f} | k={best_k}: {fixed[best_k]:,.0f} | {online:,.0f} | "
            f"{mean(ebp['open']):,.0f} ({modes['open']}) | {mean(ebp['loop']):,.0f} ({modes['loop']}) | "
            f"{mean(ebp['open']) / ref:.3f} / {mean(ebp['loop']) / ref:.3f} |"
        )
    out += ["", "## Latency against k (H200, paper workload, c = 1024)", "",
            "Closed loop: every request arrives when another leaves, and the first 1,024 at once, so the tails (even "
            "p90) are that cold cohort's, the same for every k; the medians are the steady state's. A request's stall "
            "is its longest wait between two tokens.", "",
            "| k | tok/s | TTFT p50 (s) | stall p50 (s) |", "|---|---|---|---|"]  # fmt: skip
    for r in sorted(_cells(runs, profile="h200", concurrency=1024), key=lambda r: (r.k is None, r.k or 0, r.variant)):
        label = (
            f"{r.k}"
            if r.k
            else f"online, {'k = theta* x N' if r.variant == 'k*' else 'latency rule'} (k ~ {r.typical_k:.0f})"
        )
        out.append(f"| {label} | {r.tok_per_s:,.0f} | {r.ttft_p50_s:.3f} | {r.stall_p50_s:.3f} |")
    return out


def plot(runs: list[Run], path: Path) -> None:
    """TTFT p50 against throughput for fixed k, with the online points (the trade-off the latency rule makes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = _cells(runs, profile="h200", concurrency=1024)
    fixed = sorted((r for r in cells if r.k), key=lambda r: r.k)
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    ax.plot([r.tok_per_s for r in fixed], [r.ttft_p50_s for r in fixed], "o-", color="grey", label="fixed k")
    for r in fixed:
        ax.annotate(f"k={r.k}", (r.tok_per_s, r.ttft_p50_s), textcoords="offset points", xytext=(4, 4), fontsize=7)
    for r in (r for r in cells if not r.k):
        label = "EB, k = θ*·N" if r.variant == "k*" else "EB, latency rule (1% tolerance)"
        ax.plot([r.tok_per_s], [r.ttft_p50_s], "s" if r.variant == "k*" else "*", markersize=10, label=label)
    ax.set_xlabel("throughput (tok/s)")
    ax.set_ylabel("TTFT p50 (s)")
    ax.set_yscale("log")
    ax.set_title("H200, paper workload, c = 1024: throughput is flat in k, latency is not", fontsize=9)
    ax.legend(fontsize=8)
    save_plot(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", default=str(SUMMARY_DIR / "decisions.md"), help="Markdown summary (the plot beside it)"
    )
    parser.add_argument("--quick", action="store_true", help="one profile, one seed, a coarse k sweep (a smoke run)")
    parser.add_argument("--workers", type=int, default=2, help="simulator processes (default 2)")
    args = parser.parse_args(argv)
    cells = grid(args.quick)
    print(f"decisions: {len(cells)} simulated runs on {args.workers} processes", file=sys.stderr)
    runs = []
    with ProcessPoolExecutor(args.workers) as pool:
        for i, run in enumerate(pool.map(simulate_run, cells), 1):
            runs.append(run)
            if i % 10 == 0 or i == len(cells):
                print(f"decisions: {i}/{len(cells)}", file=sys.stderr)
    out = Path(args.out)
    command = "python -m benchmarks.decisions" + (" --quick" if args.quick else "")
    title = "Decisions: loop cost, pinned profiles, latency against k"
    write_summary(out, title, markdown(runs, command), [asdict(r) for r in runs], "decisions")
    plot(runs, out.with_name(out.stem + "-latency.png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
