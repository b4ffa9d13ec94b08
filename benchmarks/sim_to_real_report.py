"""The sim-to-real benchmark's figures, per-run diagnosis and tables (no engine import).

Kept apart from the runner (:mod:`benchmarks.sim_to_real`) so the tables can be
rebuilt and unit-tested from figures alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from ebplus.controller.cost_model import CostModel
from ebplus.controller.messages import StepRecord

#: Errors beyond these are flagged (the issue's bar): throughput, latency.
TOLERANCE = {"total_tps": 0.05, "ttft_p50_s": 0.10, "tpot_p50_s": 0.10}
KINDS = ("prefill", "decode", "mixed")


@dataclass
class Figures:
    """What one run served, measured on the engine or predicted by the simulator."""

    tokens: int  # prompt + output tokens served
    total_tps: float  # tokens per second over the run
    ttft_p50_s: float
    tpot_p50_s: float
    steps: int
    steps_by_kind: dict[str, int]
    prefill_tokens: int  # prompt tokens computed (recompute after preemption included)
    preemptions: int
    extra: dict[str, float] = field(default_factory=dict)  # eb_step_share (auto)


@dataclass(frozen=True)
class Diagnosis:
    """One engine run's steps priced by the profile, against their measured times.

    ``forward_s``: the recorded step times (end of ``schedule()`` to the start of
    ``update_from_output()``: the model forward and sampling, what the profile was
    fitted to); ``model_s``: the profile's price of the very same steps (their
    prefill and decode tokens and KV read); ``wall_s``: the run's wall time, whose
    remainder over ``forward_s`` is host time per step no profile term covers.
    """

    forward_s: float
    model_s: float
    wall_s: float
    steps: int  # engine steps (the empty ones included)
    by_kind: dict[str, tuple[float, float]]  # kind -> (measured forward s, model s)

    @property
    def model_error(self) -> float:
        return self.model_s / self.forward_s - 1.0

    @property
    def host_ms_per_step(self) -> float:
        return 1e3 * (self.wall_s - self.forward_s) / max(self.steps, 1)

    def kind_error(self, kind: str) -> float:
        measured, model = self.by_kind.get(kind, (0.0, 0.0))
        return model / measured - 1.0 if measured > 0 else float("nan")


def diagnose(cost: CostModel, steps: Sequence[StepRecord], durations: Sequence[float]) -> Diagnosis:
    """Price the recorded steps of a run with ``cost`` and compare with their measured time."""
    by_kind: dict[str, list[float]] = {}
    forward = model = 0.0
    for s in steps:
        price = cost.step_seconds(s.prefill_tokens, s.decode_tokens, s.kv_tokens)
        forward += s.seconds
        model += price
        acc = by_kind.setdefault(s.kind, [0.0, 0.0])
        acc[0] += s.seconds
        acc[1] += price
    kinds = {k: (v[0], v[1]) for k, v in by_kind.items()}
    return Diagnosis(forward, model, float(sum(durations)), len(durations), kinds)


def spread(values: Sequence[float]) -> tuple[float, float, float]:
    """(median, min, max)."""
    arr = np.asarray(values, dtype=float)
    return float(np.median(arr)), float(arr.min()), float(arr.max())


@dataclass
class CellResult:
    """One cell and policy: every repeat's measured and predicted figures, the floor, the diagnosis."""

    cell: str
    description: str
    policy: str
    real: list[Figures]
    sim: list[Figures]
    floor: Figures | None  # per-step minimum over aligned repeats (None: repeats did not align)
    diagnosis: list[Diagnosis]
    loads: list[float]
    thresholds: list[dict | None]  # auto: the last thresholds each engine run applied
    sim_final: list[dict]  # the simulator's last thresholds per run

    def measured(self, key: str) -> tuple[float, float, float]:
        return spread([getattr(f, key) for f in self.real])

    def predicted(self, key: str) -> float:
        return spread([getattr(f, key) for f in self.sim])[0]

    def error(self, key: str) -> float:
        """Predicted over the median measured, minus 1."""
        return self.predicted(key) / self.measured(key)[0] - 1.0

    def schedule_error(self) -> float:
        """The simulator's throughput against the profile's price of the engine's own steps (median).

        Both sides use the same cost model, so this is the scheduling model's error alone
        (which steps, how many tokens each, preemptions), free of the machine's load and of
        the profile's fit: the simulated time against the summed profile price of the steps
        the engine ran. The measured error factors into this, the profile's error on the
        real steps (:attr:`Diagnosis.model_error`, inverted) and the host time per step.
        """
        errors = [d.model_s / (s.tokens / s.total_tps) - 1.0 for d, s in zip(self.diagnosis, self.sim, strict=True)]
        return spread(errors)[0]

    def floor_error(self) -> float | None:
        return None if self.floor is None else self.predicted("total_tps") / self.floor.total_tps - 1.0

    def extra(self, key: str, sim: bool) -> float | None:
        values = [f.extra[key] for f in (self.sim if sim else self.real) if key in f.extra]
        return spread(values)[0] if values else None

    def as_json(self) -> dict:
        out = asdict(self)
        out["diagnosis"] = [
            {**asdict(d), "model_error": d.model_error, "host_ms_per_step": d.host_ms_per_step} for d in self.diagnosis
        ]
        out["errors"] = {key: self.error(key) for key in TOLERANCE}
        out["floor_error"] = self.floor_error()
        out["schedule_error"] = self.schedule_error()
        return out


