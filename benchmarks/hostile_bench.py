"""The hostile-input and fault campaign (issue 23, ``make bench-hostile``): one deployment per mode, every probe, per
probe the answers, 5xx, ingress and head RSS peaks, requests lost, engine work left and whether the controller kept
deciding.

The ``ebplus serve`` half starts ``tests/e2e/faults.yaml`` with the controller's ``state_dir`` on an 8 MiB tmpfs
(mounted for the run, root only; without it the disk-full probe is not run and the page says why), or attaches to
one (``--attach PID:LOG``), and runs the probes of :mod:`harness.campaign` (request families, stalled connections,
floods) and :mod:`harness.campaign_faults` (controller probes and faults). The plugin half starts ``vllm serve``
with EB+'s plugins (:mod:`harness.plugin`), its controller's ``state_dir`` on its own 8 MiB tmpfs, and runs the
request probes, then disk full, an engine wedge and a restart onto a corrupt state. The ``make-serve`` step starts
what ``make serve`` starts (the Makefile's default ``CONFIG``) and lists its listeners outside loopback.
``tests/e2e/test_reliability.py`` runs :func:`probes` with ``quick=True`` against its own deployment and asserts
the targets.

    .venv/bin/python -m benchmarks.hostile_bench                  # every mode and probe (~13 min on 2 cores)
    .venv/bin/python -m benchmarks.hostile_bench --modes make-serve   # only the listeners of a local `make serve`
    .venv/bin/python -m benchmarks.hostile_bench --quick          # the request probes, shorter, 100 churned ids
    .venv/bin/python -m benchmarks.hostile_bench --modes serve    # one mode
    .venv/bin/python -m benchmarks.hostile_bench --quick --probes slow-loris   # one probe family, both modes

Writes ``benchmarks/results/hostile.json`` and ``docs/benchmarks/results/hostile.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml

import harness as rel
from benchmarks.outputs import SUMMARY_DIR, raw_path
from harness import campaign as cp
from harness import campaign_faults as cf
from harness.deployment import ROOT
from harness.hostile import RAY_LISTENERS, is_loopback, listeners, ray_listener_kind
from harness.plugin import ADDITIONAL, PluginServer, start_plugin_server, stop_plugin_server

#: (name, what it does, injected fault?, the probe)
Probe = tuple[str, str, bool, Callable[[], dict]]


def request_probes(target: cp.Target, *, max_model_len: int, budget: int, max_body: int, quick: bool) -> list[Probe]:
    """The probes of requests and connections, for either mode: the three request families, stalled connections,
    a flood of reads under load (``quick``: shorter stalls and flood)."""
    hold_s, flood_s = (8.0, 6.0) if quick else (20.0, 20.0)
    return [
        ("oversized", "50 requests past a limit: output length, output budget, prompt length, body size (10 chunked)",
         False, lambda: cp.send_family(target, cp.oversized_cases(target.model, max_model_len, budget, max_body))),
        ("malformed", "50 malformed bodies and headers: cut JSON, wrong types, content types and encodings, credentials",
         False, lambda: cp.send_family(target, cp.malformed_cases(target.model))),
        ("unicode", "30 unicode and encoding cases: 15 valid texts, 15 invalid or foreign encodings",
         False, lambda: cp.send_family(target, cp.unicode_cases(target.model))),
        ("slow-loris", f"20 stalled or abandoned connections at once, each held up to {hold_s:.0f} s",
         False, lambda: cp.slow_loris(target, hold_s=hold_s)),
        ("flood", f"16 readers of /metrics, /health and /admin for {flood_s:.0f} s during a client load",
         False, lambda: cp.flood(target, seconds=flood_s)),
    ]  # fmt: skip


def probes(
    dep: rel.Deployment, cluster: rel.Cluster, *, quick: bool, state_dir: Path | None, mounted: bool
) -> list[Probe]:
    """The campaign's probes of ``ebplus serve`` in the order they run: requests first, faults last (each fault
    leaves the deployment as it was, but a replica killed takes a minute to be replaced). ``quick``: no faults
    that kill or stop a process or touch the controller's state, shorter floods and stalls, 100 churned ids."""
    http, rep = dep.config.http, dep.config.replicas
    churn = 100 if quick else 1000
    out = request_probes(dep, max_model_len=dep.config.engine.max_model_len, budget=rep.max_request_output or 0,
                         max_body=http.max_body_bytes, quick=quick)  # fmt: skip
    out += [
        ("cursor-jump", "a telemetry batch of a live replica id claiming index 2**61",
         False, lambda: cf.cursor_jump(dep, cluster)),
        ("churn", f"{churn} replica ids register, push a batch and leave",
         False, lambda: cf.replica_churn(dep, cluster, ids=churn)),
    ]  # fmt: skip
    if quick:
        return out
    if mounted and state_dir is not None:
        out.append(("disk-full", "the controller's state_dir file system filled under load, then freed",
                    True, lambda: cf.disk_full(dep, state_dir, lambda: _persist_error(cluster), cf.controller_logs(cluster))))  # fmt: skip
    out += [
        ("corrupt-state", "the controller killed and restarted onto a state file cut short",
         True, lambda: cf.corrupt_state(dep, cluster, state_dir)),
        ("engine-wedge", "SIGSTOP of the busiest replica's engine for 10 s under load, then SIGCONT",
         True, lambda: cf.engine_wedge(dep, lambda: cp.busiest_replica_pid(cluster, dep.config.replicas.num_replicas))),
        ("replica-kill", "SIGKILL of the busiest replica mid-stream under load (clients retry twice)",
         True, lambda: cf.replica_kill(dep, cluster)),
    ]  # fmt: skip
    return out


