"""The Scale-out benchmark: node loss, rolling updates, autoscaling and controller upgrades on a multi-node cluster.

Starts a local multi-node Ray cluster (a head and two 1-CPU worker raylets,
:mod:`harness.multinode`), joins ``ebplus serve --config
tests/e2e/multinode.yaml`` to it, and runs under open-loop Poisson load (loopback
only, every run bounded in requests and time):

1. ``--kills`` worker-node losses (SIGKILL of the node's raylet and all under it; a
   replacement node joins 5 s later, as KubeRay recreates a pod), alternating the
   controller's node and a replica-only node;
2. ``--rollouts`` rolling config updates with ``ebplus deploy`` (a new engine argument;
   the first also switches autoscaling on), with one autoscaling cycle (a load ramp up,
   then down) after the first;
3. a controller upgrade that finds the previous release's persisted state, and a
   rollback that finds a newer one.

Writes ``benchmarks/results/scaleout.json`` and ``docs/benchmarks/results/scaleout.md``
(the table docs/benchmarks/scaleout.md quotes).

    .venv/bin/python -m benchmarks.scaleout_bench            # 3 kills, 2 rolling updates (not yet timed)
    .venv/bin/python -m benchmarks.scaleout_bench --quick    # the CI test's sizes
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import harness as rel
from benchmarks.outputs import SUMMARY_DIR, command_line, raw_path
from ebplus.deploy.config import load_config
from harness import nodeloss, rollout
from harness.multinode import MULTINODE_CONFIG, rollout_config, start_cluster

TARGETS = ("controller", "replica")


def _yes(ok: bool) -> str:
    return "yes" if ok else "**no**"


def must_show(r: dict) -> list[str]:
    """The issue's Must-show table, with what was measured and whether it held."""
    lines = ["| What was tried | How often | What must hold | Measured | Held |", "|---|---|---|---|---|"]
    kills = r.get("node_kills", [])
    if kills:
        controller = sum(k["lost"]["controller"] for k in kills)
        trunc = sum(k["silently_truncated"] for k in kills)
        ended = max(k["in_flight_ended_within_s"] for k in kills)
        longest = max(k["longest_request_s"] or 0 for k in kills)
        other = sum(len(k["failed_other"]) for k in kills)
        lost = sum(len(k["failed_in_flight_on_lost_node"]) for k in kills)
        conv = max(k["converged_after_serving_s"] for k in kills)
        sent = sum(k["load"]["sent"] for k in kills)
        ok = trunc == 0 and ended <= nodeloss.END_WITHIN_S and other == 0 and conv <= 60
        lines.append(
            f"| Worker node (raylet and all under it) killed under open-loop load | {len(kills)} kills "
            f"({controller} of the controller's node), {sent} requests | 0 silent truncations; requests in flight "
            f"there end within {nodeloss.END_WITHIN_S:.0f} s; requests not on the lost node 0 failures; fleet converged "
            f"within 60 s of the replacement serving | silent truncations {trunc}; in-flight requests ended ≤ {ended} s "
            f"after the kill (longest request {longest} s); failed elsewhere {other}; failed in flight on the lost node "
            f"{lost} (each a 503 or error event: retry); converged ≤ {conv} s after the replacement served | {_yes(ok)} |"
        )
    auto = r.get("autoscale")
    if auto:
        seeded = [s["on_fleet_plan"] for s in auto["seeded"].values()]
        shape = auto["load_shape"]
        ok = auto["load"]["failed"] == 0 and all(seeded) and bool(seeded)
        lines.append(
            f"| Autoscaling up and down under a load ramp ({shape['low_rate_per_s']} req/s, plus "
            f"{shape['ramp_concurrency']} concurrent requests until scaled up) | 1 cycle ({' → '.join(map(str, auto['replicas']))} replicas), {auto['load']['sent']} requests | 0 failed "
            f"requests; new replicas on the fleet's thresholds at their first push | failed {auto['load']['failed']}; new "
            f"replicas on the fleet's plan at first push {sum(seeded)}/{len(seeded)}; up in {auto['scaled_up_s']} s, down "
            f"{auto['scaled_down_s']} s after the ramp ended, removed replica forgotten after {auto['forgot_removed_s']} s "
            f"| {_yes(ok)} |"
        )
    updates = r.get("rolling_updates", [])
    if updates:
        failed = sum(u["load"]["failed"] for u in updates)
        replaced = all(not set(u["replicas_after"]) & set(u["replicas_before"]) for u in updates)
        lines.append(
            f"| Rolling config update (`ebplus deploy`, a new engine argument) under load | {len(updates)}, "
            f"{sum(u['load']['sent'] for u in updates)} requests | 0 failed requests | failed {failed}; every replica "
            f"replaced {_yes(replaced)}; deploy took {', '.join(str(u['deploy_s']) for u in updates)} s; controller kept "
            f"{sum(u['controller_kept'] for u in updates)}/{len(updates)} | {_yes(failed == 0 and replaced)} |"
        )
    up = r.get("controller_upgrade")
    if up:
        resumed = bool(up["resumed_plans"]) and all(p == up["planted_plans"][rid] for rid, p in up["resumed_plans"].items())
        ok = up["restored"] and bool(up["migration_logged"]) and up["estimate_kept"] and resumed and not up["cold_replicas"]
        lines.append(
            f"| Controller upgraded onto the previous release's state (schema {up['schema_found']}) under load | 1, "
            f"{up['load']['sent']} requests | migrated, no cold start | restored {up['restored']}, migration logged; "
            f"estimate kept {up['estimate_kept']}; plans resumed {len(up['resumed_plans'])}/{len(up['planted_plans'])}; "
            f"cold replicas {len(up['cold_replicas'])}; failed requests {up['load']['failed']}; back in {up['restart_s']} s "
            f"| {_yes(ok and up['load']['failed'] == 0)} |"
        )
    newer = r.get("newer_state")
    if newer:
        ok = not newer["restored"] and newer["pids_seen"] == 1 and newer["kept_aside"] and bool(newer["logged"])
        lines.append(
            f"| Controller started on a state of a newer schema (a rollback) | 1 | refused with a clear log line, never a "
            f"crash loop | refused and logged {bool(newer['logged'])}; kept aside {newer['kept_aside']}; controller "
            f"processes seen in {r['args']['watch_s']:.0f} s: {newer['pids_seen']} | {_yes(ok)} |"
        )
    return lines


