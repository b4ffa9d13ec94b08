"""The control loop of EB+, without Ray: fleet-wide workload, per-replica decisions.

:class:`FleetController` is what the controller actor (``controller/actor.py``)
wraps and what the simulator runs in-process, so the loop evaluated offline is
the one deployed. It

* validates and ingests telemetry batches (bad records are counted, never raised);
* keeps one fleet-wide :class:`~controller.estimator.WorkloadEstimator` (the
  workload is the same for every replica behind one router) and, per replica, a
  :class:`~controller.estimator.CostModelFitter`, a
  :class:`~controller.planner.ThresholdPlanner` and an EMA of observed concurrency
  (GPU types differ, so ``k*``, ``N*`` and the EB/MB choice are per replica);
* every ``update_every`` completions re-estimates and re-plans every replica,
  bumping a global ``version``;
* applies operator overrides (per replica or ``"*"``, optional TTL);
* records each decision with its inputs in a bounded history;
* exports and restores its state for a restart without a cold start.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ebplus.controller.cost_model import CostModel, step_kind
from ebplus.controller.estimator import CostFit, CostModelFitter, Estimate, WorkloadEstimator
from ebplus.controller.planner import Plan, PlannerConfig, PlannerState, ThresholdPlanner
from ebplus.controller.stats import STEP_SECONDS_BUCKETS, UPDATE_SECONDS_BUCKETS, Histogram
from ebplus.controller.telemetry import (
    MAX_COUNT,
    FinishReason,
    TelemetryBatch,
    check_completion,
    check_int,
    check_step,
)
from ebplus.replicas.phases import Mode, ThresholdUpdate
from pydantic import BaseModel, ConfigDict, Field

logger = logging.getLogger("ebplus.controller")

FLEET = "*"
#: Replicas whose state a controller keeps aside after forgetting them (see ``FleetController.forget``).
MAX_SAVED_REPLICAS = 64


class ControllerConfig(BaseModel):
    """Settings of the control loop (the ``controller:`` section of the deployment config)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    window: int = Field(500, ge=10, description="Recent output lengths kept (W_O).")
    input_window: int = Field(500, ge=10, description="Recent input lengths kept (W_L).")
    update_every: int = Field(100, ge=1, description="Completions (fleet-wide) between re-estimations (M).")
    min_samples: int = Field(30, ge=1, description="No estimate before this many completions are held.")
    first_update: int = Field(
        30,
        ge=1,
        description=(
            "Completions before the first estimate (then every update_every). Until then a cold controller "
            "runs EB+ in MB with a guessed k: deciding after 30 rather than 100 completions saves most of "
            "that cold period (at c=512 on a bandwidth-limited GPU about 3% of a 4000-request run)."
        ),
    )
    step_window: int = Field(2048, ge=16, description="Step timings kept per step kind and replica.")
    min_steps: int = Field(20, ge=3, description="Step samples needed before a cost part is fitted.")
    cost_refit_every: int = Field(
        10,
        ge=1,
        description="Workload updates between cost-model refits of a replica (hardware drifts slowly).",
    )
    concurrency_ema: float = Field(
        0.05, gt=0, le=1, description="Weight of each step's running+waiting in the concurrency EMA."
    )
    history: int = Field(256, ge=1, description="Decisions kept in the history.")
    replan_concurrency: float | None = Field(
        2.0,
        gt=1,
        description=(
            "Re-plan a replica at once when its observed concurrency moves by this factor from the value of "
            "its last plan (None: only every update_every completions)."
        ),
    )
    planner: PlannerConfig = Field(default_factory=PlannerConfig, description="The EB+ decision's tuning.")


class OverrideError(ValueError):
    """An override that cannot be applied; ``field`` names the offending input."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class Override:
    """An operator's pin of mode, k and/or N for one replica or the fleet."""

    mode: Mode | None = None
    k: int | None = None
    n: int | None = None
    expires_at: float | None = None

    def as_dict(self) -> dict:
        return {
            "mode": None if self.mode is None else self.mode.value,
            "k": self.k,
            "n": self.n,
            "expires_at": self.expires_at,
        }


@dataclass(frozen=True)
class Decision:
    """One entry of the history: the inputs and outputs of a decision for one replica."""

    version: int
    at: float
    replica_id: str
    cause: str
    update: dict
    plan: dict | None
    estimate: dict | None
    cost_model: dict
    override: dict | None


