"""The EB+ scheduler: vLLM's own scheduler, steered by :mod:`replicas.phases`.

Use it in plain vLLM with ``scheduler_cls="ebplus.replicas.scheduler.EBPlusScheduler"``
(CLI ``--scheduler-cls``), configured through ``--additional-config`` or ``EBPLUS_*``
(:mod:`ebplus.replicas.settings`); replicas change the thresholds at run time through
the engine-core utility :data:`ebplus.replicas.control.UTILITY`.

How a step is made (vLLM 0.29–0.32; the scheduler is not a public API, so what moved between
releases is read through :mod:`ebplus.replicas.compat`):

1. Before the step the phase machine decides from ``(running, prefilling,
   waiting)`` what the step may contain (:class:`~ebplus.replicas.phases.StepPlan`).
2. The stock ``schedule()`` runs exactly once, restricted for that one call:
   ``self.running`` is replaced by the requests the plan allows (decoding ones,
   ones with prompt chunks left, or all) and vLLM's admission cap
   (``compat.SchedulerLayout.admission_cap``) is lowered to ``visible + max_admit``
   (admissions stop at the stock cap check). Budgets,
   chunking, KV allocation and preemption are vLLM's own code paths. Hidden
   requests keep their state and KV blocks; a prefill step cannot preempt a
   hidden decode. Afterwards the full running list is restored in admission
   order (minus preempted requests, plus admitted ones) and the cap restored.
   In MB mode nothing is hidden and the cap is ``N``: with ``N = max_num_seqs``
   this *is* the stock scheduler.
3. The output's tokens are classified as prefill or decode, fed back to the
   phase machine (KV back-off) and recorded (:mod:`replicas.recorder`).

``N`` can only be lowered below the start-up ``max_num_seqs`` (vLLM sizes its
buffers from it). When ``N`` drops below the running count, nothing is preempted:
admissions stop until the running requests drain below ``N``.

Sync and async scheduling: vLLM instantiates ``scheduler_cls`` as given, so a
``Scheduler`` subclass would silently lose async scheduling on GPUs (vLLM's
warning about "subclassed Scheduler instead of AsyncScheduler").
``EBPlusScheduler(...)`` therefore returns an :class:`EBPlusAsyncScheduler`
(same code on top of ``AsyncScheduler``) when the engine schedules asynchronously.
On CPU vLLM forces synchronous scheduling.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from vllm.platforms import current_platform
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import FinishReason as VllmFinishReason
from vllm.v1.request import Request

from ebplus.controller.messages import (
    RUNNING_SAMPLE,
    CompletionRecord,
    EngineFacts,
    FinishReason,
    Mode,
    PhaseReport,
    RunningRequest,
    StepKind,
    ThresholdUpdate,
    decode,
    encode,
)
from ebplus.replicas import settings
from ebplus.replicas.compat import check_api_servers, scheduler_layout
from ebplus.replicas.control import install_engine_utility
from ebplus.replicas.phases import EngineView, PhaseMachine, StepPlan
from ebplus.replicas.recorder import TelemetryRecorder, TokenTimes

# a child of vLLM's logger: our lines get the engine core's prefix and format
logger = logging.getLogger("vllm.ebplus.scheduler")

#: Seconds after start-up by which a controller has drained an engine it drives.
CONTROLLER_GRACE_S = 120.0

# NOTE: a repetition stop cuts the output short of its natural end: report it as
# an abort, which the controller treats as right-censored (like a length cap).
_FINISH = {
    VllmFinishReason.STOP: FinishReason.STOP,
    VllmFinishReason.LENGTH: FinishReason.LENGTH,
    VllmFinishReason.ABORT: FinishReason.ABORT,
    VllmFinishReason.ERROR: FinishReason.ERROR,
    VllmFinishReason.REPETITION: FinishReason.ABORT,
}


class EBPlusScheduler(Scheduler):
    """vLLM ``Scheduler`` running MB, EB(k, N), V0 or EB+ (``auto``) steps.

    Constructed by vLLM's engine core with vLLM's keyword arguments; the initial
    thresholds come from :func:`ebplus.replicas.settings.load`.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> EBPlusScheduler:
        if cls is EBPlusScheduler:
            vllm_config = kwargs.get("vllm_config", args[0] if args else None)
            if vllm_config is not None and vllm_config.scheduler_config.async_scheduling:
                cls = EBPlusAsyncScheduler
        return super().__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.layout = scheduler_layout()  # refuses a vLLM outside the supported range
        super().__init__(*args, **kwargs)
        check_api_servers(int(getattr(self.vllm_config.parallel_config, "_api_process_count", 1) or 1))
        self.max_num_seqs = self._admission_cap  # start-up cap: N may only lower it
        config = settings.load(self.vllm_config.additional_config)
        try:
            initial = config.scheduler.initial(self.max_num_seqs, config.theta_cold)
        except ValueError as exc:
            raise settings.SettingsError(f"EB+ scheduler settings ({config.source}): {exc}") from None
        self.machine = PhaseMachine(initial)
        self.recorder = TelemetryRecorder(config.scheduler.telemetry_buffer)
        self.token_times = TokenTimes()
        self.facts = EngineFacts(
            kv_capacity_tokens=int(self.cache_config.num_gpu_blocks or 0) * int(self.block_size),
            max_num_seqs=self.max_num_seqs,
            device=_device_name(),
            block_size=int(self.block_size),
            max_num_batched_tokens=int(self.max_num_scheduled_tokens),
            max_model_len=int(self.vllm_config.model_config.max_model_len),
        )
        self._next_seq = 0
        self._seq: dict[str, int] = {}  # request id -> arrival order at this engine
        self._cached: dict[str, int] = {}  # request id -> prompt tokens its first step found in the prefix cache
        self._drained = threading.Event()
        if initial.mode is Mode.AUTO:
            _warn_unless_drained(self._drained)

    @property
    def _admission_cap(self) -> int:
        """vLLM's admission cap: the stock waiting scan admits while fewer requests run."""
        return int(getattr(self, self.layout.admission_cap))

    @_admission_cap.setter
    def _admission_cap(self, value: int) -> None:
        setattr(self, self.layout.admission_cap, value)

    # -- one step ---------------------------------------------------------

    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        t0 = time.perf_counter()
        running = self.running
        prefilling = sum(1 for r in running if r.is_prefill_chunk)
        waiting = self.layout.waiting(self)
        view = EngineView(
            running=len(running),
            prefilling=prefilling,
            waiting=waiting,
            head_fits=self._head_fits() if waiting and running else True,
            now=time.time(),  # the stagger's slots are set on the wall clock the fleet's hosts share
        )
        plan = self.machine.decide(view)
        visible = _visible(running, plan, prefilling)
        restricted = visible is not running
        cap, budget = self._admission_cap, self.max_num_scheduled_tokens
        # NOTE: vLLM preempts by popping from its running list in place. It gets a copy, so that
        # `visible` still lists what it was shown and _merge drops what it preempted.
        self.running = list(visible) if restricted else running
        self._admission_cap = len(visible) + plan.max_admit if plan.prefill else len(visible)
        if plan.max_tokens:  # a prefill step cut for a stall target
            self.max_num_scheduled_tokens = min(budget, plan.max_tokens)
        t1 = time.perf_counter()
        try:
            out = super().schedule(throttle_prefills)
        finally:
            t2 = time.perf_counter()
            if restricted:
                self.running = _merge(running, visible, self.running)
            self._admission_cap, self.max_num_scheduled_tokens = cap, budget
        prefill_tokens, decode_tokens, kv_tokens = self._count_tokens(out)
        admitted = len(out.scheduled_new_reqs) + len(out.scheduled_cached_reqs.resumed_req_ids)
        running_after = len(self.running)
        self.machine.observe(admitted, prefill_tokens, running_after)
        rec = self.recorder
        waiting_after = self.layout.waiting(self)
        preempted = len(out.preempted_req_ids or ())
        rec.scheduled(out, prefill_tokens, decode_tokens, running_after, waiting_after, preempted, t2, kv_tokens)
        t3 = time.perf_counter()
        rec.counters["schedule_seconds"] += t3 - t0
        rec.counters["overhead_seconds"] += (t1 - t0) + (t3 - t2)
        return out

    def add_request(self, request: Request) -> None:
        self._seq[request.request_id] = self._next_seq
        self._next_seq += 1
        super().add_request(request)

    def _head_fits(self) -> bool:
        """Whether the next waiting request's whole sequence fits in the free KV blocks now.

        The same test vLLM's admission makes (``scheduler_reserve_full_isl``), without
        prefix-cache hits, so it errs towards "does not fit"; the phase machine
        only acts on it while something is running. Only computed in EB mode.
        """
        head = self.layout.next_waiting(self) if self.machine.thresholds.active is Mode.EB else None
        if head is None:
            return True
        need = self._request_remaining_blocks(head) + self.kv_cache_manager.watermark_blocks
        return need <= self.kv_cache_manager.block_pool.get_num_free_blocks()

    def _count_tokens(self, out: SchedulerOutput) -> tuple[int, int, int]:
        """(prefill, decode, KV read by the decodes) tokens of a step.

        A resumed request's recompute counts as prefill. The KV the decodes read is
        their summed context before the step: decode time grows with it, and the
        controller's cost fit needs it to tell per-sequence from per-context cost.
        """
        prefill = decode = kv = 0
        spec = out.scheduled_spec_decode_tokens
        requests = self.requests
        for new in out.scheduled_new_reqs:  # first step: what it did not compute came from the prefix cache
            self._cached.setdefault(new.req_id, new.num_computed_tokens)
        for req_id, n in out.num_scheduled_tokens.items():
            req = requests[req_id]
            # _update_after_schedule already advanced num_computed_tokens by n
            context = req.num_computed_tokens - n
            if context >= req.num_prompt_tokens and n <= 1 + len(spec.get(req_id, ())):
                decode += n
                kv += context
            else:
                prefill += n
        return prefill, decode, kv

    def update_from_output(self, scheduler_output: SchedulerOutput, model_runner_output: Any) -> Any:
        t0 = time.perf_counter()
        self.recorder.updated(scheduler_output)
        requests = self.requests
        # a token for each request whose prompt is computed (a decode, or its last chunk): num_computed_tokens
        # was advanced when the step was scheduled
        self.token_times.emitted(
            [
                rid
                for rid in scheduler_output.num_scheduled_tokens
                if (r := requests.get(rid)) is not None and r.num_computed_tokens >= r.num_prompt_tokens
            ]
        )
        self.recorder.counters["overhead_seconds"] += time.perf_counter() - t0
        return super().update_from_output(scheduler_output, model_runner_output)

    def _free_request(self, request: Request, delay_free_blocks: bool = False) -> Any:
        # Every finished, aborted or failed request passes here exactly once.
        # NOTE: stop strings are matched in the front-end and arrive as aborts.
        rid = request.request_id
        ttft, stall = self.token_times.pop(rid, request.arrival_time)
        self.recorder.finished(
            CompletionRecord(
                input_len=request.num_prompt_tokens,
                output_len=request.num_output_tokens,
                finish=_FINISH.get(request.get_finished_reason(), FinishReason.ABORT),
                seq=self._seq.pop(rid, -1),
                max_tokens=self._cap(request),
                cached_tokens=self._cached.pop(rid, 0),
                ttft_s=ttft,
                stall_s=stall,
            )
        )
        return super()._free_request(request, delay_free_blocks)

    def _cap(self, request: Request) -> int:
        """The most output tokens ``request`` can produce: its max_tokens, or what the model length leaves."""
        return max(0, min(int(request.max_tokens), self.max_model_len - request.num_prompt_tokens))

    def _running_sample(self) -> list[RunningRequest]:
        running = self.running
        step = max(1, -(-len(running) // RUNNING_SAMPLE))
        return [
            RunningRequest(
                seq=self._seq.get(r.request_id, 0),
                input_len=r.num_prompt_tokens,
                age=r.num_output_tokens,
                max_tokens=self._cap(r),
                cached_tokens=self._cached.get(r.request_id, 0),
            )
            for r in running[::step]
        ]

    # -- the control channel (ebplus.replicas.control) ---------------------

    def ebplus_apply(self, payload: bytes) -> bytes:
        """Install a :class:`ThresholdUpdate` for the next step; returns what is applied.

        ``n`` is clamped to the start-up ``max_num_seqs`` and ``k`` to ``n``. Raises
        ``ValueError`` on an undecodable update (the caller gets the message; the
        engine keeps running on the old values).
        """
        update = decode(payload, ThresholdUpdate)
        n = min(update.n, self.max_num_seqs)
        self.machine.apply(update.replace(n=n, k=min(update.k, n)))
        return self.ebplus_applied()

    def ebplus_applied(self) -> bytes:
        """The thresholds the next step runs under."""
        return encode(self.machine.thresholds)

    def ebplus_board(self) -> bytes:
        """The engine's :class:`PhaseReport` now, between two steps: what routers need of its batching."""
        th, machine = self.machine.thresholds, self.machine
        running = self.running
        queued = sum(max(0, r.num_tokens - r.num_computed_tokens) for r in self.layout.waiting_requests(self))
        rec, now = self.recorder, time.time()
        return encode(
            PhaseReport(
                mode=th.active,
                prefilling=th.active is Mode.EB and machine.phase is StepKind.PREFILL,
                running=len(running),
                waiting=self.layout.waiting(self),
                n=th.n,
                k=th.effective_k,
                freed=max(0, machine.freed(len(running))),
                prefill_tokens=queued
                + sum(r.num_prompt_tokens - r.num_computed_tokens for r in running if r.is_prefill_chunk),
                kv_tokens=sum(r.num_computed_tokens for r in running),
                decode_step_s=rec.last_decode_s,
                mean_output=rec.mean_output,
                mean_prompt=rec.mean_prompt,
                read_at=now,
                slot_at=machine.next_slot(now) if th.active is Mode.EB else None,
            )
        )

    def ebplus_drain(self) -> bytes:
        """Telemetry since the last drain, the running requests, counters and the engine's facts."""
        self._drained.set()
        ps = self.machine.stats
        report = self.recorder.drain(
            self.facts,
            self.machine.thresholds,
            running=self._running_sample(),
            running_total=len(self.running),
            waiting_total=self.layout.waiting(self),
            counters={
                "phase_switches": ps.phase_switches,
                "kv_backoffs": ps.kv_backoffs,
                "stagger_windows": ps.stagger_windows,
            },
        )
        return encode(report)


class EBPlusAsyncScheduler(EBPlusScheduler, AsyncScheduler):
    """The same scheduler on top of vLLM's ``AsyncScheduler`` (output placeholders).

    MRO: ``EBPlusAsyncScheduler -> EBPlusScheduler -> AsyncScheduler -> Scheduler``,
    so our hooks wrap the async ones. Selected automatically by ``EBPlusScheduler``.
    """


def _visible(running: list[Request], plan: StepPlan, prefilling: int) -> list[Request]:
    """The running requests the stock ``schedule()`` may see this step (``running`` itself if all)."""
    if plan.decode and plan.prefill:
        return running
    if plan.prefill:
        return running if prefilling == len(running) else [r for r in running if r.is_prefill_chunk]
    if plan.decode:
        return running if prefilling == 0 else [r for r in running if not r.is_prefill_chunk]
    return running if not running else []


def _merge(before: list[Request], visible: list[Request], after: list[Request]) -> list[Request]:
    """Full running list after a restricted call, in admission order.

    Hidden requests stay; visible ones stay unless the call preempted them;
    requests the call admitted are appended (they are the newest).
    """
    visible_set, after_set, before_set = set(visible), set(after), set(before)
    merged = [r for r in before if r not in visible_set or r in after_set]
    merged.extend(r for r in after if r not in before_set)
    return merged


def _warn_unless_drained(drained: threading.Event) -> None:
    """Warn once if no controller reads this engine soon after start: ``auto`` would run MB for good.

    A controller drains every engine it drives within a second of start-up (the
    Ray replica, or the plain-vLLM plugin enabled with ``VLLM_PLUGINS=ebplus``). A
    daemon timer, so the step loop pays nothing for the check.
    """

    def check() -> None:
        if not drained.is_set():
            logger.warning(
                "EB+ mode auto follows a controller, but none has read this engine's telemetry in %.0f s: it runs MB. "
                "Under plain vLLM enable the plugin (VLLM_PLUGINS=ebplus, see the EB+ Serve docs), or set mode eb|mb.",
                CONTROLLER_GRACE_S,
            )

    timer = threading.Timer(CONTROLLER_GRACE_S, check)
    timer.daemon = True
    timer.start()


def _device_name() -> str:
    """The accelerator's name (``cpu`` on CPU); NVML on CUDA, so no CUDA context here."""
    try:
        return str(current_platform.get_device_name(0))
    except Exception:  # platforms without a name lookup
        return str(getattr(current_platform, "device_name", "unknown"))


# The control channel exists wherever this module is imported (the engine core resolves
# scheduler_cls before any call can arrive), also when VLLM_PLUGINS leaves our general plugin out.
install_engine_utility()
