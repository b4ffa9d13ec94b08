"""Policy before replicas in the fleet simulator: policy-first against Ray Serve's default autoscaler.

    python -m benchmarks.autoscaling_bench [--profiles h200 rtx-pro-6000] [--seeds 3 4 5] [--traces burst diurnal]
                                           [--out docs/benchmarks/results/autoscaling.md]

Each trace is a schedule of Poisson phases whose rates are shares of one replica's saturated capacity (the
replicas in EB+ under a TTFT target the controller plans for); each seed runs both autoscalers on the same
requests behind the phase router, from one replica. It reports replica-seconds (starting and draining
replicas included), the share of requests meeting the TTFT target, scale events and the run's span: medians
over the seeds, with min-max, and policy-first's ratio to the default autoscaler within each seed.

* ``burst``: one replica's worth at 60 %, then 2.4 replicas' worth, then 60 % again;
* ``diurnal``: a day squeezed into twelve phases, from 40 % of one replica to 2.6 replicas' worth and back.
"""

from __future__ import annotations

import argparse
import itertools
import math
import time
from pathlib import Path

from benchmarks.outputs import SUMMARY_DIR, command_line, spread, write_summary
from ebplus.controller.config import ControllerConfig, PlannerConfig, SloConfig
from ebplus.controller.cost_model import resolve_profile
from ebplus.deploy.routing import make_router
from ebplus.simulator.autoscaling import Autoscaler, ScalingConfig
from ebplus.simulator.fleet import simulate_fleet
from ebplus.simulator.latency import SloTargets
from ebplus.simulator.sim import Policy, SimConfig, simulate
from ebplus.simulator.workloads import PhaseSpec, Schedule, build_requests, load_source

#: Each phase's share of one replica's saturated capacity, and its share of the trace's requests.
TRACES: dict[str, list[tuple[float, float]]] = {
    "burst": [(0.6, 0.2), (2.4, 0.6), (0.6, 0.2)],
    "diurnal": [(0.4 + 2.2 * (1 - math.cos(2 * math.pi * i / 12)) / 2, 1 / 12) for i in range(12)],
}
POLICIES = ("default", "policy-first")


def schedule(trace: str, workload: str, capacity: float, requests: int) -> Schedule:
    """The trace as a schedule of Poisson phases (rates: shares of one replica's capacity in requests/s)."""
    phases = [
        PhaseSpec(workload=workload, requests=max(1, round(share * requests)), rate=load * capacity)
        for load, share in TRACES[trace]
    ]
    return Schedule(name=trace, phases=phases)


def run(args: argparse.Namespace, name: str, trace: str, seed: int, capacity: float) -> list[dict]:
    """Both autoscalers on one profile, trace and seed."""
    profile = resolve_profile(name)
    slo = SloConfig(ttft_p99_s=args.ttft_s)
    controller = ControllerConfig(planner=PlannerConfig(slo=slo), stagger=args.stagger)
    config = SimConfig(policy=Policy.EBPLUS, controller=controller, slo=SloTargets(ttft_s=args.ttft_s))
    rows = []
    for policy in POLICIES:
        reqs = build_requests(schedule(trace, args.workload, capacity, args.requests), seed=seed)
        scaling = ScalingConfig(policy=policy, max_replicas=args.max_replicas, startup_s=args.startup_s,
                                target_ongoing_requests=args.target_ongoing, upscale_delay_s=args.upscale_delay_s,
                                downscale_delay_s=args.downscale_delay_s)  # fmt: skip
        started = time.perf_counter()
        scaler = Autoscaler(scaling)
        out = simulate_fleet([profile], reqs, config, 1, make_router("phase", seed, stale_s=math.inf),
                             scaler).as_json()  # fmt: skip
        rows.append(
            {
                "profile": name,
                "trace": trace,
                "seed": seed,
                "autoscaler": policy,
                "replica_seconds": out["replica_seconds"],
                "ttft_attainment": out["ttft_attainment"],
                "scale_events": out["scale_events"],
                "span_s": out["sim_seconds"],
                "ttft_p99_s": out["ttft_p99_s"],
                "tok_per_s": out["tok_per_s"],
                "events": out["events"],
                "policy_decisions": sum(d.action == "policy" for d in scaler.decisions),  # the mode as the lever
                "wall_s": time.perf_counter() - started,
            }
        )
        print(f"[autoscaling] {name} {trace} seed {seed} {policy}: {rows[-1]['replica_seconds']:,.0f} replica-s, "
              f"TTFT attainment {rows[-1]['ttft_attainment']:.3f}, {rows[-1]['scale_events']} events", flush=True)  # fmt: skip
    return rows


