"""The phase-aware router and staggered windows on a real deployment, against Ray Serve's default router.

    python -m benchmarks.routing_bench [--config tests/e2e/routing.yaml]
                                       [--routers default,phase,phase+unstaggered,phase+inherit,phase+ingress0,
                                                  phase+routerinherit]
                                       [--rates 4,6.4] [--rounds 3] [--num-prompts 200]
                                       [--out docs/benchmarks/results/routing-real.md]

An arm is a router (the config's ``replicas.routing.router`` replaced), and a suffix after it sets one key
of the config (:data:`VARIANTS`): ``+unstaggered``, ``controller.stagger: off`` (the config's own setting,
the default ``on``, otherwise); ``+inherit``, ``replicas.engine_niceness: inherit`` (the engines at the
replicas' CPU priority instead of below it, the default on these CPU replicas); ``+ingress0``,
``http.ingress_niceness: 0`` (the ingress, whose routers decide, at niceness 0 instead of Ray's 15);
``+routerinherit``, ``http.router_niceness: inherit`` (the routers' thread at the ingress's niceness instead of
0). Each round starts
``ebplus serve`` once per arm (the order rotates from round to round, so no arm always runs on the fresher
machine), warms it up, and runs vLLM's serving benchmark (``vllm bench serve``'s code) at each request
rate: Poisson arrivals of random-token prompts answered to exactly ``--output-len`` tokens. It reports
TTFT p50/p99 and tokens/s per arm and rate (medians over the rounds, with min-max); within each round,
each arm's ratio to the default router and each suffixed arm's base over it; the controller's
stagger decision and the windows its timer opened; and the board router's decision time (board lookup
included, from ``/admin/routing``), on the wall clock and in the router thread's CPU time.

On two cores the replicas share the machine with the benchmark client and Ray: a ratio whose rounds straddle
1 is reported as no difference.
"""

from __future__ import annotations

import argparse
import secrets
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks.e2e_bench import random_dataset, serving_benchmark, warm_up
from benchmarks.outputs import SUMMARY_DIR, command_line, interleaved, publish, spread
from ebplus.deploy.app import model_path
from harness import Deployment, start_deployment, stop_deployment
from harness.routing import ROUTING_CONFIG

PORT = 18400
RAY_METRICS_PORT = 18480
FIGURES = ("ttft_p50_ms", "ttft_p99_ms", "total_tok_per_s")
#: An arm's suffix that turns the controller's stagger off (``controller.stagger: off``).
UNSTAGGERED = "+unstaggered"
#: An arm's suffix that leaves the engines at the replicas' CPU priority (``replicas.engine_niceness: inherit``).
INHERIT = "+inherit"
#: An arm's suffix that starts the ingress, where the routers decide, at niceness 0 (``http.ingress_niceness: 0``).
INGRESS0 = "+ingress0"
#: An arm's suffix that leaves the routers' thread at the ingress's niceness (``http.router_niceness: inherit``).
ROUTER_INHERIT = "+routerinherit"
#: Each suffix an arm may carry, and the key it sets: (section, key, value).
VARIANTS = {
    UNSTAGGERED: ("controller", "stagger", "off"),
    INHERIT: ("replicas", "engine_niceness", "inherit"),
    INGRESS0: ("http", "ingress_niceness", 0),
    ROUTER_INHERIT: ("http", "router_niceness", "inherit"),
}
#: The decision-time clocks ``/admin/routing`` reports (``ebplus.deploy.request_router.CLOCKS``), as the summary
#: names them.
CLOCK_NAMES = {"decision_us": "wall clock", "decision_cpu_us": "router thread's CPU time"}


def base_arm(arm: str) -> str:
    """The arm without its suffix (:data:`VARIANTS`), or ``arm`` itself if it has none."""
    return next((arm.removesuffix(s) for s in VARIANTS if arm.endswith(s)), arm)


