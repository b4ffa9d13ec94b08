"""What sampling telemetry at the replica (``ebplus.replicas.sampling``) costs the controller's estimates.

    python -m benchmarks.telemetry_sampling [--seeds 5] [--out docs/benchmarks/results/telemetry-sampling.md]

A fleet of simulated engines (the request streams of :mod:`benchmarks.controller_fleet`:
each runs 128 requests with geometric outputs of mean 256 tokens, so the true natural
hazard is ``p0 = 1/256`` and ``mu_O = 256``) runs EB cycles - a prefill step, then 24 decode
steps - whose measured time is the H200 model's plus a known stall on the first decode step
after each prefill (a cost the robust cost fit discounts and the closed loop's bias sees).
Every engine pushes through the real :class:`TelemetryPump` with a
given :class:`Sampling` into one :class:`FleetController`. Reported per share: the
estimate's relative error against the truth, the same estimate with every record sent
(same streams), the EB evidence's measured bias (what the closed loop corrects the model
by) and the records the controller absorbed - the load the sampling bounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.controller_fleet import H200, FleetShape, Telemetry
from benchmarks.outputs import raw_path
from ebplus.controller.config import ControllerConfig
from ebplus.controller.fleet import FleetController
from ebplus.controller.messages import DrainReport, EngineFacts, EngineStats, Mode, StepRecord, ThresholdUpdate
from ebplus.replicas.pump import TelemetryPump
from ebplus.replicas.sampling import Sampling
from ebplus.simulator.local import LocalController, run

TRUE_MU_O = 256.0
TRUE_P0 = 1.0 / 256
#: Extra seconds on the first decode step after each prefill phase (what a phase switch costs a real engine).
STALL_S = 0.04
SHARES = (1.0, 0.5, 0.25, 0.1)


class SyntheticEngine:
    """One replica's engine for the pump: its request stream, and EB cycles of 1 prefill + 24 decode steps."""

    def __init__(self, tel: Telemetry, index: int) -> None:
        self.tel, self.index = tel, index
        self.applied = ThresholdUpdate(mode=Mode.EB, k=8, n=256, active=Mode.EB)
        self.facts = EngineFacts(kv_capacity_tokens=2_000_000, max_num_seqs=256, device="H200")
        self.phase = 0

    def drain(self) -> DrainReport:
        completions, running = self.tel.advance(self.index)
        position = (self.phase + np.arange(64)) % 25  # a prefill step every 25: EB's cycle
        self.phase = (self.phase + 64) % 25
        steps = []
        for rec, at in zip(self.tel.steps(np.where(position == 0, 0, 2)), position.tolist(), strict=True):
            # the switch back to decoding stalls: one step in 24, which a robust fit of decode costs discounts
            seconds = H200.step_seconds(rec.prefill_tokens, rec.decode_tokens) + (STALL_S if at == 1 else 0.0)
            steps.append(StepRecord(rec.prefill_tokens, rec.decode_tokens, rec.running, 0, seconds))
        return DrainReport(
            completions=completions,
            steps=steps,
            running=running,
            running_total=self.tel.shape.concurrency,
            stats=EngineStats(),
            facts=self.facts,
            applied=self.applied,
        )

    def apply(self, update: ThresholdUpdate) -> ThresholdUpdate:
        self.applied = update
        return update


@dataclass(frozen=True)
class Outcome:
    mu_o_error: float  # relative, against the truth
    p0_error: float
    eb_bias: float  # measured / modelled time of the EB steps held (the closed loop's correction)
    phases_per_step: float  # prefill phases counted per EB step held
    completions: int  # records the controller absorbed
    steps: int
    updates: int


def outcome(sampling: Sampling, seed: int, replicas: int = 8, pushes: int = 60) -> Outcome:
    """Run the fleet with every replica reporting ``sampling``; the controller's view at the end."""
    tel = Telemetry(FleetShape(replicas=replicas, running=64, concurrency=128), seed)
    fc = FleetController(ControllerConfig())
    local = LocalController(fc)
    engines = [SyntheticEngine(tel, i) for i in range(replicas)]
    pumps = [TelemetryPump(f"r{i}", Mode.EB, prior=lambda _: H200, capacity=1 << 20, sampling=sampling)
             for i in range(replicas)]  # fmt: skip
    for _ in range(pushes):
        for pump, engine in zip(pumps, engines, strict=True):
            run(pump.cycle(), engine, local)
    est = fc.workload.estimate
    assert est is not None
    biases, phases = [], []
    for replica in fc.replicas.values():
        measured = replica.evidence.measure(Mode.EB, replica.cost_model)
        if measured is not None:
            biases.append(measured.bias)
        steps, starts = replica.evidence.mark(Mode.EB)
        phases.append(starts / max(steps, 1))
    return Outcome(
        mu_o_error=est.mu_o / TRUE_MU_O - 1.0,
        p0_error=est.natural_p0 / TRUE_P0 - 1.0 if est.natural_p0 > 0 else est.p0 / TRUE_P0 - 1.0,
        eb_bias=statistics.median(biases) if biases else float("nan"),
        phases_per_step=statistics.median(phases),
        completions=fc.received["completions"],
        steps=fc.received["steps"],
        updates=fc.updates,
    )


def table(seeds: int) -> list[dict]:
    rows = []
    for share in SHARES:
        runs = [outcome(Sampling(requests=share, steps=share), seed) for seed in range(seeds)]
        rows.append(
            {
                "share": share,
                "mu_o_error": [r.mu_o_error for r in runs],
                "p0_error": [r.p0_error for r in runs],
                "eb_bias": [r.eb_bias for r in runs],
                "phases_per_step": [r.phases_per_step for r in runs],
                "completions": statistics.median(r.completions for r in runs),
                "steps": statistics.median(r.steps for r in runs),
                "updates": statistics.median(r.updates for r in runs),
            }
        )
    return rows


def markdown(rows: list[dict], seeds: int) -> str:
    def spread(values: list[float], pct: bool = True) -> str:
        if not pct:
            return f"{statistics.median(values):.3f} ({min(values):.3f} … {max(values):.3f})"
        typical = statistics.median(abs(v) for v in values)
        return f"{100 * typical:.1f}% ({100 * min(values):+.1f}% … {100 * max(values):+.1f}%)"

    lines = [
        "# Telemetry sampling: the controller's estimates with part of the telemetry",
        "",
        f"8 simulated replicas, 60 pushes each, {seeds} seeds. Errors: the median of their size over the seeds "
        "(the smallest … largest, signed); other columns: median (min … max). Written by "
        "`python -m benchmarks.telemetry_sampling`. True values: `mu_O` = 256, natural `p0` = 1/256; the first "
        f"decode step after each prefill carries a {STALL_S * 1e3:g} ms stall.",
        "",
        "| share sent | mu_O error | p0 error | EB bias (measured / model) | phases per EB step | completions "
        "absorbed | steps absorbed | updates |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['share']:g} | {spread(r['mu_o_error'])} | {spread(r['p0_error'])} | "
            f"{spread(r['eb_bias'], pct=False)} | {spread(r['phases_per_step'], pct=False)} | "
            f"{r['completions']:,.0f} | {r['steps']:,.0f} | {r['updates']:,.0f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--out", help="write the table here (e.g. docs/benchmarks/results/telemetry-sampling.md)")
    args = parser.parse_args(argv)
    rows = table(args.seeds)
    text = markdown(rows, args.seeds)
    if args.out:
        out = Path(args.out)
        out.write_text(text)
        raw_path(out).write_text(json.dumps(rows, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
