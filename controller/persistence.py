"""The controller's persisted state, with an explicit schema version.

A restarted controller (Ray restarts the actor; an upgrade replaces its code)
resumes from the last :class:`ControllerState` without a cold start: its
windows, every replica's planner state and fitted costs, overrides and history.

Schema versions. :data:`SCHEMA_VERSION` is written into every state. A state
without one is version 0 (what controllers wrote before versions existed); its
layout is version 1's. Version 2 replaced the workload's window of recent
completions (output lengths, censored flags, prompt lengths) with per-replica
admission windows: a version 0 or 1 state is migrated, its window becoming one
replica's admission window (a capped request ended at its cap) and its estimate
losing the fields the estimator no longer has. (Controllers of the code between
that change and the version bump wrote the new layout under version 1: the
migration recognises the layout, not only the number.) A state from a *newer*
schema is refused with :class:`StateError` naming both versions (the caller logs
it and starts cold) rather than half-read - a rollback after an upgrade must never
crash-loop the controller. Bump the version when a field changes meaning or
shape, and add the step that migrates the old layout in :func:`_migrate`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, ValidationError

from ebplus.controller.cost_model import CostModel
from ebplus.controller.estimator import EstimatorState
from ebplus.controller.overrides import Override
from ebplus.controller.planner import Plan, PlannerState
from ebplus.controller.stats import UPDATE_SECONDS_BUCKETS, Histogram
from ebplus.controller.views import Decision, DecisionRecord, Dropped, StaggerView

if TYPE_CHECKING:
    from ebplus.controller.fleet import FleetController, ReplicaState

#: Version of :class:`ControllerState` this code writes (and the newest it reads).
SCHEMA_VERSION = 2


class StateError(ValueError):
    """A persisted state this controller cannot resume from (the message says why)."""


class _State(BaseModel):
    model_config = ConfigDict(extra="ignore")


class SavedReplica(_State):
    """A replica's decisions and fitted costs, kept until it registers again."""

    planner: PlannerState
    last_plan: Plan | None = None
    cost_model: CostModel
    concurrency: float | None = None
    mode_switches: int = 0
    next_completion: int = -1  # where the persisted windows end in this replica's record stream
    next_step: int = -1
    dropped: Dropped = Dropped()


class ControllerState(_State):
    """Everything a controller persists."""

    schema_version: int = SCHEMA_VERSION
    version: int
    updates: int
    workload: EstimatorState
    replicas: dict[str, SavedReplica] = {}
    overrides: dict[str, Override] = {}
    history: list[Decision] = []
    received: dict[str, int] = {}
    rejected: dict[str, int] = {}
    plan_errors: int = 0
    update_seconds: Histogram = Histogram(UPDATE_SECONDS_BUCKETS)
    stagger: StaggerView | None = None  # the last staggered-windows decision (none: a state from before it)


def saved_replica(r: ReplicaState) -> SavedReplica:
    return SavedReplica(
        planner=r.planner.state,
        last_plan=r.planner.last,
        cost_model=r.cost_model,
        concurrency=r.concurrency,
        mode_switches=r.mode_switches,
        next_completion=r.next_completion,
        next_step=r.next_step,
        dropped=Dropped(completions=r.dropped_completions, steps=r.dropped_steps),
    )


def dump(fleet: FleetController) -> ControllerState:
    """The controller's state. Replicas set aside (not registered since a restart, or forgotten)
    are kept too: a second restart before they register must not lose them."""
    return ControllerState(
        version=fleet.version,
        updates=fleet.updates,
        workload=fleet.workload.state(),
        replicas={**fleet.saved, **{rid: saved_replica(r) for rid, r in fleet.replicas.items()}},
        overrides=dict(fleet.overrides.items),
        history=[record.decision() for record in fleet.history],
        received=dict(fleet.received),
        rejected=dict(fleet.rejected),
        plan_errors=fleet.plan_errors,
        update_seconds=fleet.update_seconds,
        stagger=StaggerView.of(fleet.stagger),
    )


