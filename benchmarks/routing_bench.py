"""The phase-aware router on a real deployment against Ray Serve's default router, rounds interleaved.

    python -m benchmarks.routing_bench [--config tests/e2e/routing.yaml] [--routers default,phase]
                                       [--rates 4,6.4] [--rounds 3] [--num-prompts 200]
                                       [--out docs/benchmarks/results/routing-real.md]

Each round starts ``ebplus serve`` once per router (the config's ``replicas.routing.router`` replaced; the
order rotates from round to round, so neither router always runs on the fresher machine), warms it up, and
runs vLLM's serving benchmark (``vllm bench serve``'s code) at each request rate: Poisson arrivals of
random-token prompts answered to exactly ``--output-len`` tokens. It reports TTFT p50/p99 and tokens/s per
router and rate (medians over the rounds, with min-max), the phase router's ratio to the default one within
each round, and the phase router's own decision time (board lookup included, from ``/admin/routing``).

On two cores the replicas share the machine with the benchmark client and Ray: a ratio whose rounds straddle
1 is reported as no difference.
"""

from __future__ import annotations

import argparse
import secrets
import sys
import tempfile
import time
from pathlib import Path

import yaml

from benchmarks.e2e_bench import random_dataset, serving_benchmark, warm_up
from benchmarks.outputs import SUMMARY_DIR, interleaved, spread, write_summary
from ebplus.deploy.app import model_path
from harness import start_deployment, stop_deployment
from harness.routing import ROUTING_CONFIG

PORT = 18400
RAY_METRICS_PORT = 18480
FIGURES = ("ttft_p50_ms", "ttft_p99_ms", "total_tok_per_s")


def deployment_config(base: Path, router: str, workdir: Path) -> Path:
    """A copy of ``base`` with ``replicas.routing.router`` set and this benchmark's ports."""
    cfg = yaml.safe_load(base.read_text())
    cfg.setdefault("replicas", {}).setdefault("routing", {})["router"] = router
    cfg.setdefault("http", {}).update(host="127.0.0.1", port=PORT)
    cfg.setdefault("ray", {})["metrics_export_port"] = RAY_METRICS_PORT
    path = workdir / f"{router}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def run_router(args: argparse.Namespace, router: str, round_: int, workdir: Path) -> list[dict]:
    """One deployment with ``router``: the benchmark at every rate, then what the router saw."""
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
    finally:
        stop_deployment(dep)
    for row in rows:
        row["router_view"] = {k: v for k, v in routing[0].items() if k != "boards"} if routing else None
    return rows


def markdown(rows: list[dict], args: argparse.Namespace, command: str, wall_s: float) -> list[str]:
    """The summary: per rate, each router's figures and the phase router's within-round ratios."""
    lines = [
        f"Command: `{command}` ({wall_s / 60:.0f} min). {args.rounds} rounds, each router once a round "
        f"(order rotated), {args.num_prompts} requests a run, prompts {args.input_len} ± {args.range_ratio:.0%} "
        f"tokens answered to {args.output_len} tokens (`--ignore-eos`), Poisson arrivals. "
        "Median (min–max) over the rounds.",
        "",
        "| rate (req/s) | router | TTFT p50 (ms) | TTFT p99 (ms) | tokens/s | failed |",
        "|---|---|---|---|---|---|",
    ]
    for rate in args.rates:
        for router in args.routers:
            runs = [r for r in rows if r["rate"] == rate and r["router"] == router]
            cells = [spread([r[k] for r in runs], ",.1f" if k != "total_tok_per_s" else ",.0f") for k in FIGURES]
            lines.append(f"| {rate:g} | {router} | {' | '.join(cells)} | {sum(r['failed'] for r in runs)} |")
    if "default" in args.routers and len(args.routers) > 1:
        lines += ["", "Within each round, each router over `default` (median, min–max over the rounds):", ""]
        lines += ["| rate (req/s) | router | TTFT p50 | TTFT p99 | tokens/s |", "|---|---|---|---|---|"]
        for rate in args.rates:
            for router in (r for r in args.routers if r != "default"):
                ratios = {k: [] for k in FIGURES}
                for round_ in range(1, args.rounds + 1):
                    pair = {r["router"]: r for r in rows if r["rate"] == rate and r["round"] == round_}
                    if router in pair and "default" in pair:
                        for k in FIGURES:
                            ratios[k].append(pair[router][k] / pair["default"][k])
                cells = [
                    spread(v, ",.3f") + (" (no difference)" if min(v) <= 1 <= max(v) else "") for v in ratios.values()
                ]
                lines.append(f"| {rate:g} | {router} | {' | '.join(cells)} |")
    views = [r["router_view"] for r in rows if r["router_view"] and r["router"] != "default"]
    if views:
        p50 = [v["decision_us"]["p50"] for v in views]
        p99 = [v["decision_us"]["p99"] for v in views]
        lines += [
            "",
            "Board router decision time (board lookup included; per deployment, every decision of its warm-up and "
            f"runs): p50 {spread(p50, ',.1f')} µs, p99 {spread(p99, ',.1f')} µs over {len(views)} deployments; "
            f"{sum(v['decisions'] for v in views):,} decisions, {sum(v['fallbacks'] for v in views):,} of them "
            "left to power of two choices (no fresh board).",
        ]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(ROUTING_CONFIG), help="deployment config (two replicas in EB)")
    parser.add_argument("--routers", default="default,phase", type=lambda s: s.split(","))
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
    command = "python -m benchmarks.routing_bench " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = markdown(rows, args, command.strip(), time.monotonic() - started)
    write_summary(Path(args.out), "Phase-aware routing on a real deployment", lines, rows, "routing_bench")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
