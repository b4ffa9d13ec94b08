"""End to end: EB+ (mode ``auto``) against MB on the local deployment, same request set.

    python -m benchmarks.e2e_bench [--config deploy/local.yaml] [--modes mb,auto]
                              [--dataset chat|random] [--num-prompts 256]
                              [--max-concurrency 32] [--output-len 256]
                              [--out docs/benchmarks/results/e2e-cpu-smollm2.md]

For each mode the script starts ``ebplus serve`` (the real CLI, in a subprocess)
with the config's ``scheduler.mode`` replaced, waits until it serves, sends a
short warm-up, then runs vLLM's own serving benchmark (``vllm bench serve``'s
code, ``vllm.benchmarks.serve``) against ``/v1/completions`` with a fixed seed.

Datasets:

* ``chat`` (default): natural chat prompts (:mod:`bench.prompts`, the model's
  chat template applied by the benchmark), answered greedily (temperature 0)
  up to ``--output-len``: the model stops on its own, so output lengths have
  the distribution the controller is meant to estimate, and greedy decoding
  makes every mode produce the same tokens.
* ``random``: vLLM's random-token prompts of ``--input-len`` and exactly
  ``--output-len`` output tokens (``ignore_eos``, both ±``--range-ratio``), what
  ``vllm bench serve --dataset-name random --ignore-eos`` sends. Every request ends
  at its cap: the controller learns nothing of natural lengths, and reads the caps
  as what they are, the departures (``model: caps``, ``mu_o`` their mean; see
  ``ebplus.controller.departures``).

It reports output and total tokens/s, TTFT and TPOT percentiles and, for
``auto``, what the controller decided. Modes run one after the other on the same
machine, so the ratio is the figure to read; absolute numbers move with the
machine's load.
"""

from __future__ import annotations

import argparse
import json
import secrets
import tempfile
from pathlib import Path

import httpx
import yaml

from benchmarks.outputs import SUMMARY_DIR, command_line, raw_path
from benchmarks.prompts import chat_requests
from ebplus.deploy.app import model_path
from harness import start_deployment, stop_deployment

PORT = 18200
RAY_METRICS_PORT = 18280


def write_chat_dataset(path: Path, num_prompts: int, seed: int = 0) -> Path:
    """The ``chat`` dataset as vLLM's custom JSONL (one ``{"prompt": ...}`` per line)."""
    with open(path, "w") as fh:
        for chat in chat_requests(num_prompts, seed):
            fh.write(json.dumps({"prompt": chat[0]["content"]}) + "\n")
    return path


def random_dataset(input_len: int, output_len: int, range_ratio: float) -> list[str]:
    """``vllm bench serve`` arguments of its random dataset, every request to its max_tokens (``--ignore-eos``)."""
    return [
        "--dataset-name", "random", "--random-input-len", str(input_len), "--random-output-len", str(output_len),
        "--random-range-ratio", str(range_ratio), "--ignore-eos",
    ]  # fmt: skip


def serving_benchmark(
    base_url: str,
    model_id: str,
    tokenizer: str,
    dataset: list[str],
    num_prompts: int,
    max_concurrency: int,
    result_dir: Path,
    name: str,
    request_rate: float | None = None,
) -> dict:
    """Run vLLM's serving benchmark (``vllm bench serve``'s own code) against ``/v1/completions``; its result.

    ``request_rate``: Poisson arrivals at that many requests/s (open loop, ``--request-rate``), still at most
    ``max_concurrency`` in flight; ``None``: all at once, the concurrency alone bounding them.
    """
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    argv = [
        "--backend", "openai", "--base-url", base_url, "--endpoint", "/v1/completions",
        "--model", model_id, "--tokenizer", tokenizer, *dataset,
        "--num-prompts", str(num_prompts), "--max-concurrency", str(max_concurrency),
        "--seed", "0", "--percentile-metrics", "ttft,tpot,itl",
        "--metric-percentiles", "50,99", "--save-result", "--result-dir", str(result_dir),
        "--result-filename", f"{name}.json", "--disable-tqdm",
    ]  # fmt: skip
    if request_rate is not None:
        argv += ["--request-rate", str(request_rate)]
    return bench_main(parser.parse_args(argv))


def _dataset(args: argparse.Namespace, result_dir: Path) -> list[str]:
    if args.dataset == "chat":
        return [
            "--dataset-name", "custom", "--dataset-path", str(write_chat_dataset(result_dir / "chat.jsonl", args.num_prompts)),
            "--custom-output-len", str(args.output_len), "--temperature", "0",
        ]  # fmt: skip
    return random_dataset(args.input_len, args.output_len, args.range_ratio)