def _persist_error(cluster: rel.Cluster) -> str | None:
    """Why the controller actor's state is not persisted now (its snapshot's report; ``None``: it is)."""
    return (cluster.snapshot().get("controller") or {}).get("persist_error")


#: How a probe is measured: ``(name, probe, injected) -> row`` (:func:`harness.campaign.observe` for one mode)
Measure = Callable[[str, Callable[[], dict], bool], dict]


def serve_measure(dep: rel.Deployment, cluster: rel.Cluster) -> Measure:
    return lambda name, probe, injected: cp.measure(name, dep, cluster, probe, injected=injected)


def plugin_measure(srv: PluginServer) -> Measure:
    return lambda name, probe, injected: cp.observe(name, srv, probe, version=srv.version,
                                                    engine_work=srv.engine_running, roles=cp.PLUGIN_ROLES,
                                                    injected=injected)  # fmt: skip


def only(plan: list[Probe], names: str | None) -> list[Probe]:
    """The probes of ``plan`` named in ``names`` (comma-separated; ``None``: all)."""
    if names is None:
        return plan
    wanted = set(names.split(","))
    unknown = wanted - {p[0] for p in plan}
    if unknown:
        raise SystemExit(f"--probes: no probe {', '.join(sorted(unknown))} here ({', '.join(p[0] for p in plan)})")
    return [p for p in plan if p[0] in wanted]


def run(plan: list[Probe], measure: Measure) -> list[dict]:
    """Each probe under ``measure``, with progress lines."""
    rows = []
    for i, (name, what, injected, probe) in enumerate(plan, 1):
        print(f"[hostile] {i}/{len(plan)} {name}: {what} ...", flush=True)
        try:
            row = measure(name, probe, injected)
        except Exception as exc:  # one probe that breaks must not lose the others' figures: reported as failed
            print(f"[hostile]   {name} FAILED: {type(exc).__name__}: {exc}", flush=True)
            rows.append({"probe": name, "what": what, "failed": f"{type(exc).__name__}: {exc}"[:500]})
            continue
        row["what"] = what
        rows.append(row)
        print(f"[hostile]   answers {row['answers']} 5xx {row['5xx']} lost {row['lost']} engine left "
              f"{row['engine_left']} deciding {row['deciding']['ok']} ({row['seconds']} s)", flush=True)  # fmt: skip
    return rows