def _migrate(raw: dict[str, Any]) -> dict[str, Any]:
    """Bring an older layout up to :data:`SCHEMA_VERSION` (version 0 is version 1 without the number)."""
    found = raw.get("schema_version", 0)
    if not isinstance(found, int) or isinstance(found, bool) or found < 0:
        raise StateError(f"schema_version {found!r} is not a version number")
    if found > SCHEMA_VERSION:
        raise StateError(f"state has schema version {found}, newer than this controller's {SCHEMA_VERSION}")
    steps: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {0: lambda old: old, 1: _from_v1}
    while found < SCHEMA_VERSION:
        raw = steps[found](raw)
        found += 1
    return {**raw, "schema_version": SCHEMA_VERSION}


_V1_ESTIMATE_DROPPED = ("t_lo", "t_hi")


def _v1_estimate(est: Any) -> Any:
    if not isinstance(est, dict):
        return est
    return {k: v for k, v in est.items() if k not in _V1_ESTIMATE_DROPPED}


def _v1_plan(plan: Any) -> Any:
    """A plan's EB/MB crossover in version 1's terms (``lhs``/``rhs``) cannot be restated in version 2's
    (each mode's per-token time): the explanation is dropped, the decision (k, N, mode) is kept."""
    if isinstance(plan, dict) and isinstance(plan.get("crossover"), dict) and "lhs" in plan["crossover"]:
        return {**plan, "crossover": None}
    return plan


def _from_v1(raw: dict[str, Any]) -> dict[str, Any]:
    """Version 1 -> 2: the completion-ordered window becomes an admission window; estimates drop two
    fields; plans drop an old-style crossover."""
    workload = dict(raw.get("workload") or {})
    if "outputs" in workload:
        outputs, censored = workload.pop("outputs"), workload.pop("censored", [])
        inputs = workload.get("inputs", [])
        done = {
            i: [inputs[i] if i < len(inputs) else 1, out, "length" if cens else "stop", i, out if cens else 0, 0]
            for i, (out, cens) in enumerate(zip(outputs, censored, strict=False))
        }
        workload["replicas"] = {"restored": {"done": done, "running": [], "running_total": 0, "next_seq": len(done)}}
        workload["cached"] = [0] * len(inputs)
    workload["estimate"] = _v1_estimate(workload.get("estimate"))
    history = [{**d, "estimate": _v1_estimate(d.get("estimate")), "plan": _v1_plan(d.get("plan"))}
               if isinstance(d, dict) else d for d in raw.get("history", [])]  # fmt: skip
    replicas = {rid: {**r, "last_plan": _v1_plan(r.get("last_plan"))} if isinstance(r, dict) else r
                for rid, r in (raw.get("replicas") or {}).items()}  # fmt: skip
    return {**raw, "workload": workload, "history": history, "replicas": replicas}


def parse(raw: Any) -> ControllerState:
    """A persisted state (the JSON-decoded mapping), migrated; :class:`StateError` if unusable."""
    if not isinstance(raw, dict):
        raise StateError(f"a controller state must be a mapping, got {type(raw).__name__}")
    migrated = _migrate(raw)
    try:
        return ControllerState.model_validate(migrated)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "<root>"
        raise StateError(f"field {where}: {first['msg']}") from None


def load(fleet: FleetController, state: ControllerState) -> None:
    """Resume ``fleet`` from ``state``. Replicas re-register with their current facts
    (mode, KV capacity); until then their saved state waits in ``fleet.saved``."""
    fleet.version = state.version
    fleet.updates = state.updates
    fleet.workload.restore(state.workload)
    fleet.saved = dict(state.replicas)
    fleet.overrides.items.update(state.overrides)
    fleet.history.extend(DecisionRecord.of(decision) for decision in state.history)
    fleet.received.update(state.received)
    fleet.rejected.update(state.rejected)
    fleet.plan_errors = state.plan_errors
    fleet.update_seconds = state.update_seconds
    if state.stagger is not None:  # a resumed replica is sent its stagger with its plan
        fleet.stagger = state.stagger.decision()