def markdown(rows: list[dict], args: argparse.Namespace, command: str, wall_s: float, capacity: dict) -> list[str]:
    caps = ", ".join(f"{p} {c:.1f} req/s" for p, c in capacity.items())
    lines = [
        f"Command: `{command}` ({wall_s / 60:.1f} min). Workload `{args.workload}`, {args.requests:,} requests a "
        f"trace, replicas in EB+ behind the phase router, TTFT target {args.ttft_s:g} s (the controller plans for its "
        f"p99; attainment: the share of requests within it). One replica's saturated capacity: {caps}. "
        f"Start-up {args.startup_s:g} s, upscale delay {args.upscale_delay_s:g} s, downscale delay "
        f"{args.downscale_delay_s:g} s, at most {args.max_replicas} replicas; the default autoscaler targets "
        f"{args.target_ongoing:g} ongoing requests a replica. Median (min–max) over seeds {args.seeds}.",
        "",
        "| profile | trace | autoscaler | replica-seconds | TTFT attainment | scale events | TTFT p99 (s) | seconds the policy was the lever |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for profile, trace in itertools.product(args.profiles, args.traces):
        for policy in POLICIES:
            runs = [r for r in rows if (r["profile"], r["trace"], r["autoscaler"]) == (profile, trace, policy)]
            lever = spread([r["policy_decisions"] for r in runs], ".0f") if policy == "policy-first" else "—"
            lines.append(
                f"| {profile} | {trace} | {policy} | {spread([r['replica_seconds'] for r in runs], ',.0f')} | "
                f"{spread([r['ttft_attainment'] for r in runs], '.3f')} | "
                f"{spread([r['scale_events'] for r in runs], '.0f')} | {spread([r['ttft_p99_s'] for r in runs], '.2f')} "
                f"| {lever} |"
            )
    lines += ["", "Policy-first over the default autoscaler, seed by seed:", "",
              "| profile | trace | replica-seconds (ratio) | TTFT attainment (difference) |", "|---|---|---|---|"]  # fmt: skip
    for profile, trace in itertools.product(args.profiles, args.traces):
        pairs = [
            {r["autoscaler"]: r for r in rows if (r["profile"], r["trace"], r["seed"]) == (profile, trace, s)}
            for s in args.seeds
        ]
        rs = [p["policy-first"]["replica_seconds"] / p["default"]["replica_seconds"] for p in pairs]
        att = [p["policy-first"]["ttft_attainment"] - p["default"]["ttft_attainment"] for p in pairs]
        lines.append(f"| {profile} | {trace} | {spread(rs, '.3f')} | {spread(att, '+.3f')} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profiles", nargs="+", default=["h200", "rtx-pro-6000"])
    parser.add_argument("--workload", default="paper")
    parser.add_argument("--traces", nargs="+", default=list(TRACES), choices=list(TRACES))
    parser.add_argument("--seeds", nargs="+", type=int, default=[3, 4, 5])
    parser.add_argument("--requests", type=int, default=60_000, help="requests a trace (spread over its phases)")
    parser.add_argument("--ttft-s", type=float, default=2.0, help="TTFT target (s)")
    parser.add_argument("--max-replicas", type=int, default=6)
    parser.add_argument("--startup-s", type=float, default=60.0)
    parser.add_argument("--upscale-delay-s", type=float, default=30.0)
    parser.add_argument("--downscale-delay-s", type=float, default=120.0)
    parser.add_argument("--stagger", choices=("off", "on"), default="off",
                        help="the controller's staggered windows (default off, as the published run)")  # fmt: skip
    parser.add_argument("--target-ongoing", type=float, default=256.0,
                        help="the default autoscaler's ongoing requests a replica")  # fmt: skip
    parser.add_argument("--out", default=str(SUMMARY_DIR / "autoscaling.md"))
    args = parser.parse_args(argv)
    started = time.perf_counter()
    saturated = build_requests(load_source(args.workload), seed=0, requests=4000)
    capacity = {p: simulate(resolve_profile(p), saturated, SimConfig(policy=Policy.EBPLUS)).req_per_s for p in args.profiles}
    rows = [
        row
        for profile, trace, seed in itertools.product(args.profiles, args.traces, args.seeds)
        for row in run(args, profile, trace, seed, capacity[profile])
    ]
    lines = markdown(rows, args, command_line("benchmarks.autoscaling_bench", argv), time.perf_counter() - started, capacity)
    write_summary(Path(args.out), "Autoscaling: policy before replicas (simulator)", lines, rows, "autoscaling_bench")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