def listener_rows(pid: int) -> list[dict]:
    """The listeners outside loopback of the process tree of ``pid``, each with Ray's reason (``None``: unexplained)."""
    rows = [f for f in listeners(pid) if not is_loopback(f["address"])]
    for row in rows:
        kind = ray_listener_kind(row["process"])
        row["reason"] = None if kind is None else RAY_LISTENERS[kind]
    return rows


def table(rows: list[dict]) -> list[str]:
    lines = [
        "| Probe | Cases | Answers | 5xx | RSS peak ingress / head (MiB) | Lost | Engine work left after 5 s | Controller deciding | Seconds |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "failed" in r:
            lines.append(f"| {r['probe']} | - | **the probe failed**: {r['failed'][:200]} | - | - | - | - | - | - |")
            continue
        answers = ", ".join(f"{k}: {v}" for k, v in r["answers"].items())
        fives = f"{r['5xx']} (injected fault)" if r["injected"] and r["5xx"] else str(r["5xx"])
        d, rss = r["deciding"], r["rss_peak_mib"]
        lines.append(
            f"| {r['probe']} | {r['cases']} | {answers} | {fives} | {rss['ingress']} / {rss.get('head', '-')} | "
            f"{r['lost']} | {r['engine_left']} | {'yes' if d['ok'] else 'no'} (v{d.get('version')}) | {r['seconds']} |"
        )
    return lines


def details(rows: list[dict]) -> list[str]:
    """What each probe saw beyond the table's columns (its own figures, from the JSON)."""
    skip = {"probe", "cases", "answers", "5xx", "injected", "rss_peak_mib", "lost", "engine_left", "deciding",
            "seconds", "what", "control_status", "load", "by_case"}  # fmt: skip
    lines = []
    for r in rows:
        extra = {k: v for k, v in r.items() if k not in skip}
        lines.append(f"- **{r['probe']}** ({r['what']}): `{json.dumps(extra, default=str)[:1500]}`")
    return lines


def section(title: str, part: dict) -> list[str]:
    """One mode's table, its targets, each probe's own figures and its listeners outside loopback."""
    rows = [r for r in part["probes"] if "failed" not in r]
    failed = [r["probe"] for r in part["probes"] if "failed" in r]
    lines = [
        f"## {title}", "", part["about"], "", *table(part["probes"]), "",
        f"Targets: 5xx outside injected faults **{sum(r['5xx'] for r in rows if not r['injected'])}** (target 0); "
        f"lost **{sum(r['lost'] for r in rows)}** (target 0); engine work left after 5 s "
        f"**{sum(r['engine_left'] for r in rows)}** (target 0); controller deciding after every probe: "
        f"**{all(r['deciding']['ok'] for r in rows)}**; probes that failed to run: **{len(failed)}** {failed or ''}.",
        "", "Per probe:", "", *details(rows), "",
    ]  # fmt: skip
    return lines + listener_lines(part.get("listeners", []), part.get("held_elsewhere", []))


def listener_lines(outside: list[dict], elsewhere: list[str]) -> list[str]:
    """The count of listeners outside loopback, then each with Ray's reason (``elsewhere``: :func:`held_elsewhere`)."""
    lines = [f"Listeners outside loopback: {len(outside)}, unexplained {sum(r['reason'] is None for r in outside)}.", ""]
    if elsewhere:
        lines += [f"Held by a process outside this deployment (another Ray cluster on the machine) once it had "
                  f"started or when it was listed: Ray's fixed ports {', '.join(elsewhere)}. Those it could not "
                  "bind are not in the list; a deployment alone on the machine listens on them too, for the "
                  "reasons below.", ""]  # fmt: skip
    if outside:
        lines += ["| Address | Port | Process | Why Ray gives no way to bind it to loopback |", "|---|---|---|---|"]
        lines += [f"| {r['address']} | {r['port']} | `{r['process'][:80]}` | {r['reason']} |" for r in outside]
        lines.append("")
    return lines


def local_section(part: dict) -> list[str]:
    """The deployment ``make serve`` starts: how it went, and its listeners outside loopback."""
    return ["## A local `make serve`", "", part["about"], "", *listener_lines(part["listeners"], part["held_elsewhere"])]


def write(results: dict, out: Path, argv: list[str]) -> None:
    lines = [
        f"{results['machine']['when']}, {results['machine']['cpus']} CPUs "
        f"(`python -m benchmarks.hostile_bench {' '.join(argv)}`, {results['wall_s']} s in all).",
        "",
    ]
    for mode, title in (("serve", "`ebplus serve`"), ("plugin", "Plugin mode (`vllm serve` with EB+'s plugins)")):
        if mode in results:
            lines += section(title, results[mode])
    if "make-serve" in results:
        lines += local_section(results["make-serve"])
    if results.get("not_run"):
        lines += ["Not run: " + "; ".join(results["not_run"]), ""]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("# Hostile input and faults: figures\n\n" + "\n".join(lines))
    raw_path(out).write_text(json.dumps(results, indent=1, default=str) + "\n")


def faults_config(state_dir: Path | None, where: Path) -> Path:
    """``tests/e2e/faults.yaml`` with the controller's state in ``state_dir`` (a file the probes can fill and corrupt)."""
    config = yaml.safe_load(rel.FAULTS_CONFIG.read_text())
    if state_dir is not None:
        config["controller"]["state_dir"] = str(state_dir)
    config["model"]["cache_dir"] = str(rel.FAULTS_CONFIG.parents[2] / config["model"]["cache_dir"])
    path = where / "hostile.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def serve_half(args: argparse.Namespace, scratch: Path, not_run: list[str]) -> dict:
    """The campaign on ``ebplus serve`` (started here, or attached to)."""
    state_dir = scratch / "state"
    with cf.tmpfs_or_none(state_dir) as reason:
        mounted = reason is None
        if args.attach:
            pid, log = args.attach.split(":", 1)
            dep = rel.attach_deployment(rel.FAULTS_CONFIG, Path(log), args.admin_token or "", args.api_key, int(pid))
            state_dir, mounted, where = None, False, "that of the attached deployment"
        else:
            print(f"[hostile] starting ebplus serve (state_dir {state_dir}) ...", flush=True)
            config = faults_config(state_dir, scratch)
            dep = rel.start_deployment(config, scratch / "serve.log", secrets.token_hex(16), secrets.token_hex(16))
            where = f"an {cf.TMPFS_KIB // 1024} MiB tmpfs" if mounted else "a directory of /tmp"
        if not mounted and not args.quick:
            not_run.append(f"serve: disk-full ({reason or where})")
        try:
            taken = held_elsewhere(dep.pid)
            with rel.Cluster(dep) as cluster:
                plan = only(probes(dep, cluster, quick=args.quick, state_dir=state_dir, mounted=mounted), args.probes)
                rows = run(plan, serve_measure(dep, cluster))
            listening = listener_rows(dep.pid)
            elsewhere = named(taken | held_elsewhere(dep.pid))
        finally:
            if dep.process is not None:
                rel.stop_deployment(dep)
    about = (f"`ebplus serve` on `tests/e2e/faults.yaml` (two replicas of the tiny model), the controller's "
             f"state_dir on {where}.")  # fmt: skip
    return {"about": about, "probes": rows, "listeners": listening, "held_elsewhere": elsewhere}


def plugin_half(args: argparse.Namespace, scratch: Path, not_run: list[str]) -> dict:
    """The probes on ``vllm serve`` with EB+'s plugins, with the limits of the serve half (an output budget of
    20,000 tokens, 256 KiB bodies, its read deadline) and its controller's state in a ``state_dir`` on an 8 MiB
    tmpfs, persisted as often (``persist_every_s``). ``EBPLUS_ROOT`` is passed on when set: a checkout that points
    the editable install at another worktree with it (a development setup) must run that worktree's plugin."""
    faults = yaml.safe_load(rel.FAULTS_CONFIG.read_text())
    state_dir = scratch / "plugin-state"
    keep = {k: os.environ[k] for k in ("EBPLUS_ROOT",) if k in os.environ}
    (scratch / "plugin").mkdir()
    with cf.tmpfs_or_none(state_dir) as reason:
        ours = ADDITIONAL["ebplus"]
        controller = {**ours["controller"], "state_dir": str(state_dir),
                      "persist_every_s": faults["controller"]["persist_every_s"]}
        additional = {"ebplus": {**ours, "controller": controller, "max_body_bytes": 262144,
                                 "read_deadline_s": faults["http"]["read_deadline_s"],
                                 "replicas": {**ours["replicas"], "max_request_output": 20000}}}  # fmt: skip
        where = f"an {cf.TMPFS_KIB // 1024} MiB tmpfs" if reason is None else "a directory of /tmp"
        print(f"[hostile] starting vllm serve with the ebplus plugins (state_dir {state_dir}) ...", flush=True)
        srv = start_plugin_server(scratch / "plugin", additional, extra_env=keep)
        try:
            plan = request_probes(srv, max_model_len=512, budget=20000, max_body=262144, quick=args.quick)
            if not args.quick:
                plan += plugin_faults(srv, state_dir, mounted=reason is None)
            if reason is not None and not args.quick:
                not_run.append(f"plugin: disk-full ({reason})")
            rows = run(only(plan, args.probes), plugin_measure(srv))
            listening = listener_rows(srv.pid)
        finally:
            stop_plugin_server(srv)
    about = ("`vllm serve` (`python -m vllm.entrypoints.openai.api_server`) with `VLLM_PLUGINS=ebplus` and EB+'s "
             "scheduler, the tiny model, one engine, no Ray: the controller runs inside the API server, so the "
             "RSS column has no head, and engine work is vLLM's `vllm:num_requests_running`. The controller's "
             f"state_dir on {where}.")  # fmt: skip
    return {"about": about, "probes": rows, "listeners": listening}


def plugin_faults(srv: PluginServer, state_dir: Path, *, mounted: bool) -> list[Probe]:
    """The faults of the plugin mode, the restart last (``mounted``: ``state_dir`` is a tmpfs that can fill)."""
    full: list[Probe] = [("disk-full", "the controller's state_dir file system filled under load, then freed",
                          True, lambda: cf.disk_full(srv, state_dir))]  # fmt: skip
    return [
        *(full if mounted else []),
        ("engine-wedge", "SIGSTOP of the engine core for 10 s under load, then SIGCONT",
         True, lambda: cf.engine_wedge(srv, lambda: srv.pid)),
        ("corrupt-state", "vllm serve stopped, its state file cut short, started again",
         True, lambda: cf.plugin_corrupt_state(srv, state_dir)),
    ]  # fmt: skip


#: Ray's fixed ports (``ray_constants``) that a process of a deployment's tree listens on: a second Ray cluster on
#: the same machine (another user's) cannot bind them, and the deployment then lists fewer listeners
RAY_FIXED_PORTS = {52365: "the dashboard agent's HTTP port", 44217: "the autoscaler monitor's metrics server",
                   44227: "the dashboard head's metrics server"}  # fmt: skip


def held_elsewhere(pid: int) -> set[int]:
    """Ray's fixed ports that a process outside the tree of ``pid`` listens on now. Checked once the deployment
    has started and again when it is listed: another cluster may have let go of a port by the listing."""
    import psutil

    ours = {f["port"] for f in listeners(pid)}
    busy = {c.laddr.port for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
    return (busy - ours) & RAY_FIXED_PORTS.keys()


def named(ports: set[int]) -> list[str]:
    return [f"{port} ({RAY_FIXED_PORTS[port]})" for port in sorted(ports)]


def make_serve_config() -> Path:
    """The config ``make serve`` starts (the Makefile's ``CONFIG ?=`` default)."""
    match = re.search(r"^CONFIG \?= (\S+)", (ROOT / "Makefile").read_text(), re.MULTILINE)
    if match is None:
        raise SystemExit("the Makefile names no default CONFIG")
    return ROOT / match.group(1)


def make_serve_half(scratch: Path, settle_s: float = 10.0) -> dict:
    """The deployment a local ``make serve`` starts (``ebplus serve --config`` on the Makefile's default config),
    healthy and ``settle_s`` later (Ray's agents start after the banner), listed and stopped with SIGTERM."""
    config = make_serve_config()
    print(f"[hostile] starting ebplus serve --config {config.relative_to(ROOT)} (make serve) ...", flush=True)
    t0 = time.monotonic()
    dep = rel.start_deployment(config, scratch / "make-serve.log", secrets.token_hex(16))
    started_s = time.monotonic() - t0
    try:
        taken = held_elsewhere(dep.pid)
        time.sleep(settle_s)
        listening = listener_rows(dep.pid)
        elsewhere = named(taken | held_elsewhere(dep.pid))
    finally:
        t1 = time.monotonic()
        rel.stop_deployment(dep)
    stopped = dep.process.returncode if dep.process is not None else None
    about = (f"`ebplus serve --config {config.relative_to(ROOT)}` (what `make serve` runs: {dep.config.model.id}, "
             f"{dep.config.replicas.num_replicas} replica, HTTP on {dep.config.http.host}:{dep.config.http.port}), "
             f"healthy after {started_s:.0f} s; its process tree's listeners {settle_s:.0f} s later; stopped with "
             f"SIGTERM in {time.monotonic() - t1:.0f} s, exit status {stopped}.")  # fmt: skip
    return {"about": about, "listeners": listening, "exit_status": stopped, "held_elsewhere": elsewhere}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m benchmarks.hostile_bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="the request families, shorter, no faults")
    p.add_argument("--modes", default="serve,plugin,make-serve",
                   help="serve, plugin, make-serve (the listeners of a local `make serve`), comma-separated; default: all")
    p.add_argument("--probes", default=None, help="only these probes, comma-separated (e.g. slow-loris)")
    p.add_argument("--attach", default=None, help="PID:LOG of a running `ebplus serve --config tests/e2e/faults.yaml`")
    p.add_argument("--admin-token", default=None, help="with --attach: the deployment's admin token")
    p.add_argument("--api-key", default=None, help="with --attach: the deployment's API key")
    p.add_argument("--out", type=Path, default=SUMMARY_DIR / "hostile.md", help="the summary; the JSON beside it")
    args = p.parse_args(argv)
    modes = args.modes.split(",")
    started = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix="ebplus-hostile-"))
    not_run: list[str] = []
    results: dict = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                 "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}}  # fmt: skip
    local = not args.quick and (args.probes is None or "listeners" in args.probes.split(","))
    halves = (("serve", lambda: serve_half(args, scratch, not_run)), ("plugin", lambda: plugin_half(args, scratch, not_run)),
              ("make-serve", lambda: make_serve_half(scratch)))  # fmt: skip
    for mode, half in halves:
        if mode == "make-serve" and not local:
            if mode in modes:
                not_run.append("the listeners of a local `make serve` (--quick or --probes without listeners)")
            continue
        if mode in modes:
            t0 = time.monotonic()
            try:
                results[mode] = half()
            except Exception as exc:  # a half that could not start must not lose the other's figures
                print(f"[hostile] {mode} FAILED: {type(exc).__name__}: {exc}", flush=True)
                not_run.append(f"{mode}: everything ({type(exc).__name__}: {str(exc)[:300]})")
                continue
            results[mode]["wall_s"] = round(time.monotonic() - t0)
    if args.probes:
        not_run.append(f"every probe but {args.probes} (--probes)")
    elif args.quick and "serve" in modes:
        not_run.append("serve: disk-full, corrupt-state, engine-wedge, replica-kill (--quick)")
    if "plugin" in modes and not args.probes:
        not_run.append("plugin: cursor-jump and churn (the plugin's controller takes telemetry from its own engine "
                       "in process: it has no intake another process can send to), replica-kill (one engine, no "
                       "replica to fail over to)" + (", disk-full, engine-wedge, corrupt-state (--quick)" if args.quick else ""))  # fmt: skip
    results["not_run"] = not_run
    results["wall_s"] = round(time.monotonic() - started)
    write(results, args.out, argv)
    print(args.out.read_text())
    subprocess.run(["rm", "-rf", str(scratch)], check=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
