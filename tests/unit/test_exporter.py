"""controller/exporter.py: every declared metric is rendered, values match the snapshot, renames keep working."""

from __future__ import annotations

import numpy as np
import pytest
from factories import batch, registration
from prometheus_client.parser import text_string_to_metric_families

from ebplus.controller.cost_model import CostModel
from ebplus.controller.exporter import LEGACY_LABELS, METRICS, RENAMED, SPECS, render
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

    assert value("ebplus_threshold_k", ReplicaId="r0", model_name="m") == r.k == 9
    assert value("ebplus_threshold_version", ReplicaId="r0") == snap.version
    assert value("ebplus_workload_p0") == snap.estimate.p0
    assert value("ebplus_telemetry_rejected_total", reason="negative") == 1
    assert value("ebplus_telemetry_rejected_total", reason="not_finite") == 0
    assert value("ebplus_steps_total", ReplicaId="r0", phase="decode") == 90
    assert value("ebplus_phase_switches_total", ReplicaId="r0") == 7
    assert value("ebplus_step_seconds_count", ReplicaId="r0", kind="mixed") == 6  # one a batch
    # the batches pushed once the replica ran EB, every step of them (not only the evidence window's)
    work, tokens, seconds = r.mode_work[Mode.EB], 4 * (4096 + 5 * 900) + 20, 4 * (0.1 + 5 * 0.05) + 0.01
    batches = work.tokens // tokens
    assert batches >= 3 and work.tokens == batches * tokens and work.seconds == pytest.approx(batches * seconds)
    assert value("ebplus_mode_tokens_total", ReplicaId="r0", mode="eb") == work.tokens
    assert value("ebplus_mode_step_seconds_total", ReplicaId="r0", mode="eb") == pytest.approx(work.seconds)
    assert value("ebplus_cost_beta_mb_seconds_per_token", ReplicaId="r0", coef="b") == r.cost_model.beta_mb[1]
    assert value("ebplus_overrides_active") == 1
    assert value("ebplus_controller_plan_errors_total") == snap.plan_errors == 0
    assert value("ebplus_controller_up") == 1


def test_unreachable_controller_exports_only_up_zero() -> None:
    samples = parse(render(None, "m"))
    assert list(samples) == ["ebplus_controller_up"] and samples["ebplus_controller_up"][0].value == 0


def test_per_replica_labels_are_vllms_and_rays_with_the_old_ones_beside() -> None:
    """model_name and ReplicaId (what vLLM and its Ray stat logger put on engine metrics) on every
    per-replica series, and for one release the old model/replica with the same values on the same series."""
    samples = parse(render(busy_fleet().snapshot(), "m"))
    per_replica = [spec for spec in METRICS if "ReplicaId" in spec.labels]
    assert len(per_replica) > 25 and all("model_name" in spec.labels for spec in per_replica)
    assert all("replica" not in spec.labels and "model" not in spec.labels for spec in METRICS)
    for spec in per_replica:
        for sample in samples[spec.name + ("_count" if spec.kind == "histogram" else "")]:
            assert sample.labels["ReplicaId"] == sample.labels["replica"] == "r0", spec.name
            assert sample.labels["model_name"] == sample.labels["model"] == "m", spec.name
    assert dict(LEGACY_LABELS) == {"replica": "ReplicaId", "model": "model_name"}
    # fleet-wide metrics gain no label
    assert all(set(s.labels) <= {"kind", "reason", "le"} for s in samples["ebplus_telemetry_received_total"])


def test_each_replica_is_labelled_with_the_model_it_serves() -> None:
    """One controller, several models: ``model_name`` is the replica's own model, the deployment's
    model only for a replica that did not say (an earlier release)."""
    fc = busy_fleet()
    fc.register(registration("r1", Mode.AUTO, 600_000, 64, H200, model="small"))
    samples = parse(render(fc.snapshot(), "m"))
    names = {s.labels["ReplicaId"]: s.labels["model_name"] for s in samples["ebplus_threshold_k"]}
    assert names == {"r0": "m", "r1": "small"}


@pytest.mark.parametrize(("old", "new"), sorted(RENAMED.items()))
def test_a_renamed_metric_is_exported_under_both_names(old: str, new: str) -> None:
    samples = parse(render(busy_fleet().snapshot(), "m"))
    assert [(s.labels, s.value) for s in samples[old]] == [(s.labels, s.value) for s in samples[new]]
    assert samples[new] and SPECS[old].deprecated and not SPECS[new].deprecated
    assert SPECS[old].help.startswith("Deprecated") and new in SPECS[old].help
    assert (SPECS[old].kind, SPECS[old].labels) == (SPECS[new].kind, SPECS[new].labels)


def test_units_and_counter_suffixes() -> None:
    """Prometheus conventions: counters end in _total and nothing else does; a name with a unit has one."""
    for spec in METRICS:
        assert spec.name.endswith("_total") == (spec.kind == "counter"), spec.name
        if spec.deprecated:
            continue
        assert "per_second" not in spec.name, f"{spec.name}: export a counter, rate() gives the per-second"
        if "s/token" in spec.help:
            assert spec.name.endswith("_seconds_per_token"), spec.name
    gauge = SPECS["ebplus_mode_measured_tokens_per_second"]
    assert gauge.deprecated and "ebplus_mode_tokens_total" in gauge.help