def recovery(r: dict) -> list[str]:
    """Time to recover from each node loss (seconds after the kill)."""
    lines = [
        "| Kill | Lost | Ray declared the node dead | Controller back | Replacement serving | Thresholds applied "
        "| In-flight requests ended | Requests (failed) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for i, k in enumerate(r.get("node_kills", []), 1):
        lost = ", ".join(filter(None, ["controller" if k["lost"]["controller"] else "", f"{len(k['lost']['replicas'])} replica(s)"]))
        back = "-" if k["controller_back_s"] is None else f"{k['controller_back_s']} (restored: {k['controller_restored']})"
        lines.append(
            f"| {i}: {k['victim']} | {lost} | {k['node_declared_dead_s']} | {back} | {k['replacement_serving_s']} "
            f"| {k['thresholds_applied_s']} | ≤ {k['in_flight_ended_within_s']} ({k['in_flight_at_kill']} in flight) "
            f"| {k['load']['sent']} ({k['load']['failed']}) |"
        )
    return lines


def render(r: dict, command: str) -> str:
    m = r["machine"]
    return "\n".join(
        [
            f"Scale-out figures, {m['when']}, {m['cpus']} CPUs (`{command}`, {r['wall_s']} s). Open-loop Poisson load "
            f"at {r['args']['rate']} req/s (OpenAI client, 2 retries honouring `Retry-After`), tiny model, "
            "a head and 1-CPU worker raylets on one machine.",
            "",
            *must_show(r),
            "",
            "Time to recover from each node loss, seconds after the kill:",
            "",
            *recovery(r),
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.scaleout_bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="the CI test's sizes: 1 kill, 1 rolling update")
    p.add_argument("--kills", type=int, default=3, help="worker-node losses (alternating the controller's node)")
    p.add_argument("--rollouts", type=int, default=2, help="rolling config updates")
    p.add_argument("--rate", type=float, default=3.0, help="requests/s of the load during node losses")
    p.add_argument("--load-s", type=float, default=75.0, help="seconds of load around each node loss")
    p.add_argument("--watch-s", type=float, default=10.0, help="seconds to watch for a crash loop on a newer state")
    p.add_argument("--out", type=Path, default=SUMMARY_DIR / "scaleout", help="PATH.md gets the tables, benchmarks/results/ the JSON")
    args = p.parse_args(argv)
    if args.quick:
        args.kills, args.rollouts = 1, 1
    results: dict = {
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "when": time.strftime("%Y-%m-%d %H:%M")},
    }
    started = time.monotonic()
    token = secrets.token_hex(16)
    work = Path(tempfile.mkdtemp(prefix="ebplus-scaleout-"))

    def step(name: str, run: Callable[[], dict]) -> dict:
        print(f"[scaleout] {name} ...", flush=True)
        t0 = time.monotonic()
        out = run()
        print(f"[scaleout] {name} done in {time.monotonic() - t0:.0f} s", flush=True)
        return out

    print("[scaleout] starting a local cluster (a head, 2 workers) and the deployment ...", flush=True)
    with start_cluster(token) as local:
        dep = rel.start_deployment(MULTINODE_CONFIG, work / "serve.log", token, ray_address=local.address)
        try:
            with rel.Cluster(dep, auth_mode=local.AUTH_MODE) as cluster:
                results["node_kills"] = [
                    step(
                        f"node loss {i + 1}/{args.kills} ({TARGETS[i % 2]}'s node)",
                        lambda i=i: nodeloss.scenario_node_loss(
                            dep, cluster, local, target=TARGETS[i % 2], rate_per_s=args.rate, load_s=args.load_s, seed=i
                        ),
                    )
                    for i in range(args.kills)
                ]
                results["rolling_updates"] = []
                for i in range(1, args.rollouts + 1):
                    config = rollout_config(work, i)
                    results["rolling_updates"].append(
                        step(
                            f"rolling update {i}/{args.rollouts}",
                            lambda c=config: rollout.scenario_rolling_update(dep, cluster, c, local),
                        )
                    )
                    dep.config = load_config(config)
                    if i == 1 and dep.config.replicas.autoscaling is not None:
                        results["autoscale"] = step("autoscaling cycle", lambda: rollout.scenario_autoscale(dep, cluster))
                results["controller_upgrade"] = step(
                    "controller upgrade onto the previous release's state", lambda: rollout.scenario_controller_upgrade(dep, cluster)
                )
                results["newer_state"] = step(
                    "controller on a newer state", lambda: rollout.scenario_newer_state(dep, cluster, watch_s=args.watch_s)
                )
        finally:
            rel.stop_deployment(dep)
    results["wall_s"] = round(time.monotonic() - started)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    raw_path(args.out.with_suffix(".md")).write_text(json.dumps(results, indent=1, default=str) + "\n")
    text = render(results, command_line("benchmarks.scaleout_bench", argv))
    args.out.with_suffix(".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