@dataclass
class ReplicaState:
    """What the controller knows about one replica."""

    replica_id: str
    mode: Mode
    kv_capacity_tokens: int
    max_num_seqs: int
    fitter: CostModelFitter
    planner: ThresholdPlanner
    current: ThresholdUpdate
    cost: CostFit | None = None
    ordinal: int = 0  # registration order; staggers cost refits across replicas
    concurrency: float | None = None  # EMA of running + waiting
    applied_version: int = -1
    last_seen: float = 0.0
    updated_at: float = 0.0
    dropped_completions: int = 0
    dropped_steps: int = 0
    device: str = ""
    mode_switches: int = 0  # changes of the active policy published to this replica
    engine_stats: dict = field(default_factory=dict)  # cumulative counters reported by the replica
    preemptions_seen: int | None = None  # engine_stats["preemptions"] at the last plan
    completed_since_plan: int = 0  # completions from this replica since its last plan
    next_completion: int = -1  # running index of the next completion record expected (-1: unknown)
    next_step: int = -1  # same for step records
    step_seconds: dict[str, Histogram] = field(default_factory=dict)  # by step phase

    @property
    def cost_model(self) -> CostModel:
        return self.fitter.prior if self.cost is None else self.cost.model


Clock = Callable[[], float]


def _counter_value(v: object) -> bool:
    """A cumulative engine counter: a finite number in ``[0, MAX_COUNT]`` (seconds may be fractional)."""
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and 0 <= v <= MAX_COUNT


