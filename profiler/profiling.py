"""``ebplus profile``: measure an engine's step costs and fit a hardware profile.

The engine (in-process, EB+ scheduler in MB mode, i.e. vLLM's stock batching)
is driven one step at a time with requests whose arrival is timed so that each
step has a chosen composition; the scheduler's own telemetry gives every step's
prefill tokens, decode tokens and seconds. Three kinds of steps, interleaved in
rounds so that slow periods of a shared machine spread over all of them:

* prefill-only: one request of ``L`` tokens (or ``c`` packed ones) with
  ``max_tokens=1`` arrives on an idle engine; its single output token comes out
  of the prefill step, so the step is pure prefill;
* decode-only: ``max_num_seqs`` short requests with staggered ``max_tokens``
  decode together until the last one ends: batch sizes sweep from full to one
  while their contexts grow;
* mixed: ``m`` requests decode while a prompt of ``L`` tokens (``max_tokens=1``)
  arrives before every step, so each step carries ``m`` decodes and ``L``
  prefill tokens: decode shares ``r = m/(m+L)`` from ~0 to ~0.9.

The steps go through the controller's :class:`~ebplus.controller.cost_fit.CostModelFitter`
(robust Huber fits per kind, ``beta_mb(r) = a + b r + c r^2``) after keeping the
fastest repeat of each step shape (:func:`lower_envelope`). Its prior is an
unregularised robust fit of the same rows, so the fitter's regularisation pulls
towards the data, not towards another machine's profile.

KV reads: each step carries the KV tokens its decodes read (``StepRecord.kv_tokens``).
The decode sweeps run at two prompt lengths, so equal batch sizes read different
contexts and the decode fit has its ``beta_kv`` column, as the controller's online
fit does; mixed steps are charged the same ``beta_kv``. Steps without it (an engine
that does not report it: ``kv_tokens = 0``) fit ``beta_kv = 0``.
"""

from __future__ import annotations

import datetime as dt
import itertools
import platform
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ebplus.controller import theory
from ebplus.controller.cost_fit import CostFit, CostModelFitter, robust_linear_fit
from ebplus.controller.cost_model import CostModel, HardwareProfile
from ebplus.controller.messages import Mode, StepKind, StepRecord, ThresholdUpdate
from ebplus.profiler.local_engine import LocalEngineControl


@dataclass(frozen=True)
class ProfilePlan:
    """What the profiler runs; the defaults take a few minutes for SmolLM2 on 2 CPU cores."""

    rounds: int = 3
    prefill_lengths: Sequence[int] = (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2000)
    #: (requests, prompt length) arriving together: one packed prefill step
    prefill_packs: Sequence[tuple[int, int]] = ((4, 200), (8, 120), (16, 40), (32, 50))
    decode_prompts: Sequence[int] = (32, 160)  # one decode sweep per prompt length per round
    decode_steps: int = 64  # max_tokens of the longest request in a decode sweep
    mixed_decodes: Sequence[int] = (4, 16, 48)
    mixed_prompts: Sequence[int] = (8, 32, 128, 512)
    mixed_repeats: int = 2
    seed: int = 0
    #: rounds added, one at a time, while a step kind still cannot be fitted: the lower envelope
    #: of a busy machine's steps can leave the mixed fit unusable after the planned rounds (one
    #: quick profile in six on a 2-core box with a second process busy; a quick CPU runbook in a
    #: clean-clone CI run still after two extra), and another repeat of every shape is what cleans
    #: it (a quick round is about a second)
    extra_rounds: int = 4


QUICK_PLAN = ProfilePlan(
    rounds=2,
    prefill_lengths=(16, 24, 32, 48, 64, 96, 128, 192, 256, 500),
    prefill_packs=((4, 40), (8, 20)),
    decode_prompts=(16,),
    decode_steps=24,
    mixed_decodes=(2, 8),
    mixed_prompts=(8, 24, 32, 64, 128, 200),
    mixed_repeats=2,
)


@dataclass
class Measurement:
    """The steps of a profiling run (as the scheduler's telemetry records them) and the engine's facts."""

    steps: list[StepRecord] = field(default_factory=list)
    kv_capacity_tokens: int = 0
    max_num_seqs: int = 0
    max_num_batched_tokens: int = 0
    device: str = ""
    seconds: float = 0.0


class _Driver:
    """Adds requests and runs single engine steps on an in-process ``LLM``."""

    def __init__(self, llm: Any, seed: int) -> None:
        from ebplus.profiler.local_engine import scheduler_of, vocab_size

        self.engine = llm.llm_engine
        self.scheduler = scheduler_of(llm)
        self.vocab = vocab_size(llm)
        self.max_len = int(self.engine.model_config.max_model_len)
        self.rng = random.Random(seed)
        self.ids = itertools.count()

    def add(self, prompt_len: int, max_tokens: int) -> str:
        from vllm import SamplingParams

        from ebplus.profiler.local_engine import random_prompt

        prompt_len = max(1, min(prompt_len, self.max_len - max_tokens))
        rid = f"profile-{next(self.ids)}"
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        self.engine.add_request(rid, random_prompt(self.rng, prompt_len, self.vocab), params)
        return rid

    def step(self) -> None:
        self.engine.step()

    def drain(self) -> None:
        while self.engine.has_unfinished_requests():
            self.engine.step()

    def all_decoding(self) -> bool:
        return not self.scheduler.waiting and not any(r.is_prefill_chunk for r in self.scheduler.running)