def _err(value: float | None, key: str = "total_tps") -> str:
    if value is None or not np.isfinite(value):
        return "-"
    text = f"{value:+.1%}"
    return f"**{text}**" if abs(value) > TOLERANCE[key] else text


def _lat(r: CellResult, key: str, scale: float, fmt: str) -> str:
    med, lo, hi = r.measured(key)
    pred = r.predicted(key)
    return f"{pred * scale:{fmt}} | {med * scale:{fmt}} ({lo * scale:{fmt}}–{hi * scale:{fmt}}) | {_err(r.error(key), key)}"


def main_table(results: Sequence[CellResult]) -> list[str]:
    lines = [
        "| cell | policy | tok/s sim | tok/s real: median (min–max) | error | TTFT p50 s: sim | real | error "
        "| TPOT p50 ms: sim | real | error |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        med, lo, hi = r.measured("total_tps")
        lines.append(
            f"| {r.cell} | {r.policy} | {r.predicted('total_tps'):.1f} | {med:.1f} ({lo:.1f}–{hi:.1f}) "
            f"| {_err(r.error('total_tps'))} | {_lat(r, 'ttft_p50_s', 1.0, '.2f')} | {_lat(r, 'tpot_p50_s', 1e3, '.0f')} |"
        )
    return lines


def _kinds(f: Figures) -> str:
    return "/".join(str(f.steps_by_kind.get(k, 0)) for k in KINDS)


def why_table(results: Sequence[CellResult]) -> list[str]:
    lines = [
        "| cell | policy | steps sim / real | prefill/decode/mixed sim; real | preemptions sim / real "
        "| prompt tokens computed sim / real | profile on the real steps: all (prefill, decode, mixed) "
        "| host ms/step | sim vs profile on the real steps | sim vs real floor |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        sim, real = r.sim[0], r.real[0]
        d = min(r.diagnosis, key=lambda x: x.forward_s)  # the quietest run
        kinds = ", ".join(_err(d.kind_error(k)) for k in KINDS)
        lines.append(
            f"| {r.cell} | {r.policy} | {sim.steps} / {real.steps} | {_kinds(sim)}; {_kinds(real)} "
            f"| {sim.preemptions} / {real.preemptions} | {sim.prefill_tokens} / {real.prefill_tokens} "
            f"| {_err(d.model_error)} ({kinds}) | {d.host_ms_per_step:.1f} | {_err(r.schedule_error())} "
            f"| {_err(r.floor_error())} |"
        )
    return lines


def versus_table(results: Sequence[CellResult]) -> list[str]:
    """Each policy's throughput relative to MB in the same cell, predicted and measured (medians)."""
    by_cell: dict[str, dict[str, CellResult]] = {}
    for r in results:
        by_cell.setdefault(r.cell, {})[r.policy] = r
    policies = [p for p in dict.fromkeys(r.policy for r in results) if p != "mb"]
    head = " | ".join(f"{p} / mb: sim | real" for p in policies)
    lines = [f"| cell | {head} | auto's EB share of steps: sim / real |", "|---|" + "---|---|" * len(policies) + "---|"]
    for cell, rows in by_cell.items():
        mb = rows.get("mb")
        if mb is None:
            continue
        cols = []
        for p in policies:
            r = rows.get(p)
            if r is None:
                cols.append("- | -")
                continue
            sim = r.predicted("total_tps") / mb.predicted("total_tps")
            real = r.measured("total_tps")[0] / mb.measured("total_tps")[0]
            cols.append(f"{sim:.3f} | {real:.3f}")
        auto = rows.get("auto")
        share = "-"
        if auto is not None:
            s, m = auto.extra("eb_step_share", sim=True), auto.extra("eb_step_share", sim=False)
            share = f"{s:.0%} / {m:.0%}" if s is not None and m is not None else "-"
        lines.append(f"| {cell} | {' | '.join(cols)} | {share} |")
    return lines


def markdown(results: Sequence[CellResult], meta: dict) -> str:
    cells = {r.cell: r.description for r in results}
    out = [
        "# Sim-to-real on the CPU engine",
        "",
        f"Command: `{meta['command']}` ({meta['minutes']:.0f} min). Profile `{meta['profile']}`; engine "
        f"{meta['engine']}; auto: controller {meta['controller']}, a control cycle every "
        f"{meta['telemetry_steps']} steps; {meta['repeats']} rounds, policies in rotated order.",
        "",
        "Cells:",
        "",
        *[f"- **{name}**: {text}" for name, text in cells.items()],
        "",
        "Predicted (the simulator on each run's own requests) against measured (median over the rounds, "
        "min–max); error = predicted / median − 1, in bold beyond 5% (throughput) or 10% (latency).",
        "",
        *main_table(results),
        "",
        "Why: the first round's step counts (sim / real) and KV figures; the fitted profile priced on the "
        "engine's own recorded steps against their measured forward time (the quietest round); host time per "
        "step outside the timed forward; the prediction against the same profile's price of the engine's own "
        "steps (the scheduling model's error alone, median over the rounds: independent of the machine's load); "
        "the prediction against the per-step minimum over aligned rounds (the engine on a quiet machine; - where "
        "rounds did not align).",
        "",
        *why_table(results),
        "",
        "Each policy against MB in the same cell (total tok/s, medians):",
        "",
        *versus_table(results),
        "",
    ]
    return "\n".join(out)
