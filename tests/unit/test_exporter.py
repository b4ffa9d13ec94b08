"""controller/exporter.py: every declared metric is rendered, values match the snapshot."""

from __future__ import annotations

import numpy as np
from factories import batch, registration
from prometheus_client.parser import text_string_to_metric_families

from ebplus.controller.cost_model import CostModel
from ebplus.controller.exporter import METRICS, render
from ebplus.controller.fleet import FleetController
from ebplus.controller.messages import CompletionRecord, EngineStats, FinishReason, Mode, StepRecord

H200 = CostModel(
    alpha_p=1.2786e-3, beta_p=2.4853e-5, alpha_d=8.921e-3, beta_d=4.586e-5, beta_mb=(2.494e-5, 5.193e-5, 1.478e-5)
)


def busy_fleet() -> FleetController:
    fc = FleetController()
    fc.register(registration("r0", Mode.AUTO, 2_000_000, 1024, H200, device="NVIDIA H200"))
    rng = np.random.default_rng(0)
    for _ in range(6):
        comps = tuple(CompletionRecord(512, int(o), FinishReason.STOP) for o in rng.geometric(1 / 256, 100))
        cycle = (StepRecord(4096, 0, 500, 600, 0.1), *[StepRecord(0, 900, 900, 300, 0.05)] * 5)
        steps = (*cycle * 4, StepRecord(10, 10, 20, 0, 0.01))  # enough steps and phases for a mode's bias
        stats = EngineStats(steps_prefill=10, steps_decode=90, phase_switches=7, preemptions=2)
        fc.ingest(batch("r0", comps, steps, applied_version=fc.version, stats=stats))
    fc.ingest(batch("r0", [CompletionRecord(-1, 3, FinishReason.STOP)]))
    fc.set_override("r0", k=9)
    return fc


def parse(text: bytes) -> dict[str, list]:
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(text.decode()):
        for sample in fam.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


def test_every_declared_metric_is_exported() -> None:
    samples = parse(render(busy_fleet().snapshot(), "m"))
    for spec in METRICS:
        name = spec.name + ("_count" if spec.kind == "histogram" else "")
        assert name in samples, spec.name


def test_values_match_snapshot() -> None:
    fc = busy_fleet()
    snap = fc.snapshot()
    samples = parse(render(snap, "m"))
    r = snap.replicas["r0"]

    def value(name: str, **labels: str) -> float:
        matches = [s.value for s in samples[name] if all(s.labels.get(k) == v for k, v in labels.items())]
        assert len(matches) == 1, (name, labels)
        return matches[0]

    assert value("ebplus_threshold_k", replica="r0", model="m") == r.k == 9
    assert value("ebplus_threshold_version", replica="r0") == snap.version
    assert value("ebplus_workload_p0") == snap.estimate.p0
    assert value("ebplus_telemetry_rejected_total", reason="negative") == 1
    assert value("ebplus_telemetry_rejected_total", reason="not_finite") == 0
    assert value("ebplus_steps_total", replica="r0", phase="decode") == 90
    assert value("ebplus_phase_switches_total", replica="r0") == 7
    assert value("ebplus_step_seconds_count", replica="r0", kind="mixed") == 6  # one a batch
    assert value("ebplus_overrides_active") == 1
    assert value("ebplus_controller_plan_errors_total") == snap.plan_errors == 0
    assert value("ebplus_controller_up") == 1


def test_unreachable_controller_exports_only_up_zero() -> None:
    samples = parse(render(None, "m"))
    assert list(samples) == ["ebplus_controller_up"] and samples["ebplus_controller_up"][0].value == 0