def deployment_config(base: Path, arm: str, workdir: Path) -> Path:
    """A copy of ``base`` set up for ``arm`` (its router, the key its suffix sets) and this benchmark's ports."""
    cfg = yaml.safe_load(base.read_text())
    router = base_arm(arm)
    cfg.setdefault("replicas", {}).setdefault("routing", {})["router"] = router
    if router != arm:
        section, key, value = VARIANTS[arm.removeprefix(router)]
        cfg.setdefault(section, {})[key] = value
    cfg.setdefault("http", {}).update(host="127.0.0.1", port=PORT)
    cfg.setdefault("ray", {})["metrics_export_port"] = RAY_METRICS_PORT
    path = workdir / f"{arm}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def stagger_seen(dep: Deployment) -> dict[str, Any]:
    """The controller's stagger decision now (``/admin/thresholds``) and the windows its timer opened over the
    deployment's life (``ebplus_stagger_windows_total``, summed over the replicas, from ``/metrics``)."""
    decision = dep.thresholds().get("stagger") or {}
    return {"on": decision.get("on"), "reason": decision.get("reason"), "period_s": decision.get("period_s"),
            "timer_windows": int(dep.metric_total("ebplus_stagger_windows_total"))}  # fmt: skip


def run_router(args: argparse.Namespace, router: str, round_: int, workdir: Path) -> list[dict]:
    """One deployment of the arm ``router``: the benchmark at every rate, then what the router and the
    controller's stagger saw."""
    log = workdir / f"serve-{router}-{round_}.log"
    print(f"[routing] round {round_}, {router}: starting the deployment (log {log})", flush=True)
    dep = start_deployment(deployment_config(Path(args.config), router, workdir), log, secrets.token_hex(16))
    rows = []
    try:
        warm_up(dep.base_url, dep.model, requests=16)
        dataset = random_dataset(args.input_len, args.output_len, args.range_ratio)
        for rate in args.rates:
            print(f"[routing] round {round_}, {router}: {args.num_prompts} requests at {rate}/s", flush=True)
            result = serving_benchmark(
                dep.base_url, dep.model, model_path(dep.config), dataset, args.num_prompts, args.max_concurrency,
                workdir, f"{router}-{rate}-{round_}", request_rate=rate,
            )  # fmt: skip
            rows.append(
                {
                    "router": router,
                    "rate": rate,
                    "round": round_,
                    "completed": result["completed"],
                    "failed": result.get("failed", 0),
                    "ttft_p50_ms": float(result["p50_ttft_ms"]),
                    "ttft_p99_ms": float(result["p99_ttft_ms"]),
                    "total_tok_per_s": float(result["total_token_throughput"]),
                }
            )
        routing = dep.admin("/admin/routing")["routers"]
        stagger = stagger_seen(dep)
    finally:
        stop_deployment(dep)
    for row in rows:
        row["router_view"] = {k: v for k, v in routing[0].items() if k != "boards"} if routing else None
        row["stagger"] = stagger
    return rows


def ratio_rows(rows: list[dict], args: argparse.Namespace, pairs: list[tuple[str, str]]) -> list[str]:
    """Table rows: within each round, ``arm`` over ``base`` for each pair, per rate (median, min–max over the
    rounds; a spread that straddles 1 is no difference)."""
    lines = []
    for rate in args.rates:
        for arm, base in pairs:
            ratios: dict[str, list[float]] = {k: [] for k in FIGURES}
            for round_ in range(1, args.rounds + 1):
                pair = {r["router"]: r for r in rows if r["rate"] == rate and r["round"] == round_}
                if arm in pair and base in pair:
                    for k in FIGURES:
                        ratios[k].append(pair[arm][k] / pair[base][k])
            if not ratios[FIGURES[0]]:
                continue
            cells = [spread(v, ",.3f") + (" (no difference)" if min(v) <= 1 <= max(v) else "") for v in ratios.values()]
            lines.append(f"| {rate:g} | {arm} / {base} | {' | '.join(cells)} |")
    return lines


