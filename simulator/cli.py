"""``ebplus sim run``: the simulator from the shell, the what-if for a user's workload and profile.

Heavy imports (numpy, the simulator) happen inside the run function so that
``ebplus --help`` stays fast.
"""

from __future__ import annotations

import argparse
import json
import math

from ebplus.arguments import positive_float, positive_int
from ebplus.errors import CommandError

POLICIES = ("mb", "eb", "v0", "eb+")
ROUTER_NAMES = ("default", "least-loaded", "phase")  # ebplus.deploy.routing.ROUTERS, without importing it


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="simulate one policy on a hardware profile and workload",
        description=(
            "Simulate one engine replica step by step: the real phase machine picks each step, the "
            "profile's cost model times it, KV capacity forces vLLM-style preemption, and for online "
            "policies the real controller (estimator, closed forms, planner) sets k, N and the mode "
            "from telemetry (first after 30 completions, then every 100 and whenever the load shifts 2x). "
            "Policies: mb = mixed batching (vLLM v1); eb = "
            "exclusive batching, online k and N unless --k is given; v0 = prefill-first (EB with k=1); "
            "eb+ = EB or MB as the controller decides. Arrivals: --concurrency C keeps C requests in "
            "flight (vllm bench serve --max-concurrency), --rate R is Poisson (bursty with --burst-cv), "
            "neither queues every request at t=0 (saturated). Latency: TTFT, TPOT, inter-token latency "
            "(ITL) and each request's largest gap (stall); with --slo-* targets, the fraction of requests "
            "meeting each and the goodput (requests meeting all of them per second)."
        ),
        epilog=(
            "Profiles: a name from controller/profiles (h200, rtx-pro-6000, l40s, b300, cpu-smollm2, and the pinned "
            "scenarios h200-switch and rtx-pro-6000-mixcurve, whose truth-only costs the controller does not know) "
            "or a YAML file. "
            "Workloads: a name from simulator/workloads (e.g. paper, balanced, decode-heavy, "
            "distribution-shift), a YAML workload or schedule file, or a JSONL trace with one "
            '{"input_len": .., "output_len": .., "arrival_s": .., "max_tokens": ..} per line (arrival_s and '
            "max_tokens optional; output_len is the natural length, cut to max_tokens with finish=length). "
            "JSON keys (--json): see SimResult in ebplus.simulator.result."
        ),
    )
    p.add_argument(
        "--profile",
        required=True,
        metavar="NAME|FILE[,...]",
        help="hardware profile; with --replicas, a comma-separated list is taken in turn (a mixed fleet)",
    )
    p.add_argument("--workload", required=True, metavar="NAME|FILE", help="workload, schedule or trace")
    p.add_argument("--policy", required=True, choices=POLICIES, help="batching policy")
    p.add_argument("--k", type=positive_int, default=None, help="fixed EB threshold (with --policy eb)")
    p.add_argument("--n", type=positive_int, default=1024, help="max running requests (max_num_seqs; default 1024)")
    p.add_argument(
        "--budget", type=positive_int, default=8192, help="max tokens per step (max_num_batched_tokens; 8192)"
    )
    arrivals = p.add_mutually_exclusive_group()
    arrivals.add_argument("--concurrency", type=positive_int, default=None, help="closed loop: requests in flight")
    arrivals.add_argument("--rate", type=positive_float, default=None, help="open loop: Poisson requests/s")
    p.add_argument(
        "--burst-cv",
        type=positive_float,
        default=None,
        metavar="CV",
        help="with --rate: bursty arrivals, a Gamma renewal process whose gaps have this coefficient of variation",
    )
    for name, what in (
        ("ttft", "time to first token"),
        ("itl", "largest inter-token gap (stall)"),
        ("tpot", "time per output token"),
    ):
        p.add_argument(
            f"--slo-{name}",
            type=positive_float,
            default=None,
            metavar="S",
            help=f"target for each request's {what}, seconds (attainment and goodput)",
        )
    p.add_argument(
        "--requests", type=positive_int, default=None, help="requests (per phase of a schedule; default 2000)"
    )
    p.add_argument(
        "--replicas",
        type=positive_int,
        default=1,
        help="replicas behind a router, one controller for all (default 1: one engine, no router)",
    )
    p.add_argument(
        "--router",
        choices=ROUTER_NAMES,
        default="default",
        help="with --replicas > 1: default = Ray Serve's power of two choices on queue length; least-loaded = "
        "the least prompt tokens to prefill plus KV tokens decoding; phase = the replica whose next prefill "
        "window admits the request soonest (ebplus.deploy.routing)",
    )
    p.add_argument(
        "--stagger",
        choices=("on", "off"),
        default="on",
        help="with --replicas > 1 and online EB: the controller's staggered prefill windows (controller.stagger; "
        "default on)",
    )
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run_simulate)