class FleetController:
    """Pure control loop; see the module docstring.

    Args:
        config: the loop's settings.
        clock: injected so tests (and the simulator) control time.
    """

    def __init__(self, config: ControllerConfig | None = None, clock: Clock = time.time) -> None:
        self.config = config or ControllerConfig()
        self.clock = clock
        cfg = self.config
        self.workload = WorkloadEstimator(
            window=cfg.window,
            input_window=cfg.input_window,
            update_every=cfg.update_every,
            min_samples=cfg.min_samples,
            first_update=cfg.first_update,
            clock=clock,
        )
        self.replicas: dict[str, ReplicaState] = {}
        self.overrides: dict[str, Override] = {}
        self.history: deque[Decision] = deque(maxlen=cfg.history)
        self.version = 0
        self.updates = 0
        self.received: Counter[str] = Counter()  # completions, steps, batches
        self.rejected: Counter[str] = Counter()  # by reason
        self.last_update_seconds = 0.0
        self.plan_errors = 0  # re-plans of a replica that raised (see recompute)
        self.update_seconds = Histogram(UPDATE_SECONDS_BUCKETS)
        self._saved: dict[str, dict] = {}  # persisted replica state awaiting re-registration
        self._registrations = 0

    # -- replicas ----------------------------------------------------------

    def register(
        self,
        replica_id: str,
        mode: Mode | str,
        kv_capacity_tokens: int,
        max_num_seqs: int,
        prior: CostModel,
        device: str = "",
    ) -> ThresholdUpdate:
        """Add (or re-add) a replica; returns the thresholds it should run now.

        ``device`` (e.g. ``"NVIDIA H200"``) is shown in the admin API; the prior
        cost model is chosen from it by the caller.
        """
        mode = Mode(mode)
        if kv_capacity_tokens < 1 or max_num_seqs < 2:
            raise ValueError("kv_capacity_tokens must be >= 1 and max_num_seqs >= 2")
        old = self.replicas.get(replica_id)
        planner_cfg = self.config.planner.model_copy(update={"max_num_seqs": max_num_seqs})
        planner = ThresholdPlanner(planner_cfg, old.planner.state if old else None)
        saved = self._saved.pop(replica_id, None)
        if old is not None:
            planner.last = old.planner.last
        elif saved is not None:
            # resumed controller: the replica keeps its decisions and fitted costs
            planner.state = PlannerState(**{**saved["planner"], "active": Mode(saved["planner"]["active"])})
            planner.last = None if saved["last_plan"] is None else Plan.from_dict(saved["last_plan"])
            prior = CostModel(**saved["cost_model"])
            mode_switches = int(saved.get("mode_switches", 0))
        else:
            # a new replica inherits the fleet's latest plan state so it does not cold-start
            donor = next(iter(self.replicas.values()), None)
            if donor is not None and donor.planner.last is not None:
                planner.state = dataclasses.replace(donor.planner.state)
                planner.last = donor.planner.last
        if old is not None:
            mode_switches = old.mode_switches
        elif saved is None:
            mode_switches = 0
        fitter = old.fitter if old else CostModelFitter(prior, self.config.step_window, self.config.min_steps)
        state = ReplicaState(
            replica_id=replica_id,
            mode=mode,
            kv_capacity_tokens=int(kv_capacity_tokens),
            max_num_seqs=int(max_num_seqs),
            fitter=fitter,
            planner=planner,
            current=planner.update_for(mode, self.version),
            cost=old.cost if old else None,
            concurrency=old.concurrency if old else (saved or {}).get("concurrency"),
            last_seen=self.clock(),
            ordinal=old.ordinal if old else self._registrations,
            device=device,
            mode_switches=mode_switches,
            engine_stats=old.engine_stats if old else {},
            step_seconds=old.step_seconds if old else {},
        )
        if old is not None:
            state.next_completion, state.next_step = old.next_completion, old.next_step
        elif saved is not None:  # where the persisted windows end in this replica's record stream
            for cursor in ("next_completion", "next_step"):
                value = check_int(saved.get(cursor), 0, MAX_COUNT)
                setattr(state, cursor, value if isinstance(value, int) else -1)
            dropped = saved.get("dropped") or {}
            state.dropped_completions = self._count(dropped.get("completions", 0))
            state.dropped_steps = self._count(dropped.get("steps", 0))
        self._registrations += 1
        self.replicas[replica_id] = state
        state.current = self._effective(state)
        return state.current

    def forget(self, replica_id: str) -> bool:
        """Drop a replica (dead or scaled down); its overrides go with it.

        Its decisions, fitted costs and record cursors are set aside, as a restored
        controller's are: a replica that was only silent (stalled, or the controller
        itself was paused) resumes where it was when it registers again instead of
        starting cold. At most :data:`MAX_SAVED_REPLICAS` are kept (oldest dropped).
        """
        self.overrides.pop(replica_id, None)
        replica = self.replicas.pop(replica_id, None)
        if replica is None:
            return False
        self._saved.pop(replica_id, None)
        self._saved[replica_id] = self._replica_state(replica)
        while len(self._saved) > MAX_SAVED_REPLICAS:
            self._saved.pop(next(iter(self._saved)))
        return True

    def grace(self, seconds: float) -> None:
        """Do not count the last ``seconds`` as silence (see ``forget_stale``): the controller
        itself was not running (paused, starved), so the replicas could not be heard."""
        now = self.clock()
        for replica in self.replicas.values():
            replica.last_seen = min(now, replica.last_seen + seconds)

    def forget_stale(self, max_age_s: float) -> list[str]:
        """Forget replicas silent for longer than ``max_age_s``."""
        now = self.clock()
        stale = [rid for rid, r in self.replicas.items() if now - r.last_seen > max_age_s]
        for rid in stale:
            self.forget(rid)
        return stale

    # -- telemetry ---------------------------------------------------------

    def ingest(self, batch: TelemetryBatch) -> ThresholdUpdate | None:
        """Validate and absorb one batch; re-plan when due.

        Returns the thresholds the sending replica should run, or ``None`` for an
        unknown replica (the batch is rejected and counted; the replica should
        register again). Nothing in a batch can make this raise: a field of the
        wrong shape is counted (``bad_batch``) and ignored, a bad record is counted
        by reason, and a record already ingested (a late duplicate) is skipped.
        """
        self.received["batches"] += 1
        rid = getattr(batch, "replica_id", None)
        replica = self.replicas.get(rid) if isinstance(rid, str) else None
        if replica is None:
            self.rejected["unknown_replica"] += 1
            return None
        replica.last_seen = self.clock()
        applied = check_int(getattr(batch, "applied_version", None), 0, MAX_COUNT)
        if isinstance(applied, int):
            replica.applied_version = applied
        replica.dropped_completions += self._count(getattr(batch, "dropped_completions", 0))
        replica.dropped_steps += self._count(getattr(batch, "dropped_steps", 0))
        self._ingest_engine_stats(replica, getattr(batch, "extra", None))
        completions = self._fresh(replica, "next_completion", batch, "completions", "completions_from")
        steps = self._fresh(replica, "next_step", batch, "steps", "steps_from")
        self._ingest_completions(completions)
        replica.completed_since_plan += len(completions)
        self._ingest_steps(replica, steps)
        if self.workload.update_due():
            self.recompute("periodic")
        elif self._concurrency_moved(replica):
            self.recompute("concurrency")
        elif self._cold_switch(replica):
            self.recompute("cold")
        self._expire_overrides()
        return replica.current

    def _count(self, value: object) -> int:
        """A non-negative counter from a batch (0 and ``bad_batch`` counted when it is not one)."""
        n = check_int(0 if value is None else value, 0, MAX_COUNT)
        if isinstance(n, str):
            self.rejected["bad_batch"] += 1
            return 0
        return n

    def _fresh(self, replica: ReplicaState, cursor: str, batch: object, name: str, index_name: str) -> tuple:
        """The records of one kind the controller does not have yet.

        ``<kind>_from`` is the replica's running index of the batch's first record;
        records below the replica's cursor arrived before (a push that timed out at
        the replica and was delivered late) and are counted as ``duplicate``.
        """
        records = getattr(batch, name, ()) or ()
        if not isinstance(records, list | tuple):
            self.rejected["bad_batch"] += 1
            return ()
        start = check_int(getattr(batch, index_name, -1), 0, MAX_COUNT)
        if isinstance(start, str):  # not tracked by this sender (-1), or garbage
            return tuple(records)
        seen = getattr(replica, cursor)
        skip = min(len(records), max(0, seen - start)) if seen >= 0 else 0
        if skip:
            self.rejected["duplicate"] += skip
        setattr(replica, cursor, max(seen, start + len(records)))
        return tuple(records[skip:])

    def _concurrency_moved(self, replica: ReplicaState) -> bool:
        """The replica's load left the range its last plan was made for (k and the EB/MB choice depend on it).

        Estimates refresh every ``update_every`` completions, but the observed
        concurrency is known every step: when it has moved by ``replan_concurrency``
        x since the last plan (a surge, or a drain), re-plan now rather than run a
        whole update window with thresholds made for another load.
        """
        ratio = self.config.replan_concurrency
        last = replica.planner.last
        if ratio is None or last is None or replica.concurrency is None or self.workload.estimate is None:
            return False
        c = max(replica.concurrency, 1.0)
        return not (last.n_obs / ratio <= c <= last.n_obs * ratio)

    def _cold_switch(self, replica: ReplicaState) -> bool:
        """Before the first estimate, an ``auto`` replica may leave MB for EB on its prior alone
        (:meth:`ThresholdPlanner.cold_choice`); True when it just did."""
        if self.workload.estimate is not None or replica.mode is not Mode.AUTO or replica.concurrency is None:
            return False
        reason = replica.planner.cold_choice(replica.cost_model, replica.kv_capacity_tokens, replica.concurrency)
        if reason is not None:
            logger.info("replica %s: %s", replica.replica_id, reason)
        return reason is not None

    def _ingest_completions(self, records) -> None:
        for raw in records:
            rec = check_completion(raw)
            if isinstance(rec, str):
                self.rejected[rec] += 1
                continue
            self.received["completions"] += 1
            if rec.finish is FinishReason.ERROR or rec.output_len < 1:
                self.received["aborted"] += 1  # says nothing about the natural length
                continue
            # Capped and aborted requests are right-censored: they decoded this many
            # tokens and would have gone on. (vLLM reports a stop-string match as an
            # abort too; censoring is the conservative reading of it.)
            censored = rec.finish in (FinishReason.LENGTH, FinishReason.ABORT)
            if rec.finish is FinishReason.ABORT:
                self.received["aborted"] += 1
            self.workload.observe(rec.input_len, rec.output_len, censored=censored)

    @staticmethod
    def _new_preemptions(replica: ReplicaState) -> int:
        """Preemptions the replica reported (cumulative ``engine_stats``) since the last plan."""
        total = replica.engine_stats.get("preemptions")
        if total is None:
            return 0
        seen = replica.preemptions_seen
        replica.preemptions_seen = int(total)
        return 0 if seen is None else max(0, int(total) - seen)

    @staticmethod
    def _new_completions(replica: ReplicaState) -> int:
        """Completions the replica sent since the last plan (the denominator of its preemption rate)."""
        n, replica.completed_since_plan = replica.completed_since_plan, 0
        return n

    def _ingest_engine_stats(self, replica: ReplicaState, extra: object) -> None:
        """Cumulative engine counters (steps by phase, phase switches, preemptions...)."""
        if not isinstance(extra, dict) or "engine_stats" not in extra:
            return
        stats = extra["engine_stats"]
        if not isinstance(stats, dict) or not all(isinstance(k, str) and _counter_value(v) for k, v in stats.items()):
            self.rejected["bad_engine_stats"] += 1
            return
        replica.engine_stats = dict(stats)

    def _ingest_steps(self, replica: ReplicaState, records) -> None:
        alpha = self.config.concurrency_ema
        for raw in records:
            rec = check_step(raw)
            if isinstance(rec, str):
                self.rejected[rec] += 1
                continue
            self.received["steps"] += 1
            replica.fitter.observe_step(rec.prefill_tokens, rec.decode_tokens, rec.seconds, rec.kv_tokens)
            kind = step_kind(rec.prefill_tokens, rec.decode_tokens)
            hist = replica.step_seconds.get(kind)
            if hist is None:
                hist = replica.step_seconds[kind] = Histogram(STEP_SECONDS_BUCKETS)
            hist.observe(rec.seconds)
            demand = float(rec.running + rec.waiting)
            c = replica.concurrency
            replica.concurrency = demand if c is None else c + alpha * (demand - c)

    # -- decisions ---------------------------------------------------------

    def recompute(self, cause: str = "manual") -> int:
        """Re-estimate the workload and re-plan every replica; returns the new version."""
        started = time.perf_counter()
        estimate = self.workload.update()
        self.version += 1
        self.updates += 1
        for replica in self.replicas.values():
            plan = None
            if estimate is not None:
                try:
                    plan = self._plan(replica, estimate)
                except Exception:
                    # One replica's failed re-plan must not stop the others', nor this
                    # replica's convergence: it keeps its previous plan under the new
                    # version, and the failure is logged and counted (plan_errors).
                    logger.exception("re-plan of replica %s failed; it keeps its previous plan", replica.replica_id)
                    self.plan_errors += 1
            self._publish(replica, cause, estimate, plan)
        self.last_update_seconds = time.perf_counter() - started
        self.update_seconds.observe(self.last_update_seconds)
        return self.version

    def _plan(self, replica: ReplicaState, estimate: Estimate) -> Plan:
        # refits are staggered so one update refits about 1/cost_refit_every of the fleet
        if replica.cost is None or (self.updates + replica.ordinal) % self.config.cost_refit_every == 0:
            replica.cost = replica.fitter.fit()
        return replica.planner.plan(
            estimate,
            replica.cost.model,
            replica.kv_capacity_tokens,
            replica.concurrency if replica.concurrency is not None else replica.max_num_seqs,
            preempted=self._new_preemptions(replica),
            completed=self._new_completions(replica),
        )

    def _publish(self, replica: ReplicaState, cause: str, estimate: Estimate | None, plan: Plan | None) -> None:
        previous = replica.current.active
        replica.current = self._effective(replica)
        if replica.current.active is not previous:
            replica.mode_switches += 1
        replica.updated_at = self.clock()
        override = self.overrides.get(replica.replica_id) or self.overrides.get(FLEET)
        self.history.append(
            Decision(
                version=self.version,
                at=replica.updated_at,
                replica_id=replica.replica_id,
                cause=cause,
                update=replica.current.as_dict(),
                plan=None if plan is None else plan.as_dict(),
                estimate=None if estimate is None else dataclasses.asdict(estimate),
                cost_model=replica.cost_model.model_dump(),
                override=None if override is None else override.as_dict(),
            )
        )

    def _effective(self, replica: ReplicaState) -> ThresholdUpdate:
        base = replica.planner.update_for(replica.mode, self.version)
        for key in (FLEET, replica.replica_id):  # a replica's own override wins
            ov = self.overrides.get(key)
            if ov is None:
                continue
            mode = ov.mode or base.mode
            n = ov.n or base.n
            # a pinned k was valid for the N of its day; if the planner has since
            # lowered N (KV pressure), k follows it down rather than exceed it
            k = min(ov.k if ov.k is not None else base.k, n)
            active = base.active if mode is Mode.AUTO else mode
            base = ThresholdUpdate(mode=mode, k=k, n=n, version=self.version, active=active)
        return base

    # -- overrides ---------------------------------------------------------

    def kv_safe_n(self, replica: ReplicaState) -> int:
        """The largest N the controller considers memory-safe for a replica."""
        last = replica.planner.last
        return replica.max_num_seqs if last is None else last.n_cap

    def set_override(
        self,
        replica_id: str,
        mode: Mode | str | None = None,
        k: int | None = None,
        n: int | None = None,
        ttl_s: float | None = None,
        force: bool = False,
    ) -> int:
        """Pin mode/k/N for a replica or the fleet (``"*"``); returns the new version.

        Raises :class:`OverrideError` naming the field; nothing changes then.
        """
        if replica_id != FLEET and replica_id not in self.replicas:
            raise OverrideError("replica", f"unknown replica {replica_id!r}")
        try:
            mode = None if mode is None else Mode(mode)
        except ValueError:
            raise OverrideError("mode", f"must be one of {[m.value for m in Mode]}, got {mode!r}") from None
        if mode is None and k is None and n is None:
            raise OverrideError("mode", "give at least one of mode, k, n")
        if ttl_s is not None and not (math.isfinite(ttl_s) and ttl_s > 0):
            raise OverrideError("ttl_s", f"must be > 0 seconds, got {ttl_s!r}")
        targets = list(self.replicas.values()) if replica_id == FLEET else [self.replicas[replica_id]]
        for r in targets:
            n_eff = n if n is not None else r.current.n
            if n is not None:
                if n < 1:
                    raise OverrideError("n", f"must be >= 1, got {n}")
                if n > r.max_num_seqs:
                    raise OverrideError("n", f"{n} exceeds max_num_seqs {r.max_num_seqs} of replica {r.replica_id}")
                safe = self.kv_safe_n(r)
                if n > safe and not force:
                    raise OverrideError(
                        "n", f"{n} exceeds the KV-safe maximum {safe} of replica {r.replica_id} (set force to override)"
                    )
            if k is not None and not 1 <= k <= n_eff:
                raise OverrideError("k", f"must be in [1, n={n_eff}], got {k}")
        expires = None if ttl_s is None else self.clock() + ttl_s
        self.overrides[replica_id] = Override(mode=mode, k=k, n=n, expires_at=expires)
        return self._bump(f"override {replica_id}")

    def clear_override(self, replica_id: str) -> bool:
        """Remove an override; returns whether there was one."""
        if self.overrides.pop(replica_id, None) is None:
            return False
        self._bump(f"override cleared {replica_id}")
        return True

    def _expire_overrides(self) -> None:
        now = self.clock()
        expired = [key for key, ov in self.overrides.items() if ov.expires_at is not None and ov.expires_at <= now]
        for key in expired:
            del self.overrides[key]
        if expired:
            self._bump("override expired " + ",".join(expired))

    def _bump(self, cause: str) -> int:
        self.version += 1
        for replica in self.replicas.values():
            self._publish(replica, cause, self.workload.estimate, replica.planner.last)
        return self.version

    def thresholds(self, replica_id: str) -> ThresholdUpdate | None:
        """The replica's current thresholds (expired overrides dropped first)."""
        self._expire_overrides()
        replica = self.replicas.get(replica_id)
        return None if replica is None else replica.current

    # -- views -------------------------------------------------------------

    def replica_view(self, replica: ReplicaState) -> dict:
        """Everything the admin API and the exporter show about one replica."""
        plan = replica.planner.last
        cost = replica.cost_model
        return {
            **replica.current.as_dict(),
            "applied_version": replica.applied_version,
            "updated_at": replica.updated_at,
            "last_seen": replica.last_seen,
            "device": replica.device,
            "theta0": None if plan is None else plan.theta0,
            "delta_theta": None if plan is None else plan.delta_theta,
            "theta_star": None if plan is None else plan.theta_star,
            "theta": replica.planner.state.theta or self.config.planner.theta_cold,
            "n_star": None if plan is None else plan.n_cap,
            "concurrency": replica.concurrency,
            "kv_capacity_tokens": replica.kv_capacity_tokens,
            "max_num_seqs": replica.max_num_seqs,
            "crossover": None if plan is None or plan.crossover is None else plan.crossover.as_dict(),
            "reason": None if plan is None else plan.reason,
            "cost_model": {**cost.model_dump(), "alpha_mb": cost.alpha_mixed},
            "cost_fitted": [] if replica.cost is None else list(replica.cost.fitted),
            "mode_switches": replica.mode_switches,
            "dropped": {"completions": replica.dropped_completions, "steps": replica.dropped_steps},
            "engine_stats": dict(replica.engine_stats),
            "step_seconds": {kind: h.as_dict() for kind, h in replica.step_seconds.items()},
        }

    def snapshot(self) -> dict:
        """One consistent view of the whole controller (admin API and /metrics read this)."""
        self._expire_overrides()
        est = self.workload.estimate
        return {
            "version": self.version,
            "updates": self.updates,
            "estimate": None if est is None else dataclasses.asdict(est),
            "completions": self.workload.completions,
            "received": dict(self.received),
            "rejected": dict(self.rejected),
            "plan_errors": self.plan_errors,
            "overrides": {key: ov.as_dict() for key, ov in self.overrides.items()},
            "last_update_seconds": self.last_update_seconds,
            "update_seconds": self.update_seconds.as_dict(),
            "replicas": {rid: self.replica_view(r) for rid, r in self.replicas.items()},
        }

    def history_view(self, limit: int | None = None) -> list[dict]:
        """The newest ``limit`` decisions, newest last."""
        items = list(self.history)
        if limit is not None:
            items = items[-limit:] if limit > 0 else []
        return [dataclasses.asdict(d) for d in items]

    # -- persistence -------------------------------------------------------

    def state(self) -> dict:
        """JSON-able snapshot: windows, per-replica planner state and fitted costs, overrides."""
        return {
            "version": self.version,
            "updates": self.updates,
            "workload": self.workload.state(),
            # replicas set aside (not registered since a restart, or forgotten) are kept too:
            # a second restart before they register must not lose them
            "replicas": {
                **self._saved,
                **{rid: self._replica_state(r) for rid, r in self.replicas.items()},
            },
            "overrides": {key: ov.as_dict() for key, ov in self.overrides.items()},
            "history": self.history_view(),
            "received": dict(self.received),
            "rejected": dict(self.rejected),
            "plan_errors": self.plan_errors,
            "update_seconds": self.update_seconds.as_dict(),
        }

    @staticmethod
    def _replica_state(r: ReplicaState) -> dict:
        return {
            "planner": {
                "theta": r.planner.state.theta,
                "n_cap": r.planner.state.n_cap,
                "active": r.planner.state.active.value,
                "since_switch": min(r.planner.state.since_switch, 1 << 30),
                "plans": r.planner.state.plans,
                "kv_scale": r.planner.state.kv_scale,
                "n_obs_at_switch": r.planner.state.n_obs_at_switch,
                "context": r.planner.state.context,
            },
            "last_plan": None if r.planner.last is None else r.planner.last.as_dict(),
            "cost_model": r.cost_model.model_dump(),
            "concurrency": r.concurrency,
            "mode_switches": r.mode_switches,
            "next_completion": r.next_completion,
            "next_step": r.next_step,
            "dropped": {"completions": r.dropped_completions, "steps": r.dropped_steps},
        }

    def restore(self, state: dict) -> None:
        """Resume from :meth:`state`.

        Replicas re-register with their current facts (mode, KV capacity); until
        then their saved planner state and cost model wait in ``_saved``.
        """
        self.version = int(state["version"])
        self.updates = int(state["updates"])
        self.workload.restore(state["workload"])
        self._saved = dict(state.get("replicas", {}))
        for key, ov in state.get("overrides", {}).items():
            self.overrides[key] = Override(
                mode=None if ov["mode"] is None else Mode(ov["mode"]),
                k=ov["k"],
                n=ov["n"],
                expires_at=ov["expires_at"],
            )
        self.history.extend(Decision(**d) for d in state.get("history", []))
        self.received.update(state.get("received", {}))
        self.rejected.update(state.get("rejected", {}))
        self.plan_errors = int(state.get("plan_errors", 0))
        if "update_seconds" in state:
            self.update_seconds = Histogram.from_dict(state["update_seconds"])
