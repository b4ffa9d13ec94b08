"""The control loop of EB+, without Ray: fleet-wide workload, per-replica decisions.

:class:`FleetController` is what the controller actor (``controller/actor.py``)
and the plain-vLLM plugin wrap, and what the simulator runs in-process, so the
loop evaluated offline is the one deployed. It

* ingests telemetry batches as wire bytes, through :func:`ebplus.controller.telemetry.intake`
  (bad records are counted, never raised);
* keeps one fleet-wide :class:`~ebplus.controller.estimator.WorkloadEstimator`
  (the workload is the same for every replica behind one router) and, per
  replica, a :class:`~ebplus.controller.cost_fit.CostModelFitter`, a
  :class:`~ebplus.controller.planner.ThresholdPlanner` and an EMA of observed
  concurrency (GPU types differ, so ``k*``, ``N*`` and the EB/MB choice are per
  replica);
* every ``update_every`` completions re-estimates and re-plans every replica,
  bumping a global ``version``, and records each decision with its inputs;
* applies operator overrides (:mod:`ebplus.controller.overrides`).

Views for the admin API and ``/metrics`` are in :mod:`ebplus.controller.views`,
persistence in :mod:`ebplus.controller.persistence`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ebplus.controller import persistence, replica_work, stagger, views
from ebplus.controller.config import ControllerConfig, PlannerConfig
from ebplus.controller.cost_fit import CostFit, CostModelFitter
from ebplus.controller.cost_model import CostModel
from ebplus.controller.estimator import Estimate, WorkloadEstimator
from ebplus.controller.evidence import ModeEvidence
from ebplus.controller.messages import (
    CompletionRecord,
    EngineFacts,
    EngineStats,
    Mode,
    Registration,
    RunningRequest,
    StepKind,
    TelemetryBatch,
    ThresholdUpdate,
)
from ebplus.controller.overrides import FLEET, OverrideError, Overrides, Target
from ebplus.controller.planner import Plan, ThresholdPlanner
from ebplus.controller.stats import UPDATE_SECONDS_BUCKETS, Histogram
from ebplus.controller.telemetry import intake

logger = logging.getLogger("ebplus.controller")

#: Weight of each plan interval's tokens/s in a replica's load average.
LOAD_EMA = 0.3

#: Replicas whose state a controller keeps aside after forgetting them (see ``FleetController.forget``).
MAX_SAVED_REPLICAS = 64

Clock = Callable[[], float]


@dataclass
class ReplicaState:
    """What the controller knows about one replica."""

    replica_id: str
    mode: Mode
    facts: EngineFacts
    fitter: CostModelFitter
    planner: ThresholdPlanner
    current: ThresholdUpdate
    model: str = ""  # the model it serves ("" if its release did not say)
    cost: CostFit | None = None
    ordinal: int = 0  # registration order; staggers cost refits across replicas
    concurrency: float | None = None  # EMA of running + waiting
    applied_version: int = -1
    last_seen: float = 0.0
    updated_at: float = 0.0
    dropped_completions: int = 0
    dropped_steps: int = 0
    mode_switches: int = 0  # changes of the active policy published to this replica
    engine_stats: EngineStats | None = None  # cumulative counters reported by the replica
    preemptions_seen: int | None = None  # engine_stats.preemptions at the last plan
    completed_since_plan: int = 0  # completions from this replica since its last plan
    next_completion: int = -1  # running index of the next completion record expected (-1: unknown)
    next_step: int = -1  # same for step records
    step_seconds: dict[StepKind, Histogram] = field(default_factory=dict)
    evidence: ModeEvidence = field(default_factory=ModeEvidence)  # steps per mode (the closed loop)
    active_since: int = 0  # the version from which the replica was told to run current.active
    max_seq: int = -1  # the newest admission the replica reported (completions, running requests)
    switch_seq: int = -1  # max_seq when it last took up a new mode: older requests lived through the switch
    load_tokens: int = 0  # tokens the replica's steps computed since its last plan (the offered load)
    load_since: float | None = None  # when that count started
    load: float | None = None  # its average over plans (tokens/s)
    steps_seen: int = 0  # step records absorbed, ever (a refit with no new one would change nothing)
    fitted_steps: int = -1  # steps_seen at the last cost refit
    fitted_at: int = 0  # the update of the last cost refit
    sampling: tuple[float, float] = (1.0, 1.0)  # shares of requests and cycles it reports (replicas/sampling.py)
    # what its last registration answered, and where that came from: "known" (registered before),
    # "saved" (a restarted controller's persisted plan), "fleet" (another replica's plan), "cold"
    registered: tuple[str, ThresholdUpdate] | None = None

    @property
    def cost_model(self) -> CostModel:
        return self.fitter.prior if self.cost is None else self.cost.model


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
        self.overrides = Overrides(clock)
        self.history: deque[views.DecisionRecord] = deque(maxlen=cfg.history)
        self.version = 0
        self.updates = 0
        self.received: Counter[str] = Counter()  # completions, steps, batches, aborted
        self.rejected: Counter[str] = Counter()  # by reason
        self.last_update_seconds = 0.0
        self.plan_errors = 0  # re-plans of a replica that raised (see recompute)
        self.update_seconds = Histogram(UPDATE_SECONDS_BUCKETS)
        self.stagger = stagger.OFF  # offsets of the EB replicas' prefill windows
        #: persisted replica state awaiting re-registration (a resumed or forgetful controller)
        self.saved: dict[str, persistence.SavedReplica] = {}
        self._registrations = 0

    # -- replicas ----------------------------------------------------------

    def register(self, registration: Registration) -> ThresholdUpdate:
        """Add (or re-add) a replica; returns the thresholds it should run now.

        A replica seen before keeps its state; one this controller persisted (a
        restart) resumes its decisions and fitted costs; a new one starts from the
        fleet's latest plan rather than cold, with ``registration.prior`` (chosen
        by the replica for its device) as its cost model.
        """
        facts = registration.facts
        if facts.kv_capacity_tokens < 1 or facts.max_num_seqs < 2:
            raise ValueError("kv_capacity_tokens must be >= 1 and max_num_seqs >= 2")
        rid = registration.replica_id
        old = self.replicas.get(rid)
        saved = self.saved.pop(rid, None)
        planner_cfg = self.config.planner.model_copy(
            update={"max_num_seqs": facts.max_num_seqs, "max_num_batched_tokens": facts.max_num_batched_tokens or None}
        )
        planner = ThresholdPlanner(planner_cfg)
        prior = registration.prior
        origin = "cold"
        if old is not None:
            planner.state, planner.last = old.planner.state, old.planner.last
            origin = "known"
        elif saved is not None:
            planner.state, planner.last = dataclasses.replace(saved.planner), saved.last_plan
            prior = saved.cost_model
            origin = "saved"
        else:  # a replica of the same model, else any: its plan is closer than a cold one
            donor = next((r for r in self.replicas.values() if r.model == registration.model), None)
            donor = donor or next(iter(self.replicas.values()), None)
            if donor is not None and donor.planner.last is not None:
                planner.state = dataclasses.replace(donor.planner.state)
                planner.last = donor.planner.last
                origin = "fleet"
        fresh = {
            "mode": Mode(registration.mode),
            "facts": facts,
            "model": registration.model,
            "planner": planner,
            "current": planner.update_for(registration.mode, self.version),
            "last_seen": self.clock(),
        }
        if old is not None:  # the same replica again: everything it measured stays, what it declared is new
            state = dataclasses.replace(old, **fresh)
        else:
            fitter = CostModelFitter(prior, self.config.step_window, self.config.min_steps)
            state = ReplicaState(replica_id=rid, fitter=fitter, ordinal=self._registrations,
                                 evidence=self._evidence(planner_cfg), **fresh)  # fmt: skip
            if saved is not None:
                state.concurrency, state.mode_switches = saved.concurrency, saved.mode_switches
                state.next_completion, state.next_step = saved.next_completion, saved.next_step
                state.dropped_completions, state.dropped_steps = saved.dropped.completions, saved.dropped.steps
        # the replica's next batch starts where it says: below the cursor (a new process under the same id) its
        # records would be duplicates; above it (state restored from before its last pushes), a jump
        if registration.completions_from >= 0:
            state.next_completion = registration.completions_from
        if registration.steps_from >= 0:
            state.next_step = registration.steps_from
        self._registrations += 1
        self.replicas[rid] = state
        state.current = self._effective(state)
        state.registered = (origin, state.current)
        return state.current

    @property
    def registrations(self) -> int:
        """Registrations ever answered (a replica's return counts again)."""
        return self._registrations

    @staticmethod
    def _evidence(cfg: PlannerConfig) -> ModeEvidence:
        return ModeEvidence(cfg.loop.window_steps, cfg.loop.min_steps, cfg.loop.min_phases)

    def forget(self, replica_id: str) -> bool:
        """Drop a replica (dead or scaled down); its overrides go with it.

        Its decisions, fitted costs and record cursors are set aside, as a restored
        controller's are: a replica that was only silent (stalled, or the controller
        itself was paused) resumes where it was when it registers again instead of
        starting cold. At most :data:`MAX_SAVED_REPLICAS` are kept (oldest dropped).
        """
        self.overrides.clear(replica_id)
        replica = self.replicas.pop(replica_id, None)
        if replica is None:
            return False
        self.workload.forget(replica_id)
        self.saved.pop(replica_id, None)
        self.saved[replica_id] = persistence.saved_replica(replica)
        while len(self.saved) > MAX_SAVED_REPLICAS:
            self.saved.pop(next(iter(self.saved)))
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

    def ingest(self, payload: bytes) -> ThresholdUpdate | None:
        """Validate and absorb one batch (a :class:`TelemetryBatch`, encoded); re-plan when due.

        Returns the thresholds the sending replica should run, or ``None`` for an
        unknown replica (the batch is rejected and counted; the replica should
        register again). Nothing in a batch can make this raise: a field of the
        wrong shape is counted (``bad_batch``) and ignored, a bad record is counted
        by reason, and a record already ingested (a late duplicate) is skipped.
        """
        replica, due = self.absorb(payload)
        if replica is None:
            return None
        if due is not None:
            self.recompute(due)
        self.expire_overrides()
        return replica.current

    def absorb(self, payload: bytes) -> tuple[ReplicaState | None, str | None]:
        """:meth:`ingest` without the re-plan, for a caller that re-plans off the ingest path (the actor of a
        large fleet): the sender's state (``None``: unknown) and the cause of a re-plan now due, if any."""
        batch = intake(payload, self.rejected)
        if batch is None:
            self.received["batches"] += 1
            return None, None
        return self.absorb_checked(batch)

    def absorb_checked(self, batch: TelemetryBatch) -> tuple[ReplicaState | None, str | None]:
        """:meth:`absorb` of a batch that came out of :func:`~ebplus.controller.telemetry.intake` (the actor
        takes it in on its event loop and may hold it for its worker); nothing else may call this."""
        self.received["batches"] += 1
        replica = self.replicas.get(batch.replica_id)
        if replica is None:
            self.rejected["unknown_replica"] += 1
            return None, None
        replica.last_seen = self.clock()
        running_mode = self._running_mode(replica)  # what the batch's steps ran: known from the previous push
        replica.applied_version = batch.applied_version
        replica.dropped_completions += batch.dropped_completions
        replica.dropped_steps += batch.dropped_steps
        if batch.stats is not None:
            replica.engine_stats = batch.stats
        completions = replica_work.fresh(
            self.rejected, replica, "next_completion", batch.completions, batch.completions_from, batch.dropped_completions
        )
        steps = replica_work.fresh(self.rejected, replica, "next_step", batch.steps, batch.steps_from, batch.dropped_steps)
        completions = replica_work.plausible(self.rejected, replica.facts, completions)
        replica_work.absorb_completions(self.received, self.workload, replica.replica_id, completions)
        running = None if batch.running_total < 0 else batch.running  # < 0: not reported
        self._attribute_latency(replica, running_mode, completions, running or ())
        if running is not None:
            self.workload.observe_running(replica.replica_id, running, batch.running_total)
        replica.sampling = (batch.request_rate, batch.step_rate)
        # preemptions are counted on the engine, all of them: relate them to all its completions
        replica.completed_since_plan += round(len(completions) / batch.request_rate)
        replica_work.absorb_steps(self.received, replica, steps, self.config.concurrency_ema)
        if running_mode is not None and steps:
            est = self.workload.estimate
            lengths = None if est is None else (est.mu_l, est.mu_o)
            replica.evidence.observe(running_mode, steps, replica.planner.state.plans, lengths)
        return replica, self._due(replica)

    @staticmethod
    def _attribute_latency(
        replica: ReplicaState, mode: Mode | None, completions: list[CompletionRecord], running: Sequence[RunningRequest]
    ) -> None:
        """Latency evidence: requests admitted after the replica took up ``mode`` and finished under it.

        A request's TTFT and stall are its whole life's: one that started under the other
        mode says nothing clean of either, so only admissions newer than the switch count.
        """
        seqs = [r.seq for r in completions] + [r.seq for r in running]
        newest = max(seqs, default=-1)
        if mode is None:  # the push that straddles a switch: the requests admitted so far predate it
            replica.switch_seq = max(replica.max_seq, newest)
        elif completions:
            clean = [r for r in completions if r.seq > replica.switch_seq]
            if clean:
                replica.evidence.observe_completions(mode, clean)
        replica.max_seq = max(replica.max_seq, newest)

    @staticmethod
    def _running_mode(replica: ReplicaState) -> Mode | None:
        """The policy (EB or MB) the replica ran since its previous push, if certain.

        Certain once the replica had reported, by its previous push, a version at or after
        the one that told it to run ``current.active``: the steps it sends now all ran
        under it. The push that straddles a switch is not attributed to either mode.
        """
        return replica.current.active if replica.applied_version >= replica.active_since else None

    def _due(self, replica: ReplicaState) -> str | None:
        """Why the fleet must be re-planned after this replica's push, if it must."""
        if self.workload.update_due():
            return "periodic"
        if self._concurrency_moved(replica):
            return "concurrency"
        if self._explored(replica):
            return "explored"
        if self._cold_switch(replica):
            return "cold"
        return None

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

    @staticmethod
    def _explored(replica: ReplicaState) -> bool:
        """An exploration has its sample: decide now rather than at the next periodic update
        (at low concurrency one update window is hundreds of steps in the slower mode)."""
        st = replica.planner.state
        return st.exploring is not None and replica.evidence.enough_since(st.exploring, st.explore_mark)

    def _cold_switch(self, replica: ReplicaState) -> bool:
        """Before the first estimate: cap N for the KV the first cohort will need
        (:meth:`ThresholdPlanner.cold_cap`), and let an ``auto`` replica leave MB for EB on its
        prior alone (:meth:`ThresholdPlanner.cold_choice`). True when either changed something."""
        if self.workload.estimate is not None:
            return False
        capped = None
        guess = self.workload.cold_guess(replica.replica_id, self.config.planner.cold_output_tokens)
        if guess is not None:
            capped = replica.planner.cold_cap(replica.facts.kv_capacity_tokens, *guess)
            if capped is not None:
                logger.info(
                    "replica %s: cold N cap %d (prompts %.0f, outputs reserved %.0f)",
                    replica.replica_id,
                    capped,
                    *guess,
                )
        if replica.mode not in (Mode.AUTO, Mode.SHADOW) or replica.concurrency is None:
            return capped is not None
        reason = replica.planner.cold_choice(replica.cost_model, replica.facts.kv_capacity_tokens, replica.concurrency)
        if reason is not None:
            logger.info("replica %s: %s", replica.replica_id, reason)
        return reason is not None or capped is not None

    @staticmethod
    def _new_preemptions(replica: ReplicaState) -> int:
        """Preemptions the replica reported (cumulative engine stats) since the last plan."""
        if replica.engine_stats is None:
            return 0
        total = replica.engine_stats.preemptions
        seen, replica.preemptions_seen = replica.preemptions_seen, total
        return 0 if seen is None else max(0, total - seen)

    @staticmethod
    def _new_completions(replica: ReplicaState) -> int:
        """Completions the replica sent since the last plan (the denominator of its preemption rate)."""
        n, replica.completed_since_plan = replica.completed_since_plan, 0
        return n

    # -- decisions ---------------------------------------------------------

    def recompute(self, cause: str = "manual") -> int:
        """Re-estimate the workload and re-plan every replica; returns the new version."""
        started = time.perf_counter()
        estimate = self.workload.update()
        self.updates += 1
        replicas = list(self.replicas.values())
        refit = replica_work.refits(replicas, self.updates, self.config.cost_refit_every)
        if estimate is not None:  # the steps the plans below measure, priced for the whole fleet at once
            replica_work.price_evidence(replicas, refit)
        plans: list[Plan | None] = []
        for replica in replicas:
            plan = None
            if estimate is not None:
                try:
                    plan = self._plan(replica, estimate, replica.replica_id in refit)
                except Exception:
                    # One replica's failed re-plan must not stop the others', nor this
                    # replica's convergence: it keeps its previous plan under the new
                    # version, and the failure is logged and counted (plan_errors).
                    logger.exception("re-plan of replica %s failed; it keeps its previous plan", replica.replica_id)
                    self.plan_errors += 1
            plans.append(plan)
        self.version += 1
        bases = [self._unstaggered(r) for r in replicas]  # the stagger is decided on them, then added to them
        fleet = [(r.replica_id, base, r.concurrency, r.cost_model) for r, base in zip(replicas, bases, strict=True)]
        self.stagger = stagger.of_fleet(self.config.stagger, fleet, estimate)
        for replica, plan, base in zip(replicas, plans, bases, strict=True):
            self._publish(replica, cause, estimate, plan, base)
        self.last_update_seconds = time.perf_counter() - started
        self.update_seconds.observe(self.last_update_seconds)
        return self.version

    def _plan(self, replica: ReplicaState, estimate: Estimate, refit: bool) -> Plan:
        if refit or replica.cost is None:
            replica.cost = replica.fitter.fit()
            replica.fitted_steps, replica.fitted_at = replica.steps_seen, self.updates
        return replica.planner.plan(
            estimate,
            replica.cost.model,
            replica.facts.kv_capacity_tokens,
            replica.concurrency if replica.concurrency is not None else replica.facts.max_num_seqs,
            preempted=self._new_preemptions(replica),
            completed=self._new_completions(replica),
            evidence=replica.evidence,
            explore=replica.current.mode is Mode.AUTO,  # not shadow, a fixed mode, or an operator's pin
            load=self._load(replica),
        )

    def _load(self, replica: ReplicaState) -> float | None:
        """Tokens/s the replica computed, averaged over plans (EMA, weight ``LOAD_EMA``): under
        open-loop traffic, the offered load."""
        now = self.clock()
        since, replica.load_since = replica.load_since, now
        tokens, replica.load_tokens = replica.load_tokens, 0
        if since is None or now <= since or not tokens:
            return replica.load
        rate = tokens / (now - since)
        replica.load = rate if replica.load is None else replica.load + LOAD_EMA * (rate - replica.load)
        return replica.load

    def _publish(self, replica: ReplicaState, cause: str, estimate: Estimate | None, plan: Plan | None,
                 base: ThresholdUpdate | None = None) -> None:  # fmt: skip
        previous = replica.current.active
        replica.current = self._effective(replica, base)
        if replica.current.active is not previous:
            replica.mode_switches += 1
            replica.active_since = replica.current.version
        replica.updated_at = self.clock()
        self.history.append(
            views.DecisionRecord(
                self.version,
                replica.updated_at,
                replica.replica_id,
                cause,
                replica.current,
                plan,
                estimate,
                replica.cost_model,
                self.overrides.get(replica.replica_id),
            )
        )

    def _effective(self, replica: ReplicaState, base: ThresholdUpdate | None = None) -> ThresholdUpdate:
        """:meth:`_unstaggered` (``base``, when the caller has it) with the fleet's stagger if the replica runs EB."""
        update = self._unstaggered(replica) if base is None else base
        phase = self.stagger.phase_of(replica.replica_id)
        on = phase is not None and update.active is Mode.EB
        return update.replace(stagger_period_s=self.stagger.period_s, stagger_phase=phase) if on else update

    def _unstaggered(self, replica: ReplicaState) -> ThresholdUpdate:
        """The planner's thresholds with the overrides applied, N held to what this replica can run: an override
        was checked against the replicas of its day, and one registered since may declare fewer slots or less KV
        (N stops at its max_num_seqs and, unless forced, at its KV-safe maximum, as set_override requires)."""
        base = replica.planner.update_for(replica.mode, self.version)
        pinned = self.overrides.apply(replica.replica_id, base)
        limit = replica.facts.max_num_seqs
        if not self.overrides.forced(replica.replica_id):
            limit = min(limit, self.kv_safe_n(replica))
        if pinned.n > limit:
            pinned = pinned.replace(n=limit, k=min(pinned.k, limit))
        return pinned

    def thresholds(self, replica_id: str) -> ThresholdUpdate | None:
        """The replica's current thresholds (expired overrides dropped first)."""
        self.expire_overrides()
        replica = self.replicas.get(replica_id)
        return None if replica is None else replica.current

    # -- overrides ---------------------------------------------------------

    def kv_safe_n(self, replica: ReplicaState) -> int:
        """The largest N the controller considers memory-safe for a replica."""
        last = replica.planner.last
        return replica.facts.max_num_seqs if last is None else last.n_cap

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

        Raises :class:`~ebplus.controller.overrides.OverrideError` naming the field;
        nothing changes then.
        """
        if replica_id != FLEET and replica_id not in self.replicas:
            raise OverrideError("replica", f"unknown replica {replica_id!r}")
        chosen = self.replicas.values() if replica_id == FLEET else [self.replicas[replica_id]]
        targets = [Target(r.replica_id, r.facts.max_num_seqs, self.kv_safe_n(r), r.current.n) for r in chosen]
        if not targets:  # no replica yet: the configured bound stands in for what they will declare
            bound = self.config.planner.max_num_seqs
            targets = [Target("(none registered yet: controller.planner.max_num_seqs)", bound, bound, bound)]
        self.overrides.set(replica_id, targets, mode=mode, k=k, n=n, ttl_s=ttl_s, force=force)
        return self._bump(f"override {replica_id}")

    def clear_override(self, replica_id: str) -> bool:
        """Remove an override; returns whether there was one."""
        if not self.overrides.clear(replica_id):
            return False
        self._bump(f"override cleared {replica_id}")
        return True

    def expire_overrides(self) -> None:
        expired = self.overrides.expire()
        if expired:
            self._bump("override expired " + ",".join(expired))

    def _bump(self, cause: str) -> int:
        self.version += 1
        for replica in self.replicas.values():
            self._publish(replica, cause, self.workload.estimate, replica.planner.last)
        return self.version

    # -- views and persistence -------------------------------------------

    def snapshot(self) -> views.FleetSnapshot:
        """One consistent view of the whole controller (admin API and /metrics read this)."""
        return views.snapshot(self)

    def history_view(self, limit: int | None = None) -> list[views.Decision]:
        """The newest ``limit`` decisions, newest last."""
        items = list(self.history)
        if limit is not None:
            items = items[-limit:] if limit > 0 else []
        return [record.decision() for record in items]

    def state(self) -> persistence.ControllerState:
        """What to persist (see :mod:`ebplus.controller.persistence`)."""
        return persistence.dump(self)

    def restore(self, state: persistence.ControllerState) -> None:
        """Resume from :meth:`state` (parse a stored one with :func:`persistence.parse`)."""
        persistence.load(self, state)
