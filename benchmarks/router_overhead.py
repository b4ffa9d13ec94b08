"""The board router's decision time by fleet size, on an otherwise idle core.

    python -m benchmarks.router_overhead [--replicas 2 16 64 256] [--decisions 20000] [--rounds 3]
                                         [--out docs/benchmarks/results/router-overhead.md]

The routing benchmark (``benchmarks/routing_bench.py``) times the router inside a real deployment, where on
the 2-core test bed the router's thread shares the cores with both engines and its wall-clock tail is mostly
waiting. This one drives the deployment's router itself, :class:`~ebplus.deploy.request_router.BoardRouter`
(``choose_replicas``, ``on_request_routed``, ``on_request_completed``, ``take``), as Ray Serve and the board
channel drive it, in one process on one event loop, so a decision's time is its own: the boards of ``R``
replicas in EB with the controller's hints (each replica's cost model among them, so a tie is priced by the
delay it adds), a pull of fresh reports every ``--decisions-per-pull`` decisions (each pull rebuilds every
board the policy reads), a lease per request routed, released when the request completes
``--in-flight`` decisions later. The times are the router's own (``/admin/routing``'s ``decision_us`` and
``decision_cpu_us``), board lookup included; a pull's time (``take``, which builds the boards the next
decisions read) is timed apart, on the wall clock: it runs in the router's background watch, between
decisions. The fleet sizes run in turn, ``--rounds`` times, the order rotated.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import sys
import time
from collections import deque
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ray.serve._private.common import DeploymentHandleSource, DeploymentID
from ray.serve.request_router import ReplicaID

from benchmarks.outputs import SUMMARY_DIR, command_line, interleaved, publish, spread
from ebplus.controller.cost_model import resolve_profile
from ebplus.controller.messages import Mode, PhaseReport, RoutingHints, encode
from ebplus.deploy.request_router import BoardRouter, percentiles_us

DEPLOYMENT = DeploymentID(name="bench", app_name="ebplus")


def reports(rng: random.Random, ids: list[str], now: float) -> dict[str, bytes]:
    """A report per replica, as the board actor hands them over: EB replicas mid-cycle, some in a window."""
    out = {}
    for rid in ids:
        running = rng.randint(8, 64)
        out[rid] = encode(
            PhaseReport(
                mode=Mode.EB, prefilling=rng.random() < 0.2, running=running, waiting=rng.randint(0, 8), n=64,
                k=rng.randint(4, 16), freed=rng.randint(0, 8), prefill_tokens=rng.randint(0, 4096),
                kv_tokens=running * rng.randint(200, 900), decode_step_s=0.02 + rng.random() * 0.01,
                mean_output=256.0, mean_prompt=512.0, read_at=now - rng.random() * 0.05,
            )
        )  # fmt: skip
    return out


async def drive(replicas: int, decisions: int, per_pull: int, in_flight: int, seed: int) -> dict[str, Any]:
    """``decisions`` decisions over ``replicas`` boards; the router's own percentiles (``BoardRouter.view``)."""
    rng = random.Random(seed)
    router = BoardRouter(deployment_id=DEPLOYMENT, handle_source=DeploymentHandleSource.UNKNOWN)
    router.initialize_state(policy="phase", stale_s=2.0, interval_s=0.1)
    ids = [f"r{i}" for i in range(replicas)]
    candidates = [SimpleNamespace(replica_id=ReplicaID(unique_id=rid, deployment_id=DEPLOYMENT)) for rid in ids]
    cost = resolve_profile("h200").cost_model()  # each replica's cost model, as the controller sends them
    hints = encode(
        RoutingHints(p0=1 / 256, mu_l=512.0, beta_p={rid: 2e-5 for rid in ids}, cost=dict.fromkeys(ids, cost))
    )
    routed: deque[tuple[Any, str]] = deque()
    pulls = []
    for i in range(decisions):
        if i % per_pull == 0:
            newer = reports(rng, ids, time.time())
            started = time.perf_counter()
            router.take(i // per_pull + 1, newer, ids, hints)  # what the watch does with the board actor's answer
            pulls.append(time.perf_counter() - started)
        pending = SimpleNamespace(metadata=SimpleNamespace(internal_request_id=f"q{i}"))
        chosen = (await router.choose_replicas(candidates, pending))[0][0]
        router.on_request_routed(pending, chosen.replica_id, None)
        routed.append((chosen.replica_id, f"q{i}"))
        if len(routed) > in_flight:
            router.on_request_completed(*routed.popleft())
    view = router.view()
    if router._watching is not None:
        router._watching.cancel()
    return {
        **{k: view[k] for k in ("decisions", "fallbacks", "decision_us", "decision_cpu_us")},
        "pull_us": percentiles_us(pulls),  # the same nearest-rank percentiles as the decisions'
    }


def markdown(rows: list[dict], args: argparse.Namespace, command: str, wall_s: float) -> list[str]:
    lines = [
        f"Command: `{command}` ({wall_s:.0f} s). {args.decisions:,} decisions a run, a pull of fresh reports "
        f"every {args.decisions_per_pull} decisions, {args.in_flight} requests in flight, {args.rounds} rounds "
        "with the fleet sizes' order rotated. Median (min–max) over the rounds; microseconds, board lookup "
        "included; *pull*: the router taking one answer of the board actor (its watch, between decisions).",
        "",
        "| replicas | wall p50 | wall p99 | CPU p50 | CPU p99 | pull p50 | pull p99 | fallbacks |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for replicas in args.replicas:
        runs = [r for r in rows if r["replicas"] == replicas]
        cells = [spread([r[clock][q] for r in runs], ",.1f") for clock in ("decision_us", "decision_cpu_us", "pull_us")
                 for q in ("p50", "p99")]  # fmt: skip
        lines.append(f"| {replicas} | {' | '.join(cells)} | {sum(r['fallbacks'] for r in runs)} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", nargs="+", type=int, default=[2, 16, 64, 256], metavar="R")
    parser.add_argument("--decisions", type=int, default=20_000)
    parser.add_argument("--decisions-per-pull", type=int, default=10,
                        help="decisions between two pulls of the board (10: 200 requests/s, boards pulled 20 times a s)")  # fmt: skip
    parser.add_argument("--in-flight", type=int, default=64, help="requests routed and not yet completed")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(SUMMARY_DIR / "router-overhead.md"))
    args = parser.parse_args(argv)
    logging.getLogger("ray.serve.ebplus").setLevel(logging.ERROR)  # no board actor here: the watch would warn
    started = time.monotonic()
    rows = []
    for round_, replicas in interleaved(args.rounds, [str(r) for r in args.replicas]):
        print(f"[router-overhead] round {round_}, {replicas} replicas", file=sys.stderr, flush=True)
        seen = asyncio.run(drive(int(replicas), args.decisions, args.decisions_per_pull, args.in_flight, round_))
        rows.append({"replicas": int(replicas), "round": round_, **seen})
    lines = markdown(rows, args, command_line("benchmarks.router_overhead", argv), time.monotonic() - started)
    publish(Path(args.out), "Board router decision time by fleet size", lines, rows, "router_overhead")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