def markdown(rows: list[dict], args: argparse.Namespace, command: str, wall_s: float) -> list[str]:
    """The summary: per rate, each arm's figures; the within-round ratios; the stagger; the decision time."""
    lines = [
        f"Command: `{command}` ({wall_s / 60:.0f} min). {args.rounds} rounds, each arm once a round "
        f"(order rotated), {args.num_prompts} requests a run, prompts {args.input_len} ± {args.range_ratio:.0%} "
        f"tokens answered to {args.output_len} tokens (`--ignore-eos`), Poisson arrivals. "
        f"An arm `ROUTER{UNSTAGGERED}` runs with `controller.stagger: off`, an arm `ROUTER{INHERIT}` with "
        f"`replicas.engine_niceness: inherit`, an arm `ROUTER{INGRESS0}` with `http.ingress_niceness: 0`, an arm "
        f"`ROUTER{ROUTER_INHERIT}` with `http.router_niceness: inherit`. "
        "Median (min–max) over the rounds.",
        "",
        "| rate (req/s) | arm | TTFT p50 (ms) | TTFT p99 (ms) | tokens/s | failed |",
        "|---|---|---|---|---|---|",
    ]
    for rate in args.rates:
        for router in args.routers:
            runs = [r for r in rows if r["rate"] == rate and r["router"] == router]
            cells = [spread([r[k] for r in runs], ",.1f" if k != "total_tok_per_s" else ",.0f") for k in FIGURES]
            lines.append(f"| {rate:g} | {router} | {' | '.join(cells)} | {sum(r['failed'] for r in runs)} |")
    pairs = [(arm, "default") for arm in args.routers if arm != "default" and "default" in args.routers]
    pairs += [(base_arm(arm), arm) for arm in args.routers if base_arm(arm) != arm and base_arm(arm) in args.routers]
    table = ratio_rows(rows, args, pairs)
    if table:
        lines += ["", "Within each round, one arm over another (median, min–max over the rounds):", ""]
        lines += ["| rate (req/s) | arms | TTFT p50 | TTFT p99 | tokens/s |", "|---|---|---|---|---|", *table]
    lines += ["", "The controller's stagger, read at the end of each deployment:", ""]
    for router in args.routers:
        seen = [r["stagger"] for r in rows if r["router"] == router and r["rate"] == args.rates[0]]
        ons = sorted({str(s["on"]) for s in seen})
        lines.append(
            f"- `{router}`: on {'/'.join(ons)}; period {spread([s['period_s'] or 0.0 for s in seen], '.3f')} s; "
            f"windows opened by its timer {spread([s['timer_windows'] for s in seen], ',.0f')} a deployment; "
            f"reason: {seen[0]['reason']}"
        )
    board_arms = [arm for arm in args.routers if arm != "default"]
    if any(r["router_view"] for r in rows):
        lines += [
            "",
            "Board router decision time per arm (board lookup included; per deployment, every decision of its "
            "warm-up and runs; the arms apart, since a suffix can change what the router's thread waits for):",
        ]
    for arm in board_arms:
        views = [
            r["router_view"] for r in rows if r["router_view"] and r["router"] == arm and r["rate"] == args.rates[0]
        ]
        if not views:
            continue
        threads = sorted({"the ingress's niceness" if v.get("thread") is None else f"niceness {v['thread']['niceness']}"
                          for v in views})  # fmt: skip
        lines += [
            "",
            f"`{arm}`: {len(views)} deployments, {sum(v['decisions'] for v in views):,} decisions, "
            f"{sum(v['fallbacks'] for v in views):,} of them left to power of two choices for want of a fresh board; "
            f"the routers' thread at {' / '.join(threads)} (`http.router_niceness`).",
            "",
        ]
        for key, name in CLOCK_NAMES.items():
            timed = [v[key] for v in views if v.get(key, {}).get("p99") is not None]
            if timed:
                lines.append(f"- {name}: p50 {spread([t['p50'] for t in timed], ',.1f')} µs, "
                             f"p99 {spread([t['p99'] for t in timed], ',.1f')} µs")  # fmt: skip
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(ROUTING_CONFIG), help="deployment config (two replicas in EB)")
    parser.add_argument("--routers", default=f"default,phase,phase{UNSTAGGERED}", type=lambda s: s.split(","),
                        help=f"the arms: routers, each with {UNSTAGGERED} for the controller's stagger off, "
                             f"{INHERIT} for the engines at the replicas' CPU priority or {INGRESS0} for the "
                             "ingress at niceness 0")  # fmt: skip
    parser.add_argument("--rates", default="4,6.4", type=lambda s: [float(x) for x in s.split(",")],
                        help="request rates (req/s); the defaults are ~50%% and ~80%% of the config's capacity here")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--num-prompts", type=int, default=200)
    parser.add_argument("--max-concurrency", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--range-ratio", type=float, default=0.5)
    parser.add_argument("--out", default=str(SUMMARY_DIR / "routing-real.md"))
    args = parser.parse_args(argv)
    started = time.monotonic()
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="ebplus-routing-") as tmp:
        for round_, router in interleaved(args.rounds, args.routers):
            rows += run_router(args, router, round_, Path(tmp))
    lines = markdown(rows, args, command_line("benchmarks.routing_bench", argv), time.monotonic() - started)
    publish(Path(args.out), "Phase-aware routing on a real deployment", lines, rows, "routing_bench")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
