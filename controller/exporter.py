"""Prometheus exposition of the controller's snapshot (``/metrics``).

The controller keeps plain counters and histograms (``FleetController.snapshot``);
this module maps one snapshot to metric families. The ingress renders it on each
scrape, so ``/metrics`` and ``/admin/*`` show the same values by construction.

:data:`METRICS` is the single list of names, types, labels and help texts: the
README's metrics table and the Grafana dashboards are checked against it, so a
renamed metric cannot leave a panel showing "No data".

Per-replica metrics carry vLLM's ``model_name`` and the ``ReplicaId`` that vLLM's Ray
stat logger puts on every engine metric (the Serve replica's unique id, which is also
EB+'s replica id), so an EB+ decision joins ``ray_vllm_*`` series on plain label
matching. A renamed metric or label keeps working for one release: the old label is a
second label with the same value on the same series (:data:`LEGACY_LABELS`: no new
series, and sums over either label set count each replica once), and an old metric name
is a copy of the new family (:data:`RENAMED`) whose help text says it is deprecated.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from ebplus.controller.messages import Mode, StepKind
from ebplus.controller.stats import Histogram
from ebplus.controller.telemetry import REJECT_REASONS
from ebplus.controller.views import FleetSnapshot

R = ("ReplicaId", "model_name")  # per-replica labels, named as on vLLM's and Ray Serve LLM's engine metrics

#: (deprecated label, the label it duplicates): exported beside the new one until the next release.
LEGACY_LABELS: tuple[tuple[str, str], ...] = (("replica", "ReplicaId"), ("model", "model_name"))

#: Deprecated metric name -> its new name; the old one is exported as a copy until the next release.
RENAMED: dict[str, str] = {
    "ebplus_crossover_margin": "ebplus_crossover_margin_seconds_per_token",
    "ebplus_cost_beta_seconds": "ebplus_cost_beta_seconds_per_token",
    "ebplus_cost_beta_mb": "ebplus_cost_beta_mb_seconds_per_token",
}
DEPRECATED = "Deprecated, removed in the next release"


@dataclass(frozen=True)
class MetricSpec:
    name: str
    kind: str  # gauge | counter | histogram
    labels: tuple[str, ...]  # without the LEGACY_LABELS copies
    help: str
    deprecated: bool = False  # dashboards and alerts may not read it

    @property
    def exported_labels(self) -> tuple[str, ...]:
        """The label names on the wire: :attr:`labels`, then the deprecated copies of the renamed ones."""
        return (*self.labels, *(old for old, new in LEGACY_LABELS if new in self.labels))

    def label_values(self, values: list[str]) -> list[str]:
        """``values`` (in :attr:`labels` order) extended by the values of the deprecated copies."""
        return [*values, *(values[self.labels.index(new)] for old, new in LEGACY_LABELS if new in self.labels)]


METRICS: tuple[MetricSpec, ...] = (
    # per replica: the decision
    MetricSpec("ebplus_threshold_k", "gauge", R, "EB threshold k applied by the controller (requests)."),
    MetricSpec("ebplus_batch_cap_n", "gauge", R, "Cap N on concurrently running requests."),
    MetricSpec("ebplus_n_star", "gauge", R, "Memory-safe batch size N* from the latest plan."),
    MetricSpec("ebplus_theta0", "gauge", R, "CFR threshold fraction theta0 (eq. 3)."),
    MetricSpec("ebplus_delta_theta", "gauge", R, "IFR correction Delta theta (eq. 5), clamped."),
    MetricSpec("ebplus_theta_star", "gauge", R, "theta* = theta0 + Delta theta, clamped."),
    MetricSpec("ebplus_theta", "gauge", R, "Smoothed theta the threshold is computed from."),
    MetricSpec("ebplus_mode_info", "gauge", (*R, "mode"), "1 for the replica's configured mode (mb|eb|v0|auto)."),
    MetricSpec("ebplus_policy_eb", "gauge", R, "1 while the replica runs exclusive batching, 0 for mixed."),
    MetricSpec("ebplus_policy_planned_eb", "gauge", R, "1 while EB+ chooses EB (auto, shadow: what it would run)."),
    MetricSpec("ebplus_crossover_margin_seconds_per_token", "gauge", R, "EB/MB margin (s/token) after measured biases; > 0 favours MB."),
    MetricSpec("ebplus_mode_predicted_seconds_per_token", "gauge", (*R, "mode"), "The model's s/token for a mode at the last plan."),
    MetricSpec("ebplus_mode_bias", "gauge", (*R, "mode"), "Measured / model time of a mode's recent steps on the replica (absent: not measured)."),
    MetricSpec("ebplus_mode_tokens_total", "counter", (*R, "mode"), "Tokens (prefill + decode) the replica's engine steps computed while it ran a mode (eb|mb)."),
    MetricSpec("ebplus_mode_step_seconds_total", "counter", (*R, "mode"), "Engine step seconds the replica spent computing tokens while it ran a mode: tokens_total / this is tokens per busy second."),
    MetricSpec("ebplus_mode_measured_tokens_per_second", "gauge", (*R, "mode"), f"{DEPRECATED} (use rate(ebplus_mode_tokens_total) / rate(ebplus_mode_step_seconds_total)): tokens/s over a mode's recent steps on the replica.", deprecated=True),
    MetricSpec("ebplus_explorations_total", "counter", R, "Times EB+ ran the other mode to measure it."),
    MetricSpec("ebplus_threshold_version", "gauge", R, "Version of the thresholds the controller publishes."),
    MetricSpec("ebplus_applied_version", "gauge", R, "Version of the thresholds the replica reports applied."),
    MetricSpec("ebplus_mode_switches_total", "counter", R, "Changes of the active policy (EB<->MB)."),
    MetricSpec("ebplus_concurrency_observed", "gauge", R, "EMA of running + waiting requests."),
    MetricSpec("ebplus_kv_capacity_tokens", "gauge", R, "KV cache capacity reported by the replica (tokens)."),
    MetricSpec("ebplus_stagger_period_seconds", "gauge", R, "Period of the replica's staggered prefill windows (0: not staggered)."),
    MetricSpec("ebplus_stagger_phase", "gauge", R, "Where in that period the replica's staggered windows fall, in [0, 1)."),
    # per replica: the engine
    MetricSpec("ebplus_phase_switches_total", "counter", R, "Switches between prefill and decode phases."),
    MetricSpec("ebplus_steps_total", "counter", (*R, "phase"), "Engine steps by phase (prefill|decode|mixed|idle)."),
    MetricSpec("ebplus_preemptions_total", "counter", R, "Requests preempted for KV space (recomputed)."),
    MetricSpec("ebplus_kv_backoffs_total", "counter", R, "Prefill phases ended early for lack of KV blocks."),
    MetricSpec("ebplus_stagger_windows_total", "counter", R, "EB prefill windows the stagger's timer opened (below k)."),
    MetricSpec("ebplus_step_seconds", "histogram", (*R, "kind"), "Engine step time by kind (prefill|decode|mixed)."),
    MetricSpec("ebplus_cost_alpha_seconds", "gauge", (*R, "kind"), "Fitted fixed step cost alpha by step kind."),
    MetricSpec("ebplus_cost_beta_seconds_per_token", "gauge", (*R, "kind"), "Fitted per-token cost beta (prefill, decode), s/token."),
    MetricSpec("ebplus_cost_beta_mb_seconds_per_token", "gauge", (*R, "coef"), "Mixed-step per-token cost a + b*r + c*r^2 at decode share r: coefficients a, b, c (s/token)."),
    MetricSpec("ebplus_telemetry_dropped_total", "counter", (*R, "kind"), "Telemetry records a replica dropped."),
    # fleet
    MetricSpec("ebplus_workload_p0", "gauge", (), "Estimated hazard at t=0 of output lengths (1/token)."),
    MetricSpec("ebplus_workload_eta", "gauge", (), "Estimated hazard slope of output lengths (1/token^2)."),
    MetricSpec("ebplus_workload_mu_l_tokens", "gauge", (), "Estimated mean input length (tokens)."),
    MetricSpec("ebplus_workload_mu_o_tokens", "gauge", (), "Estimated mean output length (tokens)."),
    MetricSpec("ebplus_workload_samples", "gauge", (), "Output lengths in the estimation window."),
    MetricSpec("ebplus_controller_version", "gauge", (), "Current decision version."),
    MetricSpec("ebplus_controller_updates_total", "counter", (), "Re-estimations performed."),
    MetricSpec("ebplus_controller_update_seconds", "histogram", (), "Time of one re-estimation of the fleet."),
    MetricSpec("ebplus_controller_plan_errors_total", "counter", (), "Replica re-plans that failed (the replica kept its plan; see the controller log)."),
    MetricSpec("ebplus_telemetry_received_total", "counter", ("kind",), "Telemetry accepted (completions|steps|batches|aborted)."),
    MetricSpec("ebplus_telemetry_rejected_total", "counter", ("reason",), "Telemetry records rejected, by reason."),
    MetricSpec("ebplus_overrides_active", "gauge", (), "Operator overrides in force."),
    MetricSpec("ebplus_replicas", "gauge", (), "Replicas known to the controller."),
    MetricSpec("ebplus_stagger_on", "gauge", (), "1 while the controller staggers the EB replicas' prefill windows."),
    MetricSpec("ebplus_controller_up", "gauge", (), "1 if the controller answered this scrape."),
)  # fmt: skip


def _alias(old: str, new: MetricSpec) -> MetricSpec:
    return MetricSpec(old, new.kind, new.labels, f"{DEPRECATED} (renamed {new.name}): {new.help}", deprecated=True)


_CURRENT = {m.name: m for m in METRICS}
METRICS = (*METRICS, *(_alias(old, _CURRENT[new]) for old, new in RENAMED.items()))
SPECS = {m.name: m for m in METRICS}


def _family(name: str) -> Metric:
    spec = SPECS[name]
    base = name.removesuffix("_total") if spec.kind == "counter" else name
    cls = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily, "histogram": HistogramMetricFamily}[spec.kind]
    return cls(base, spec.help, labels=list(spec.exported_labels))


def _copy(family: Metric, spec: MetricSpec) -> Metric:
    """``family``'s samples under ``spec``'s (deprecated) name and help."""
    copy = _family(spec.name)
    copy.samples = [s._replace(name=copy.name + s.name.removeprefix(family.name)) for s in family.samples]
    return copy


def _histogram(family: HistogramMetricFamily, spec: MetricSpec, labels: list[str], h: Histogram) -> None:
    buckets, cumulative = [], 0
    for bound, count in zip([*h.bounds, float("inf")], h.counts, strict=True):
        cumulative += count
        buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), cumulative))
    family.add_metric(spec.label_values(labels), buckets, h.total)


def families(snapshot: FleetSnapshot | None, model: str) -> Iterator[Metric]:
    """Metric families for one controller snapshot (``None``: controller unreachable)."""
    up = _family("ebplus_controller_up")
    up.add_metric([], 0.0 if snapshot is None else 1.0)
    yield up
    if snapshot is None:
        return
    fam = {
        spec.name: _family(spec.name)
        for spec in METRICS
        if spec.name not in RENAMED and spec.name != "ebplus_controller_up"
    }

    def put(name: str, labels: list[str], value: float | None) -> None:
        if value is not None:
            fam[name].add_metric(SPECS[name].label_values(labels), float(value))

    for rid, r in snapshot.replicas.items():
        lab = [rid, r.model or model]  # R's order; ``model``: for a replica that did not say
        put("ebplus_threshold_k", lab, r.k)
        put("ebplus_batch_cap_n", lab, r.n)
        put("ebplus_n_star", lab, r.n_star)
        put("ebplus_theta0", lab, r.theta0)
        put("ebplus_delta_theta", lab, r.delta_theta)
        put("ebplus_theta_star", lab, r.theta_star)
        put("ebplus_theta", lab, r.theta)
        put("ebplus_mode_info", [*lab, r.mode.value], 1)
        put("ebplus_policy_eb", lab, 1 if r.active is Mode.EB else 0)
        put("ebplus_policy_planned_eb", lab, None if r.planned is None else float(r.planned is Mode.EB))
        j = r.judgement
        put("ebplus_crossover_margin_seconds_per_token", lab, None if j is None else j.margin)
        for check in () if j is None else (j.eb, j.mb):
            mode_lab = [*lab, check.mode.value]
            put("ebplus_mode_predicted_seconds_per_token", mode_lab, check.predicted)
            if check.measured is not None:
                put("ebplus_mode_bias", mode_lab, check.bias)
                put("ebplus_mode_measured_tokens_per_second", mode_lab, check.measured.tokens_per_s)
        for mode, work in r.mode_work.items():
            put("ebplus_mode_tokens_total", [*lab, mode.value], work.tokens)
            put("ebplus_mode_step_seconds_total", [*lab, mode.value], work.seconds)
        put("ebplus_explorations_total", lab, r.explorations)
        put("ebplus_threshold_version", lab, r.version)
        put("ebplus_applied_version", lab, r.applied_version)
        put("ebplus_mode_switches_total", lab, r.mode_switches)
        put("ebplus_concurrency_observed", lab, r.concurrency)
        put("ebplus_kv_capacity_tokens", lab, r.kv_capacity_tokens)
        put("ebplus_stagger_period_seconds", lab, r.stagger_period_s)
        put("ebplus_stagger_phase", lab, r.stagger_phase)
        stats = r.engine_stats
        put("ebplus_phase_switches_total", lab, stats.get("phase_switches", 0))
        put("ebplus_preemptions_total", lab, stats.get("preemptions", 0))
        put("ebplus_kv_backoffs_total", lab, stats.get("kv_backoffs", 0))
        put("ebplus_stagger_windows_total", lab, stats.get("stagger_windows", 0))
        for phase in StepKind:
            put("ebplus_steps_total", [*lab, phase.value], stats.get(f"steps_{phase.value}", 0))
        for kind, h in r.step_seconds.items():
            _histogram(fam["ebplus_step_seconds"], SPECS["ebplus_step_seconds"], [*lab, kind.value], h)
        cost = r.cost_model
        for kind, value in (("prefill", cost.alpha_p), ("decode", cost.alpha_d), ("mixed", cost.alpha_mixed)):
            put("ebplus_cost_alpha_seconds", [*lab, kind], value)
        for kind, value in (("prefill", cost.beta_p), ("decode", cost.beta_d)):
            put("ebplus_cost_beta_seconds_per_token", [*lab, kind], value)
        for coef, value in zip("abc", cost.beta_mb, strict=True):
            put("ebplus_cost_beta_mb_seconds_per_token", [*lab, coef], value)
        put("ebplus_telemetry_dropped_total", [*lab, "completions"], r.dropped.completions)
        put("ebplus_telemetry_dropped_total", [*lab, "steps"], r.dropped.steps)

    est = snapshot.estimate
    put("ebplus_workload_p0", [], None if est is None else est.p0)
    put("ebplus_workload_eta", [], None if est is None else est.eta)
    put("ebplus_workload_mu_l_tokens", [], None if est is None else est.mu_l)
    put("ebplus_workload_mu_o_tokens", [], None if est is None else est.mu_o)
    put("ebplus_workload_samples", [], 0 if est is None else est.n_samples)
    put("ebplus_controller_version", [], snapshot.version)
    put("ebplus_controller_updates_total", [], snapshot.updates)
    spec = SPECS["ebplus_controller_update_seconds"]
    _histogram(fam["ebplus_controller_update_seconds"], spec, [], snapshot.update_seconds)
    put("ebplus_controller_plan_errors_total", [], snapshot.plan_errors)
    for kind in ("completions", "steps", "batches", "aborted"):
        put("ebplus_telemetry_received_total", [kind], snapshot.received.get(kind, 0))
    for reason in sorted({*REJECT_REASONS, *snapshot.rejected}):
        put("ebplus_telemetry_rejected_total", [reason], snapshot.rejected.get(reason, 0))
    put("ebplus_overrides_active", [], len(snapshot.overrides))
    put("ebplus_replicas", [], len(snapshot.replicas))
    put("ebplus_stagger_on", [], None if snapshot.stagger is None else float(snapshot.stagger.on))
    yield from fam.values()
    for old, new in RENAMED.items():
        yield _copy(fam[new], SPECS[old])


class SnapshotCollector(Collector):
    """A prometheus-client collector over one snapshot."""

    def __init__(self, snapshot: FleetSnapshot | None, model: str) -> None:
        self.snapshot = snapshot
        self.model = model

    def collect(self) -> Iterator[Metric]:
        yield from families(self.snapshot, self.model)


def render(snapshot: FleetSnapshot | None, model: str) -> bytes:
    """Prometheus text exposition of a snapshot."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(snapshot, model))
    return generate_latest(registry)