def _prefill_only(d: _Driver, plan: ProfilePlan, budget: int) -> None:
    for length in plan.prefill_lengths:
        d.add(min(length, budget), 1)
        d.drain()
    for count, length in plan.prefill_packs:
        for _ in range(max(1, min(count, budget // length))):
            d.add(length, 1)
        d.drain()


def _decode_only(d: _Driver, plan: ProfilePlan, n: int) -> None:
    for prompt in plan.decode_prompts:
        for i in range(n):  # staggered ends: the batch shrinks by one every few steps
            d.add(prompt, 2 + (plan.decode_steps - 2) * (i + 1) // n)
        d.drain()


def _mixed(d: _Driver, plan: ProfilePlan, n: int) -> None:
    for m in plan.mixed_decodes:
        # long-lived decodes (aborted below) while one prompt arrives before every step
        base = [d.add(16, min(512, d.max_len - 32)) for _ in range(min(m, n - 1))]
        while not d.all_decoding():
            d.step()
        for length in list(plan.mixed_prompts) * plan.mixed_repeats:
            d.add(length, 1)
            d.step()
        d.engine.abort_request(base)
        d.drain()


def measure(llm: Any, plan: ProfilePlan, log: Callable[[str], None] = lambda _: None) -> Measurement:
    """Run the plan on an in-process engine with the EB+ scheduler; return its step rows."""
    import time

    d = _Driver(llm, plan.seed)
    control = LocalEngineControl(d.scheduler)
    n = int(d.scheduler.max_num_seqs)
    control.apply(ThresholdUpdate(mode=Mode.MB, k=1, n=n))
    budget = int(d.scheduler.max_num_scheduled_tokens)
    # warm-up: the first forwards of a fresh engine are slow and are not what we measure
    d.add(64, 4)
    d.drain()
    control.drain()
    out = Measurement(max_num_seqs=n, max_num_batched_tokens=budget)
    start = time.monotonic()

    total = 0

    def one_round(r: int, planned: int) -> list[StepRecord]:
        nonlocal total
        rows: list[StepRecord] = []
        for name, part in (("prefill", _prefill_only), ("decode", _decode_only), ("mixed", _mixed)):
            part(d, plan, budget if name == "prefill" else n)
            rows += control.drain().steps
            log(f"round {r + 1}/{planned}: {name} steps done ({total + len(rows)} rows, {time.monotonic() - start:.0f} s)")
        total += len(rows)
        return rows

    out.steps = rounds_until_fitted(one_round, plan, log)
    out.seconds = time.monotonic() - start
    facts = control.drain().facts
    out.kv_capacity_tokens = facts.kv_capacity_tokens
    out.device = facts.device
    return out


def rounds_until_fitted(
    one_round: Callable[[int, int], list[StepRecord]], plan: ProfilePlan, log: Callable[[str], None] = lambda _: None
) -> list[StepRecord]:
    """The steps of ``plan.rounds`` rounds, then of one more at a time while :func:`fit_profile`
    cannot fit every step kind, up to ``plan.extra_rounds`` more: a profile the controller can use
    rather than an error after minutes of measuring. ``one_round(r, planned)`` runs round ``r``."""
    steps: list[StepRecord] = []
    for r in range(plan.rounds):
        steps += one_round(r, plan.rounds)
    for extra in range(plan.extra_rounds):
        try:
            fit_profile(steps)
            break
        except ValueError as exc:
            planned = plan.rounds + extra + 1
            log(f"{exc}; measuring one more round ({planned - plan.rounds} of at most {plan.extra_rounds} extra)")
            steps += one_round(planned - 1, planned)
    return steps


def _data_prior(steps: Sequence[StepRecord]) -> CostModel:
    """Unregularised robust fits per step kind: the fitter's prior (its regularisation target).

    A prior from the same rows keeps the fitter's pull towards the prior harmless;
    a prior from another machine would bias parts the rows determine poorly.
    """
    arr = np.asarray([(s.prefill_tokens, s.decode_tokens, s.seconds, s.kv_tokens) for s in steps], dtype=float)
    arr = arr.reshape(-1, 4)
    p, d, t, kv = arr.T
    ones = np.ones_like(t)

    def fit(
        mask: np.ndarray, columns: list[np.ndarray], lower: tuple, default: tuple, y: np.ndarray = t
    ) -> tuple[float, ...]:
        if mask.sum() < len(columns) + 1:
            return default
        design = np.column_stack([c[mask] for c in columns])
        return tuple(float(x) for x in robust_linear_fit(design, y[mask], lower=lower))

    alpha_p, beta_p = fit((d == 0) & (p > 0), [ones, p], (1e-6, 1e-9), (1e-2, 1e-4))
    decode = (p == 0) & (d > 0)
    if kv[decode].any():
        alpha_d, beta_d, beta_kv = fit(decode, [ones, d, kv], (1e-6, 1e-9, 0.0), (1e-2, 1e-4, 0.0))
    else:
        (alpha_d, beta_d), beta_kv = fit(decode, [ones, d], (1e-6, 1e-9), (1e-2, 1e-4)), 0.0
    mixed = (p > 0) & (d > 0)
    n = p + d
    r = np.divide(d, n, out=np.zeros_like(n), where=n > 0)
    flat = (alpha_p, beta_p, beta_d - beta_p, 0.0)  # no interference: beta_p (1 - r) + beta_d r
    columns = [ones, n, n * r, n * r * r]
    # mixed steps: the KV reads priced as in decode steps
    alpha_mb, *beta_mb = fit(mixed, columns, (1e-6, -np.inf, -np.inf, 0.0), flat, y=t - beta_kv * kv)
    if theory.beta_mb_min(beta_mb)[1] < 0:  # not a usable cost curve: CostModel would reject it
        alpha_mb, *beta_mb = flat
    return CostModel(
        alpha_p=alpha_p,
        beta_p=beta_p,
        alpha_d=alpha_d,
        beta_d=beta_d,
        beta_mb=tuple(beta_mb),
        alpha_mb=alpha_mb,
        beta_kv=beta_kv,
    )


def lower_envelope(steps: Sequence[StepRecord]) -> list[StepRecord]:
    """The fastest step of each shape (prefill tokens, decode tokens, KV tokens read).

    Other processes on the machine only ever add time to a step (a descheduled
    engine thread, a stalled OpenMP barrier: 3-30x slower steps were seen on a
    shared 2-core box), so the minimum over repeats of the same shape estimates
    the engine's own cost; a symmetric robust fit alone cannot undo one-sided
    contamination of a third of the samples.
    """
    best: dict[tuple[int, int, int], StepRecord] = {}
    for s in steps:
        key = (s.prefill_tokens, s.decode_tokens, s.kv_tokens)
        if key not in best or s.seconds < best[key].seconds:
            best[key] = s
    return list(best.values())


def fit_profile(steps: Sequence[StepRecord], min_steps: int = 10) -> CostFit:
    """The controller's cost fit over the lower envelope of profiling steps.

    Raises ``ValueError`` if a step kind could not be fitted.
    """
    steps = lower_envelope(steps)
    prior = _data_prior(steps)
    fitter = CostModelFitter(prior, window=max(len(steps), 16), min_steps=min_steps)
    for s in steps:
        fitter.observe_step(s.prefill_tokens, s.decode_tokens, s.seconds, kv_tokens=s.kv_tokens)
    fit = fitter.fit()
    missing = {"prefill", "decode", "mixed"} - set(fit.fitted)
    if missing:
        counts = f"{fit.n_prefill_steps} prefill, {fit.n_decode_steps} decode, {fit.n_mixed_steps} mixed steps"
        raise ValueError(f"could not fit {sorted(missing)} from {counts}: profile with more rounds")
    return fit


def residuals(model: CostModel, steps: Sequence[StepRecord]) -> dict[str, float]:
    """Median absolute relative error of the fitted model per step kind, over the lower envelope."""
    errs: dict[str, list[float]] = {}
    for s in lower_envelope(steps):
        pred = model.step_seconds(s.prefill_tokens, s.decode_tokens, s.kv_tokens)
        errs.setdefault(StepKind.of(s.prefill_tokens, s.decode_tokens).value, []).append(
            abs(pred - s.seconds) / s.seconds
        )
    return {k: float(np.median(v)) for k, v in sorted(errs.items())}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def build_profile(name: str, fit: CostFit, m: Measurement, model_name: str, engine_args: dict) -> HardwareProfile:
    """A :class:`HardwareProfile` (the simulator's YAML format) with its provenance in ``description``."""
    import vllm

    errors = residuals(fit.model, m.steps)
    device = m.device if m.device != "cpu" else f"cpu ({cpu_model()})"
    description = (
        f"Fitted by `ebplus profile` on {device}, {dt.date.today().isoformat()}: {model_name} on vLLM "
        f"{vllm.__version__}, engine {engine_args}. {fit.n_prefill_steps} prefill-only, {fit.n_decode_steps} "
        f"decode-only and {fit.n_mixed_steps} mixed step shapes (fastest of {len(m.steps)} steps in "
        f"{m.seconds:.0f} s, rounds interleaved), Huber fits (ebplus.controller.cost_fit.CostModelFitter); "
        "median relative error per kind: "
        + ", ".join(f"{k} {v:.1%}" for k, v in errors.items())
        + ". KV capacity = num_gpu_blocks x block_size of that engine."
    )
    return HardwareProfile(
        **fit.model.model_dump(), name=name, kv_capacity_tokens=m.kv_capacity_tokens, description=description
    )
