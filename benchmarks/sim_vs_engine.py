"""Simulator against engine on one request set: predicted vs measured throughput, TTFT and TPOT per policy.

    python -m benchmarks.sim_vs_engine --engine benchmarks/results/engine.json --profile gpu-qwen2.yaml
                                         [--out sim-vs-engine.md]

Reads what :mod:`benchmarks.engine_bench` wrote (its raw JSON: the request set as
served - every prompt's length and every output's length - the closed-loop
concurrency, ``max_num_seqs``, the token budget and each policy's measured
figures), replays the same lengths in the simulator with the same concurrency,
``N``, budget and ``max_tokens`` caps under the same policy (``stock`` and ``mb``:
MB; ``eb-k<k>`` and ``eb-theory-k<k>``: EB at that fixed ``k``; ``auto``: EB+, the
real controller in the loop with the engine benchmark's ``update_every``), and
prints one row per policy with the relative error of each prediction. Cells off
by more than 5% (throughput) or 10% (latency) are marked.

The GPU runbook (:mod:`benchmarks.gpu_runbook`) runs it after the engine
benchmark with the profile ``ebplus profile`` fitted on the same engine.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: Relative errors beyond these are marked (the issue's bar for sim-to-real agreement).
THROUGHPUT_TOLERANCE = 0.05
LATENCY_TOLERANCE = 0.10


@dataclass(frozen=True)
class Cell:
    """One policy: measured on the engine, predicted by the simulator."""

    policy: str
    measured: dict[str, float]
    predicted: dict[str, float]

    def error(self, key: str) -> float:
        return self.predicted[key] / self.measured[key] - 1.0


KEYS = (("total_tps", THROUGHPUT_TOLERANCE), ("ttft_p50_s", LATENCY_TOLERANCE), ("tpot_p50_ms", LATENCY_TOLERANCE))


def sim_policy(label: str) -> tuple[str, int | None]:
    """The simulator's policy and fixed ``k`` for an engine benchmark policy label."""
    from ebplus.simulator.sim import Policy

    if label in ("stock", "mb"):
        return Policy.MB, None
    m = re.fullmatch(r"eb-(?:theory-)?k(\d+)", label)
    if m:
        return Policy.EB, int(m.group(1))
    if label == "auto":
        return Policy.EBPLUS, None
    raise ValueError(f"engine policy {label!r} has no simulator counterpart")


def requests_of(meta: dict):
    """The engine benchmark's request set as the simulator's closed-loop input (caps marked as caps)."""
    from ebplus.simulator.workloads import ArrivalPhase, Requests

    if "output_lens" not in meta or "input_lens" not in meta:
        raise ValueError("the engine benchmark JSON has no request lengths: rerun it with this version")
    inp = np.asarray(meta["input_lens"], np.int64)
    out = np.asarray(meta["output_lens"], np.int64)
    cap = int(meta["max_tokens"])
    c = int(meta["concurrency"])
    return Requests(
        input_len=inp,
        output_len=out,
        capped=out >= cap,
        phases=(ArrivalPhase(0, inp.size, c, None, f"1: engine request set c={c}"),),
        drain=False,
        name="engine",
        max_tokens=np.full(inp.size, cap, np.int64),
    )


def compare(engine: dict, profile_spec: str) -> list[Cell]:
    """Every policy of an engine benchmark run, simulated with ``profile_spec`` on its request set."""
    from benchmarks.pinned import sim_profile
    from ebplus.controller.config import ControllerConfig
    from ebplus.simulator.sim import SimConfig, simulate

    meta = engine["meta"]
    profile = sim_profile(profile_spec)
    reqs = requests_of(meta)
    controller = ControllerConfig().model_copy(update={"update_every": int(meta.get("update_every", 100))})
    cells = []
    for row in engine["summary"]:
        policy, k = sim_policy(row["policy"])
        config = SimConfig(policy=policy, k=k, n=int(meta["n"]), budget=int(meta["budget"]), controller=controller)
        sim = simulate(profile, reqs, config).as_json()
        predicted = {"total_tps": sim["tok_per_s"], "ttft_p50_s": sim["ttft_p50_s"], "tpot_p50_ms": 1e3 * sim["tpot_p50_s"]}
        measured = {key: float(row[key]) for key, _ in KEYS}
        cells.append(Cell(row["policy"], measured, predicted))
    return cells


def table(cells: list[Cell]) -> str:
    lines = [
        "| policy | measured tok/s | predicted | error | measured TTFT p50 (s) | predicted | error "
        "| measured TPOT p50 (ms) | predicted | error |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        parts = [c.policy]
        for key, tol in KEYS:
            err = c.error(key)
            mark = " ⚠" if abs(err) > tol else ""
            digits = 1 if key == "total_tps" else (3 if key == "ttft_p50_s" else 1)
            parts += [f"{c.measured[key]:.{digits}f}", f"{c.predicted[key]:.{digits}f}", f"{100 * err:+.1f}%{mark}"]
        lines.append("| " + " | ".join(parts) + " |")
    lines += [
        "",
        f"⚠: off by more than {100 * THROUGHPUT_TOLERANCE:.0f}% (throughput) or {100 * LATENCY_TOLERANCE:.0f}% "
        "(latency). Measured: the engine benchmark's figures (per-step minimum over repeats where they align).",
    ]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sim_vs_engine", description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", type=Path, required=True, help="the engine benchmark's raw JSON")
    parser.add_argument("--profile", required=True, help="profile the simulator runs (name or YAML file)")
    parser.add_argument("--out", type=Path, default=None, help="also write the table (Markdown) here")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        engine = json.loads(args.engine.read_text())
        cells = compare(engine, args.profile)
    except (OSError, ValueError, KeyError) as exc:
        parser.error(f"{args.engine}: {exc}")
    command = "python -m benchmarks.sim_vs_engine " + " ".join(sys.argv[1:] if argv is None else argv)
    text = f"Command: `{command.strip()}`\n\n{table(cells)}\n"
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