def deployment_config(
    base: str | Path, mode: str, workdir: Path, port: int = PORT, ray_metrics_port: int = RAY_METRICS_PORT
) -> Path:
    """A copy of the config ``base`` in ``workdir`` with ``scheduler.mode`` set and the ports replaced."""
    cfg = yaml.safe_load(Path(base).read_text())
    cfg.setdefault("scheduler", {})["mode"] = mode
    cfg.setdefault("http", {}).update(host="127.0.0.1", port=port)
    cfg.setdefault("ray", {})["metrics_export_port"] = ray_metrics_port
    config_path = workdir / f"{mode}.yaml"
    config_path.write_text(yaml.safe_dump(cfg))
    return config_path


def warm_up(base_url: str, model_id: str, requests: int = 8) -> None:
    """A few short completions: the first steps of a fresh engine are slow."""
    for i in range(requests):
        httpx.post(
            f"{base_url}/v1/completions",
            json={"model": model_id, "prompt": f"warm up {i}", "max_tokens": 8},
            timeout=300,
        ).raise_for_status()


def run_mode(args: argparse.Namespace, mode: str, workdir: Path) -> dict:
    """One deployment in ``mode``, warmed up, benchmarked, stopped."""
    config_path = deployment_config(args.config, mode, workdir)
    log_path = workdir / f"serve-{mode}.log"
    print(f"[e2e] {mode}: starting the deployment (log {log_path})", flush=True)
    dep = start_deployment(config_path, log_path, admin_token=secrets.token_hex(16))
    served, base = dep.config, dep.base_url
    try:
        warm_up(base, served.model.id)
        print(
            f"[e2e] {mode}: benchmarking {args.num_prompts} requests at concurrency {args.max_concurrency}", flush=True
        )
        result = serving_benchmark(
            base, served.model.id, model_path(served), _dataset(args, workdir), args.num_prompts,
            args.max_concurrency, workdir, mode,
        )  # fmt: skip
        admin = dep.admin("/admin/thresholds")
        estimates = dep.admin("/admin/estimates")
    finally:
        stop_deployment(dep)
    replica = next(iter(admin["replicas"].values()), {})
    return {
        "mode": mode,
        "output_tok_per_s": result["output_throughput"],
        "total_tok_per_s": result["total_token_throughput"],
        "req_per_s": result["request_throughput"],
        "completed": result["completed"],
        "failed": result.get("failed", 0),
        "ttft_p50_ms": result["p50_ttft_ms"],
        "ttft_p99_ms": result["p99_ttft_ms"],
        "tpot_p50_ms": result["p50_tpot_ms"],
        "tpot_p99_ms": result["p99_tpot_ms"],
        "final": {key: replica.get(key) for key in ("mode", "active", "k", "n", "version")},
        "estimate": {
            **{
                key: (estimates["fleet"]["estimate"] or {}).get(key)
                for key in ("p0", "eta", "mu_o", "mu_l", "n_samples")
            },
            "updates": estimates["fleet"]["updates"],
        },
    }


def table(rows: list[dict], command: str) -> str:
    base = next((r for r in rows if r["mode"] == "mb"), rows[0])
    lines = [
        f"Command: `{command}`",
        "",
        "| mode | output tok/s | total tok/s | vs mb | req/s | TTFT p50 / p99 (ms) | TPOT p50 / p99 (ms) | failed | final (active, k, N) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        f = r["final"]
        lines.append(
            f"| {r['mode']} | {r['output_tok_per_s']:.1f} | {r['total_tok_per_s']:.1f} | "
            f"{r['total_tok_per_s'] / base['total_tok_per_s']:.3f} | {r['req_per_s']:.2f} | "
            f"{r['ttft_p50_ms']:.0f} / {r['ttft_p99_ms']:.0f} | {r['tpot_p50_ms']:.0f} / {r['tpot_p99_ms']:.0f} | "
            f"{r['failed']} | {f.get('active')}, {f.get('k')}, {f.get('n')} |"
        )
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.e2e_bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", default="deploy/local.yaml", help="base deployment config")
    parser.add_argument("--modes", default="mb,auto", help="comma-separated scheduler modes (mb,eb,v0,auto)")
    parser.add_argument("--num-prompts", type=int, default=256)
    parser.add_argument("--max-concurrency", type=int, default=32)
    parser.add_argument("--dataset", choices=("chat", "random"), default="chat", help="see above")
    parser.add_argument("--input-len", type=int, default=256, help="random: prompt tokens")
    parser.add_argument("--output-len", type=int, default=256, help="chat: max_tokens; random: exact output tokens")
    parser.add_argument("--range-ratio", type=float, default=0.5, help="random: uniform jitter of both lengths (+-)")
    parser.add_argument("--out", type=Path, default=SUMMARY_DIR / "e2e-cpu-smollm2.md")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command = command_line("benchmarks.e2e_bench", argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="ebplus-e2e-") as tmp:
        for mode in args.modes.split(","):
            rows.append(run_mode(args, mode.strip(), Path(tmp)))
            print(json.dumps(rows[-1]), flush=True)
    text = table(rows, command)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    raw_path(args.out).write_text(json.dumps(rows, indent=2))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