def run_simulate(args: argparse.Namespace) -> int:
    from ebplus.controller.config import ControllerConfig
    from ebplus.controller.cost_model import resolve_profile
    from ebplus.deploy.routing import make_router
    from ebplus.simulator.fleet import simulate_fleet
    from ebplus.simulator.latency import SloTargets
    from ebplus.simulator.sim import Policy, SimConfig, simulate
    from ebplus.simulator.workloads import build_requests, load_source

    profiles = [resolve_profile(name) for name in args.profile.split(",")]
    if len(profiles) > 1 and args.replicas == 1:
        raise CommandError("--profile: several profiles need --replicas > 1")
    profile = profiles[0]
    source = load_source(args.workload)
    slo = SloTargets(args.slo_ttft, args.slo_itl, args.slo_tpot)
    slo = None if slo == SloTargets() else slo
    controller = ControllerConfig(stagger=args.stagger)
    config = SimConfig(policy=Policy(args.policy), k=args.k, n=args.n, budget=args.budget, slo=slo, controller=controller)
    reqs = build_requests(source, seed=args.seed, requests=args.requests, concurrency=args.concurrency,
                          rate=args.rate, burst_cv=args.burst_cv)  # fmt: skip
    fleet = None
    if args.replicas > 1:
        fleet = simulate_fleet(profiles, reqs, config, args.replicas, make_router(args.router, args.seed, math.inf))
        result, data = fleet.fleet, fleet.as_json()
    else:
        result = simulate(profile, reqs, config)
        data = result.as_json()
    if args.json:
        print(json.dumps(data))
        return 0
    policy = args.policy + (f" (k={args.k})" if args.k else " (online)" if config.online else "")
    print(f"profile        {', '.join(p.name for p in profiles)}")
    if fleet is not None:
        short = data["windows_short_share"]
        print(f"fleet          {args.replicas} replicas behind the {args.router} router; occupancy "
              f"{data['occupancy_min']:.2f}..{data['occupancy_max']:.2f} (mean {data['occupancy_mean']:.2f}); "
              f"{data['windows_opened']} prefill windows"
              + ("" if short is None else f", {100 * short:.0f}% admitted fewer than k"))  # fmt: skip
    print(f"workload       {reqs.name or args.workload}: {', '.join(ph.label for ph in reqs.phases)}")
    print(f"policy         {policy}, N <= {args.n}, budget {args.budget} tokens/step")
    print(f"requests       {data['requests']} in {data['sim_seconds']:.1f} simulated s")
    print(f"throughput     {data['req_per_s']:.2f} req/s, {data['tok_per_s']:.0f} tok/s, "
          f"{data['out_tok_per_s']:.0f} output tok/s")  # fmt: skip
    print(f"TTFT p50/p99   {data['ttft_p50_s']:.3f} / {data['ttft_p99_s']:.3f} s")
    print(f"TPOT p50/p99   {data['tpot_p50_s'] * 1e3:.2f} / {data['tpot_p99_s'] * 1e3:.2f} ms")
    print(f"ITL p50/p99    {data['itl_p50_s'] * 1e3:.2f} / {data['itl_p99_s'] * 1e3:.2f} ms")
    print(f"stall p99/max  {data['stall_p99_s']:.3f} / {data['stall_max_s']:.3f} s (largest gap per request)")
    if slo is not None:
        met = ", ".join(
            f"{name} {100 * data[f'{name}_attainment']:.1f}%"
            for name in ("ttft", "itl", "tpot")
            if data[f"{name}_attainment"] is not None
        )
        print(f"SLO met        {met}; goodput {data['goodput_req_per_s']:.2f} req/s")
    print(f"preemptions    {data['preemptions']}")
    print(f"mode switches  {data['mode_switches']}")
    k = "-" if data["k_final"] is None else data["k_final"]
    print(f"final k, N     {k}, {data['n_final']}")
    if len(reqs.phases) > 1:
        for (_, _, label, _), tps in zip(result.phase_bounds, result.phase_tok_per_s(), strict=True):
            print(f"  phase {label}: {tps:.0f} tok/s")
    return 0
