"""Typed views of the controller: what the admin API answers and ``/metrics`` exports.

:func:`snapshot` reads a :class:`~ebplus.controller.fleet.FleetController` into one
:class:`FleetSnapshot`; the admin routes return it (or parts of it) and the
exporter renders the same object, so ``/admin/*`` and ``/metrics`` agree by
construction. The models are pydantic: they cross the Ray boundary as JSON
(:meth:`FleetSnapshot.model_dump_json`), which survives a rolling update where
ingress and controller run different code, and FastAPI documents them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from ebplus.controller.cost_model import CostModel
from ebplus.controller.estimator import Estimate
from ebplus.controller.evidence import Judgement, ModeWork
from ebplus.controller.messages import Mode, RoutingHints, StepKind, ThresholdUpdate
from ebplus.controller.overrides import Override
from ebplus.controller.planner import Plan
from ebplus.controller.stagger import StaggerDecision
from ebplus.controller.stats import Histogram
from ebplus.controller.theory import Crossover

if TYPE_CHECKING:
    from ebplus.controller.fleet import FleetController, ReplicaState


class _View(BaseModel):
    # extra="ignore": a newer controller's additional fields do not break an older reader
    model_config = ConfigDict(extra="ignore", frozen=True)


class ThresholdsView(_View):
    """A :class:`~ebplus.controller.messages.ThresholdUpdate` as JSON."""

    mode: Mode = Field(description="Configured mode: mb | eb | v0 | auto | shadow.")
    active: Mode = Field(description="Policy the replica runs: mb or eb.")
    k: int = Field(description="EB threshold.")
    n: int = Field(description="Cap on running requests.")
    version: int = Field(description="Version the controller publishes.")
    prefill_steps: int = Field(
        0, description="EB: a decode step after this many prefill steps in a row (0: unbounded; see planner.slo)."
    )
    prefill_tokens: int = Field(0, description="EB: prompt tokens a prefill step may carry (0: the engine's budget).")
    stagger_period_s: float = Field(
        0.0, description="EB: seconds between the replica's timed prefill windows (0: not staggered; see stagger)."
    )
    stagger_phase: float = Field(0.0, description="EB: where in that period its windows fall, in [0, 1).")

    @classmethod
    def of(cls, update: ThresholdUpdate) -> ThresholdsView:
        return cls(
            mode=update.mode,
            active=update.active,
            k=update.k,
            n=update.n,
            version=update.version,
            prefill_steps=update.prefill_steps,
            prefill_tokens=update.prefill_tokens,
            stagger_period_s=update.stagger_period_s,
            stagger_phase=update.stagger_phase,
        )

    def message(self) -> ThresholdUpdate:
        """The message this view shows (:meth:`of` read back: a persisted history's thresholds)."""
        return ThresholdUpdate(**self.model_dump(include=set(ThresholdsView.model_fields)))


class RegisteredView(ThresholdsView):
    """What a replica's last registration answered: after a controller restart, whether it resumed."""

    origin: Literal["known", "saved", "fleet", "cold"] = Field(
        description=(
            "known: registered with this controller before; saved: the plan a previous controller persisted; "
            "fleet: another replica's plan (a new replica); cold: no plan yet."
        )
    )


class Dropped(_View):
    completions: int = 0
    steps: int = 0


class ReplicaView(ThresholdsView):
    """Everything the controller shows about one replica."""

    applied_version: int = Field(description="Version the replica reports applied (-1: none yet).")
    updated_at: float = Field(description="Unix time of the last decision for this replica.")
    last_seen: float = Field(description="Unix time of the replica's last push.")
    device: str = Field(description="Accelerator the replica reported.")
    model: str = Field("", description="The model the replica serves (empty: its release did not say).")
    theta0: float | None = Field(description="CFR threshold fraction (eq. 3); null before the first estimate.")
    delta_theta: float | None = Field(description="IFR correction (eq. 5), clamped.")
    theta_star: float | None = Field(description="theta0 + Delta theta, clamped.")
    theta: float = Field(description="The smoothed theta k is computed from (theta_cold before any estimate).")
    n_star: int | None = Field(description="Memory-safe N* of the last plan.")
    concurrency: float | None = Field(description="EMA of running + waiting requests.")
    kv_capacity_tokens: int
    max_num_seqs: int
    planned: Mode | None = Field(
        None,
        description=(
            "The policy EB+ chooses (auto, shadow): in shadow mode the replica keeps running MB and this is "
            "what it would run."
        ),
    )
    crossover: Crossover | None = Field(description="The model's EB and MB predictions at the last plan.")
    judgement: Judgement | None = Field(
        None,
        description=(
            "The last EB/MB decision's evidence: per mode the model's s/token, the bias measured on the "
            "replica's own steps of that mode (measured / model time), and the corrected s/token compared."
        ),
    )
    explorations: int = Field(0, description="Times EB+ ran the other mode to measure it.")
    mode_work: dict[Mode, ModeWork] = Field(
        default_factory=dict, description="Tokens and step seconds the replica computed in each mode it ran, ever."
    )
    reason: str | None = Field(description="Where k and N came from, and why the EB/MB decision came out as it did.")
    cost_model: CostModel = Field(description="The cost model the last plan used.")
    cost_fitted: list[str] = Field(description="Which parts of the cost model came from this replica's steps.")
    mode_switches: int = Field(description="Changes of the active policy published to this replica.")
    registered: RegisteredView | None = Field(None, description="What the replica's last registration answered.")
    dropped: Dropped = Field(description="Telemetry records the replica dropped.")
    engine_stats: dict[str, float] = Field(description="The replica's cumulative engine counters.")
    step_seconds: dict[StepKind, Histogram] = Field(description="Step times by kind.")


class ControllerInfo(_View):
    started_at: float
    restored: bool
    persist_error: str | None = Field(None, description="Why the state could not be persisted, while it cannot.")


class StaggerView(_View):
    """The controller's staggered-windows decision (``controller/stagger.py``)."""

    on: bool = Field(description="Whether the EB replicas' prefill windows are offset against each other.")
    reason: str = Field(description="Why it is on or off.")
    period_s: float = Field(0.0, description="The common period of the timed windows (0: off).")
    phases: dict[str, float] = Field(default_factory=dict, description="Each staggered replica's phase in [0, 1).")

    @classmethod
    def of(cls, decision: StaggerDecision) -> StaggerView:
        phases = dict(decision.phases or {}) if decision.on else {}
        return cls(on=decision.on, reason=decision.reason, period_s=decision.period_s, phases=phases)

    def decision(self) -> StaggerDecision:
        """The decision this view shows (a persisted one read back)."""
        return StaggerDecision(self.on, self.reason, self.period_s, dict(self.phases) if self.on else None)


class FleetSnapshot(_View):
    """One consistent view of the whole controller."""

    version: int
    updates: int
    estimate: Estimate | None
    first_estimate: Estimate | None = Field(None, description="The estimate of the first update (cold start).")
    completions: int
    received: dict[str, int]
    rejected: dict[str, int]
    plan_errors: int
    overrides: dict[str, Override]
    last_update_seconds: float
    update_seconds: Histogram
    replicas: dict[str, ReplicaView]
    controller: ControllerInfo | None = None
    stagger: StaggerView | None = Field(None, description="Staggered prefill windows (null: a controller without).")


class Decision(_View):
    """One entry of the history: the inputs and outputs of a decision for one replica."""

    version: int
    at: float
    replica_id: str
    cause: str
    update: ThresholdsView
    plan: Plan | None
    estimate: Estimate | None
    cost_model: CostModel
    override: Override | None


@dataclass(slots=True, eq=False)  # eq=False: two decisions alike are still two decisions
class DecisionRecord:
    """One entry of the history as the controller keeps it; :meth:`decision` is the :class:`Decision` it shows.

    A re-plan records a decision for every replica, and the history holds the last
    ``history`` of them: at 256 replicas, all of them are the last re-plan's. As a
    :class:`Decision` each is six objects the garbage collector tracks (the model, its
    ``__dict__``, its fields-set, and the same three for its thresholds' view); the young
    collections a re-plan triggers walk every one of them, on the event loop that answers
    telemetry. A record is one object that refers to what the decision is made of (the plan,
    the estimate and the thresholds are the controller's own, kept anyway), and builds the
    view only when it is read: by the admin API's history, and when it is persisted.
    """

    version: int
    at: float
    replica_id: str
    cause: str
    update: ThresholdUpdate
    plan: Plan | None
    estimate: Estimate | None
    cost_model: CostModel
    override: Override | None

    @classmethod
    def of(cls, decision: Decision) -> DecisionRecord:
        """The record of a decision read back (a persisted history)."""
        return cls(decision.version, decision.at, decision.replica_id, decision.cause, decision.update.message(), decision.plan,
                   decision.estimate, decision.cost_model, decision.override)  # fmt: skip

    def decision(self) -> Decision:
        return Decision(
            version=self.version,
            at=self.at,
            replica_id=self.replica_id,
            cause=self.cause,
            update=ThresholdsView.of(self.update),
            plan=self.plan,
            estimate=self.estimate,
            cost_model=self.cost_model,
            override=self.override,
        )


def replica_view(fleet: FleetController, replica: ReplicaState) -> ReplicaView:
    plan = replica.planner.last
    stats = replica.engine_stats
    return ReplicaView(
        **ThresholdsView.of(replica.current).model_dump(),
        applied_version=replica.applied_version,
        updated_at=replica.updated_at,
        last_seen=replica.last_seen,
        device=replica.facts.device,
        model=replica.model,
        theta0=None if plan is None else plan.theta0,
        delta_theta=None if plan is None else plan.delta_theta,
        theta_star=None if plan is None else plan.theta_star,
        theta=replica.planner.state.theta or fleet.config.planner.theta_cold,
        n_star=None if plan is None else plan.n_cap,
        concurrency=replica.concurrency,
        kv_capacity_tokens=replica.facts.kv_capacity_tokens,
        max_num_seqs=replica.facts.max_num_seqs,
        planned=replica.planner.state.active if replica.mode in (Mode.AUTO, Mode.SHADOW) else None,
        crossover=None if plan is None else plan.crossover,
        judgement=None if plan is None else plan.judgement,
        explorations=replica.planner.state.explorations,
        mode_work=replica.evidence.work(),
        reason=None if plan is None else "; ".join(part for part in (plan.sizing, plan.reason) if part),
        cost_model=replica.cost_model,
        cost_fitted=[] if replica.cost is None else list(replica.cost.fitted),
        mode_switches=replica.mode_switches,
        registered=_registered(replica.registered),
        dropped=Dropped(completions=replica.dropped_completions, steps=replica.dropped_steps),
        engine_stats={} if stats is None else {k: float(getattr(stats, k)) for k in stats.__struct_fields__},
        step_seconds=dict(replica.step_seconds),
    )


def _registered(registered: tuple[str, ThresholdUpdate] | None) -> RegisteredView | None:
    if registered is None:
        return None
    origin, update = registered
    return RegisteredView(origin=origin, **ThresholdsView.of(update).model_dump())


def snapshot(fleet: FleetController) -> FleetSnapshot:
    """The controller as one :class:`FleetSnapshot` (expired overrides dropped first)."""
    fleet.expire_overrides()
    return FleetSnapshot(
        version=fleet.version,
        updates=fleet.updates,
        estimate=fleet.workload.estimate,
        first_estimate=fleet.workload.first,
        completions=fleet.workload.completions,
        received=dict(fleet.received),
        rejected=dict(fleet.rejected),
        plan_errors=fleet.plan_errors,
        overrides=dict(fleet.overrides.items),
        last_update_seconds=fleet.last_update_seconds,
        update_seconds=fleet.update_seconds,
        replicas={rid: replica_view(fleet, r) for rid, r in fleet.replicas.items()},
        stagger=StaggerView.of(fleet.stagger),
    )


def routing_hints(fleet: FleetController) -> RoutingHints:
    """What the routers' phase boards take from the controller: the departure chance, the mean prompt, and each
    replica's cost model (its prompt cost alone too, for routers of an earlier release)."""
    estimate = fleet.workload.estimate
    costs = {rid: replica.cost_model for rid, replica in fleet.replicas.items()}
    return RoutingHints(
        p0=None if estimate is None or not 0.0 < estimate.p0 <= 1.0 else estimate.p0,
        mu_l=None if estimate is None else estimate.mu_l,
        beta_p={rid: cost.beta_p for rid, cost in costs.items()},
        cost={rid: cost.cost_model() for rid, cost in costs.items()},
    )


PERSISTED = (
    "Whether the controller's store holds the change. false: it is applied and served, but a restart "
    "would lose it (message says why: a full disk); the controller keeps trying."
)


class OverrideResult(_View):
    """The answer to an override request: the new version, or the field that was wrong."""

    version: int | None = None
    override: Override | None = None
    error: str | None = Field(None, description="The offending field, when the override was refused.")
    message: str | None = None
    persisted: bool = Field(True, description=PERSISTED)


class ClearResult(_View):
    removed: bool
    version: int
    persisted: bool = Field(True, description="See OverrideResult.persisted.")
    message: str | None = None


class RecomputeResult(_View):
    version: int
    estimate: Estimate | None
    persisted: bool = Field(True, description="See OverrideResult.persisted.")
    message: str | None = None


class Ping(_View):
    """Liveness: version, known replicas, whether state was resumed, and the controller's pid
    (fault-injection tests stop and continue that process)."""

    version: int
    replicas: int
    restored: bool
    pid: int
