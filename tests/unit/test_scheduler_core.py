"""The EB+ scheduler (replicas.scheduler) on a real vLLM ``Scheduler``, stepped without a model.

vLLM's own pattern (:mod:`vllm_scheduler`): a synthetic KV cache, a ``config.json``
written here, each step ``schedule()`` plus ``update_from_output()`` with sampled
tokens. What is checked is behaviour the stock scheduler's internals must keep
giving us: which requests a step computes, what it admits and preempts, what runs
after it, what the telemetry tap and the control channel report. The real-engine
tier (tests/engine/test_scheduler.py) proves the same on a model, with outputs.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm_scheduler import BLOCK, Driver, Step, make_scheduler, write_model

from ebplus.controller.messages import FinishReason, Mode, PhaseReport, StepKind, ThresholdUpdate, decode
from ebplus.replicas.scheduler import EBPlusAsyncScheduler

_versions = itertools.count(1)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(tmp_path_factory.mktemp("model"))


def thresholds(mode: str, k: int, n: int, active: str = "mb", **cut: int) -> ThresholdUpdate:
    return ThresholdUpdate(mode=Mode(mode), k=k, n=n, version=next(_versions), active=Mode(active), **cut)


def mixed_workload(driver: Driver) -> None:
    """Short and long prompts (chunked by the 64-token budget), short and long outputs."""
    driver.add(40, max_tokens=12, count=4)
    driver.add(100, max_tokens=6, count=2)
    driver.add(20, max_tokens=30, count=4)


def kinds(steps: list[Step]) -> set[StepKind]:
    return {s.kind for s in steps}


def token_steps(steps: list[Step], rid: str) -> list[int]:
    """The steps (indices) in which ``rid`` got an output token: a decode, or its prompt's last chunk."""
    return [i for i, s in enumerate(steps) if rid in s.decode or rid in s.finished or _last_chunk(steps, i, rid)]


def _last_chunk(steps: list[Step], i: int, rid: str) -> bool:
    return rid in steps[i].prefill and (i + 1 == len(steps) or rid not in steps[i + 1].prefill)


# -- phase decisions --------------------------------------------------------

KV = {"roomy": 1000, "kv-pressure": 14}


@pytest.mark.parametrize("blocks", KV.values(), ids=KV.keys())
@pytest.mark.parametrize("mode", ["mb", "auto", "shadow"])
def test_mb_at_max_num_seqs_is_the_stock_scheduler(model: Path, mode: str, blocks: int) -> None:
    # auto and shadow run MB until a controller says otherwise; with N = max_num_seqs nothing is hidden
    # and the cap is vLLM's: every step must be the stock one, chunking and preemption included
    stock = Driver(make_scheduler(model, Scheduler, num_blocks=blocks))
    ours = Driver(make_scheduler(model, num_blocks=blocks, mode=mode))
    for driver in (stock, ours):
        mixed_workload(driver)
    expected, got = stock.run(), ours.run()
    assert [(s.prefill, s.decode, s.admitted, s.preempted, s.running) for s in got] == [
        (s.prefill, s.decode, s.admitted, s.preempted, s.running) for s in expected
    ]
    assert StepKind.MIXED in kinds(got)  # MB puts prompt chunks beside the decodes
    assert any(s.preempted for s in got) is (blocks == KV["kv-pressure"])
    assert all(ours.output_len(r) == stock.output_len(r) == ours.requests[r].max_tokens for r in ours.requests)


EB = [
    pytest.param({"k": 2, "n": 4}, 1000, id="k2-n4"),
    pytest.param({"k": 1, "n": 8}, 1000, id="k1-n8"),
    pytest.param({"k": 8, "n": 8}, 1000, id="k8-n8"),
    pytest.param({"k": 3, "n": 6}, 14, id="k3-n6-kv-pressure"),
    pytest.param({"mode": "v0", "k": 4, "n": 8}, 14, id="v0-kv-pressure"),
]


@pytest.mark.parametrize(("settings", "blocks"), EB)
def test_eb_steps_are_prefill_only_or_decode_only(model: Path, settings: dict, blocks: int) -> None:
    driver = Driver(make_scheduler(model, num_blocks=blocks, **{"mode": "eb", **settings}))
    mixed_workload(driver)
    steps = driver.run()
    assert kinds(steps) == {StepKind.PREFILL, StepKind.DECODE}  # never mixed, never an empty step
    assert max(len(s.running) for s in steps) <= settings["n"]
    assert all(driver.output_len(r) == driver.requests[r].max_tokens for r in driver.requests)
    assert any(s.preempted for s in steps) is (blocks < 1000)
    stats = driver.control.drain().stats
    assert stats.steps_mixed == 0 and stats.steps_empty_busy == 0 and stats.kv_backoffs == 0


def test_eb_decodes_until_k_slots_are_free_then_refills_them(model: Path) -> None:
    driver = Driver(make_scheduler(model, mode="eb", k=2, n=4))
    first = [driver.add(16, max_tokens=t)[0] for t in (2, 3, 4, 5)]  # they finish one step apart
    later = driver.add(16, max_tokens=8, count=4)
    steps = [driver.step() for _ in range(4)]
    # nothing decoding: the whole batch is admitted at once, N of it
    assert steps[0].kind is StepKind.PREFILL and steps[0].admitted == tuple(first)
    assert steps[1].kind is StepKind.DECODE and steps[1].finished == (first[0],)
    # one slot free < k: still decoding, nothing admitted
    assert steps[2].kind is StepKind.DECODE and steps[2].admitted == () and steps[2].finished == (first[1],)
    # two slots free == k: a prefill-only step refills exactly them
    assert steps[3].kind is StepKind.PREFILL and steps[3].admitted == tuple(later[:2])
    assert steps[3].running == (*first[2:], *later[:2])
    rest = driver.run()
    assert max(len(s.running) for s in steps + rest) == 4


# -- admissions and the N cap -------------------------------------------------


@pytest.mark.parametrize(("mode", "active"), [("mb", "mb"), ("eb", "eb"), ("auto", "eb"), ("auto", "mb")])
def test_n_bounds_the_running_requests(model: Path, mode: str, active: str) -> None:
    # N below the start-up max_num_seqs is enforced by lowering vLLM's own admission cap
    driver = Driver(make_scheduler(model, max_num_seqs=8, mode=mode, n=8))
    driver.control.apply(thresholds(mode, k=2, n=3, active=active))
    driver.add(16, max_tokens=5, count=10)
    steps = driver.run()
    assert max(len(s.running) for s in steps) == 3  # reached, never passed
    assert sum(len(s.admitted) for s in steps) == 10


@pytest.mark.parametrize("mode", ["mb", "eb"])
def test_the_cap_holds_at_every_step_as_n_moves(model: Path, mode: str) -> None:
    # vLLM's own admission cap (its attribute moved in 0.31) is what N lowers for one step: admissions
    # stop at N whatever N was before, the start-up cap comes back after each step, and nothing
    # already running is preempted when N drops below it
    stock = Driver(make_scheduler(model, Scheduler, max_num_seqs=8))
    ours = Driver(make_scheduler(model, max_num_seqs=8, mode=mode, n=8))
    for driver in (stock, ours):
        driver.add(16, max_tokens=12, count=16)
    assert max(len(s.running) for s in stock.run()) == 8  # unbounded by N, the stock scheduler reaches 8
    reached: dict[int, int] = {}
    for n in [3] * 6 + [8] * 6 + [2] * 300:
        if not ours.scheduler.has_unfinished_requests():
            break
        ours.control.apply(thresholds(mode, k=1, n=n, active=mode))
        before = len(ours.running())
        step = ours.step()
        assert not step.preempted and len(step.running) <= max(n, before)
        if step.admitted:
            assert len(step.running) <= n, (n, step)
        reached[n] = max(reached.get(n, 0), len(step.running))
    assert not ours.scheduler.has_unfinished_requests()
    assert reached[3] == 3 and reached[8] == 8  # each cap is reached: raising N gives the room back
    assert sum(ours.output_len(r) for r in ours.requests) == 16 * 12


def test_lowering_n_below_the_running_count_preempts_nothing(model: Path) -> None:
    driver = Driver(make_scheduler(model, mode="mb"))
    running = [driver.add(8, max_tokens=t)[0] for t in range(4, 10)]
    waiting = driver.add(8, max_tokens=4, count=3)  # 8 x 8 prompt tokens fill the 64-token budget
    assert driver.step().admitted == tuple(running + waiting[:2])
    driver.control.apply(thresholds("mb", k=1, n=3))
    steps = driver.run()
    assert not any(s.preempted for s in steps)
    # the running requests drain below the new N before anything is admitted, then N holds
    first = next(i for i, s in enumerate(steps) if s.admitted)
    assert first > 0 and len(steps[first - 1].running) - len(steps[first - 1].finished) < 3
    assert steps[first].admitted == (waiting[2],)
    assert max(len(s.running) for s in steps[first:]) <= 3


# -- the restricted view and its restore ----------------------------------------


def test_a_prefill_phase_leaves_hidden_decodes_and_their_blocks_alone(model: Path) -> None:
    driver = Driver(make_scheduler(model, mode="eb", k=2, n=4))
    decoding = driver.add(16, max_tokens=20, count=2)
    driver.step()
    driver.step()
    held = {r: (driver.blocks(r), driver.output_len(r)) for r in decoding}
    prefilling = driver.add(96, max_tokens=4, count=2)  # 192 prompt tokens: three 64-token steps
    phase = [driver.step() for _ in range(3)]
    assert [s.kind for s in phase] == [StepKind.PREFILL] * 3
    assert all(not set(decoding) & (set(s.prefill) | set(s.decode)) for s in phase)
    assert {r: (driver.blocks(r), driver.output_len(r)) for r in decoding} == held
    # restored in admission order after every step: the newest last (vLLM preempts from the end)
    assert phase[0].running == (*decoding, prefilling[0]) and phase[-1].running == (*decoding, *prefilling)
    after = driver.step()
    assert after.kind is StepKind.DECODE and set(after.decode) == set(decoding + prefilling)


def test_a_failing_stock_schedule_still_restores_the_running_requests(
    model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    driver = Driver(make_scheduler(model, mode="eb", k=1, n=4))
    decoding = driver.add(16, max_tokens=6, count=2)
    driver.step()
    driver.add(16, max_tokens=6)  # the next step is prefill-only: the decodes are hidden from it

    def fails(self: Scheduler, *args: object, **kwargs: object) -> None:
        raise RuntimeError("stock schedule failed")

    with monkeypatch.context() as patch:
        patch.setattr(Scheduler, "schedule", fails)  # vLLM's, which ours calls once per step
        with pytest.raises(RuntimeError, match="stock schedule failed"):
            driver.step()
    assert driver.running() == tuple(decoding)
    driver.run()
    assert all(driver.output_len(r) == 6 for r in driver.requests)


def test_a_prefill_token_cut_applies_to_prefill_steps_and_is_lifted_after(model: Path) -> None:
    driver = Driver(make_scheduler(model, mode="eb", k=1, n=8, max_num_batched_tokens=64))
    driver.control.apply(thresholds("eb", k=1, n=8, prefill_tokens=16))
    driver.add(40, max_tokens=4, count=3)
    cut = driver.run()
    assert max(sum(s.prefill.values()) for s in cut) == 16
    driver.control.apply(thresholds("mb", k=1, n=8))
    driver.add(40, max_tokens=4, count=3)
    assert sum(driver.step().prefill.values()) == 64  # the engine's budget again


@pytest.mark.parametrize("bound", [0, 2])
def test_a_prefill_step_bound_interleaves_the_decoders_tokens(model: Path, bound: int) -> None:
    driver = Driver(make_scheduler(model, mode="eb", k=1, n=4, max_num_batched_tokens=32))
    driver.control.apply(thresholds("eb", k=1, n=4, prefill_steps=bound))
    decoding = driver.add(16, max_tokens=40, count=2)
    steps = [driver.step()]  # their prompts: each has its first token
    driver.add(160, max_tokens=2)  # five 32-token prefill steps
    steps += driver.run()
    assert StepKind.MIXED not in kinds(steps)
    longest = max(b - a for r in decoding for a, b in itertools.pairwise(token_steps(steps, r)))
    assert longest == (bound + 1 if bound else 6)  # unbounded: the decoders wait out the whole prompt


# -- KV pressure -------------------------------------------------------------------


def test_kv_pressure_preempts_the_newest_decode_and_resumes_it_in_a_prefill_step(model: Path) -> None:
    driver = Driver(make_scheduler(model, mode="eb", k=1, n=8, num_blocks=10))
    driver.add(32, max_tokens=20, count=3)  # 2 blocks each, 3 once they decode past 48 tokens
    steps = driver.run()
    preempted = [(i, r) for i, s in enumerate(steps) for r in s.preempted]
    assert [r for _, r in preempted] == ["r2"]  # the newest
    at, victim = preempted[0]
    assert steps[at].kind is StepKind.DECODE and victim not in steps[at].running
    resumed = next(i for i, s in enumerate(steps) if victim in s.admitted and i > at)
    # its recompute (prompt and outputs so far) is a prefill, in a prefill-only step
    assert steps[resumed].kind is StepKind.PREFILL and steps[resumed].prefill[victim] > 32
    assert all(driver.output_len(r) == 20 for r in driver.requests)
    stats = driver.control.drain().stats
    assert stats.preemptions == 1 and stats.steps_empty_busy == 0


@pytest.mark.parametrize(("blocks", "decoder_prompt"), [(8, 14), (9, 30)], ids=["prefill-victim", "decode-victim"])
def test_a_request_preempted_in_a_restricted_step_leaves_the_running_list(
    model: Path, blocks: int, decoder_prompt: int
) -> None:
    # a long prompt chunked over prefill steps, decode steps interleaved (prefill_steps=1): the decoders
    # grow into the blocks the prompt still needs, and a step that sees only one kind must preempt
    driver = Driver(make_scheduler(model, mode="eb", k=1, n=4, num_blocks=blocks, max_num_batched_tokens=16))
    driver.control.apply(thresholds("eb", k=1, n=4, prefill_steps=1))
    driver.add(decoder_prompt, max_tokens=40, count=2)
    driver.step()
    driver.add(64, max_tokens=4)
    victims = []
    while driver.scheduler.has_unfinished_requests():
        decoding = {r for r in driver.running() if driver.prompt_done(r)}
        step = driver.step()
        for victim in step.preempted:
            # the step's victim is of its own kind: a hidden request keeps its blocks
            assert (victim in decoding) is (step.kind is StepKind.DECODE) and victim not in step.running
            victims.append(victim)
        assert len(set(step.running)) == len(step.running)
    assert victims
    assert all(driver.output_len(r) == driver.requests[r].max_tokens for r in driver.requests)


def test_eb_enters_no_prefill_phase_while_the_next_request_cannot_fit(model: Path) -> None:
    # predictive back-off: the head of the queue needs more free KV than there is; decode on instead
    driver = Driver(make_scheduler(model, mode="eb", k=1, n=8, num_blocks=10))
    running = driver.add(32, max_tokens=6, count=3)
    head = driver.add(64, max_tokens=2)[0]  # 4 blocks; 10 - 3 x 2 = 4 free, until the decodes grow
    steps = driver.run()
    assert kinds(steps) == {StepKind.PREFILL, StepKind.DECODE}
    admitted_at = next(i for i, s in enumerate(steps) if head in s.admitted)
    assert all(r in steps[admitted_at - 1].finished for r in running)
    assert driver.control.drain().stats.kv_backoffs == 0


def test_a_prefill_step_that_admits_nothing_backs_off_until_a_request_finishes(
    model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # reactive back-off, for when the KV estimate is optimistic: here it is switched off (always "fits")
    scheduler = make_scheduler(model, mode="eb", k=1, n=8, num_blocks=10)
    monkeypatch.setattr(scheduler, "_head_fits", lambda: True)
    driver = Driver(scheduler)
    running = [driver.add(32, max_tokens=t)[0] for t in (4, 5, 6)]
    driver.add(80, max_tokens=2)  # 5 blocks: does not fit beside the three
    steps = driver.run()
    empty = [i for i, s in enumerate(steps) if s.kind is StepKind.IDLE]
    # one failed prefill step, then decoding until a request has finished, then one more try per finish
    assert len(empty) == len(running) - 1
    for i in empty[1:]:
        assert any(s.finished for s in steps[empty[0] : i])
    assert all(steps[i + 1].kind is StepKind.DECODE for i in empty)
    stats = driver.control.drain().stats
    assert stats.kv_backoffs == len(empty) == stats.steps_empty_busy


def test_a_request_vllm_holds_back_counts_as_waiting(model: Path) -> None:
    driver = Driver(make_scheduler(model, mode="eb", k=1, n=4))
    driver.add(16, max_tokens=6, count=2)
    driver.step()
    held = driver.add(16, max_tokens=6, held=True)[0]
    steps = [driver.step() for _ in range(3)]
    assert all(s.waiting == 1 for s in steps) and driver.control.drain().waiting_total == 1
    # EB sees it waiting and tries to admit it; vLLM starts nothing, so the phase backs off
    assert [s.kind for s in steps] == [StepKind.IDLE, StepKind.DECODE, StepKind.DECODE]
    driver.abort(held)
    driver.run()
    report = driver.control.drain()
    assert report.stats.kv_backoffs == 1 and report.waiting_total == 0
    assert {r.seq: (r.output_len, r.finish) for r in report.completions}[2] == (0, FinishReason.ABORT)


@pytest.mark.parametrize("mode", ["mb", "eb"])
def test_a_skipped_request_is_tracked_then_admitted_once_released(model: Path, mode: str) -> None:
    # vLLM passes over a held request and admits those behind it; it stays queued (0.29, 0.30: in a
    # queue of its own; from 0.31 in place, marked) and counted as waiting until the hold lifts
    driver = Driver(make_scheduler(model, mode=mode, k=2, n=4))
    held = driver.add(16, max_tokens=4, held=True)[0]
    behind = driver.add(16, max_tokens=4, count=2)
    first = driver.step()
    assert first.admitted == tuple(behind) and first.running == tuple(behind)
    assert first.waiting == 1 and driver.skipped() == (held,) and driver.control.drain().waiting_total == 1
    steps = [driver.step() for _ in range(2)]
    assert all(held not in s.admitted and s.waiting == 1 for s in steps) and driver.skipped() == (held,)
    driver.release(held)
    rest = driver.run()
    assert held in {r for s in rest for r in s.admitted} and driver.output_len(held) == 4
    assert driver.skipped() == () and driver.waiting() == 0 and driver.control.drain().waiting_total == 0


# -- the telemetry tap ---------------------------------------------------------------


def test_every_leaving_request_is_recorded_once_with_its_lengths_and_reason(model: Path) -> None:
    driver = Driver(make_scheduler(model, mode="mb", max_num_seqs=4, max_model_len=64))
    capped = driver.add(20, max_tokens=5)[0]
    stopped = driver.add(24, max_tokens=50, stop_after=3)[0]  # also capped by the model length: 64 - 24
    aborted_running = driver.add(28, max_tokens=50)[0]
    driver.add(16, max_tokens=50, count=1)
    aborted_waiting = driver.add(12, max_tokens=50)[0]  # the fifth: N = 4 keeps it queued
    for _ in range(3):  # the third step samples the stop token: a slot frees only after it
        driver.step()
    driver.abort(aborted_running, aborted_waiting)
    driver.run()
    report = driver.control.drain()
    records = {record.seq: record for record in report.completions}
    assert len(report.completions) == len(records) == 5
    expected = {
        0: (20, 5, FinishReason.LENGTH, 5),
        1: (24, 3, FinishReason.STOP, 40),
        2: (28, 2, FinishReason.ABORT, 36),
        3: (16, 48, FinishReason.LENGTH, 48),
        4: (12, 0, FinishReason.ABORT, 50),
    }
    assert {s: (r.input_len, r.output_len, r.finish, r.max_tokens) for s, r in records.items()} == expected
    assert records[4].ttft_s == 0 and all(records[s].ttft_s > 0 for s in range(4))
    assert [driver.output_len(r) for r in (capped, stopped, aborted_running)] == [5, 3, 2]
    assert driver.control.drain().completions == []  # handed over once


def test_step_records_and_facts_match_what_the_scheduler_did(model: Path) -> None:
    driver = Driver(make_scheduler(model, mode="mb", num_blocks=12, max_num_batched_tokens=32))
    mixed_workload(driver)
    steps, past_prompt = [], False
    while driver.scheduler.has_unfinished_requests():
        done = {r for r in driver.running() if driver.prompt_done(r)}
        steps.append(driver.step())
        # a resumed request's recompute chunked past its prompt: still prefill
        past_prompt |= bool(done & set(steps[-1].prefill))
        if len(steps) == 20:
            report = driver.control.drain()
            assert report.running_total == len(driver.running()) and report.waiting_total == driver.waiting()
            assert sorted(r.age for r in report.running) == sorted(driver.output_len(r) for r in driver.running())
    report2 = driver.control.drain()
    assert past_prompt and any(s.preempted for s in steps)
    # the first two timed steps are withheld (warm-up)
    assert [
        (r.prefill_tokens, r.decode_tokens, r.running, r.waiting, r.kv_tokens) for r in report.steps + report2.steps
    ] == [(sum(s.prefill.values()), sum(s.decode.values()), len(s.running), s.waiting, s.context) for s in steps[2:]]
    assert report2.stats.steps_warmup == 2 and report2.stats.preemptions == sum(len(s.preempted) for s in steps)
    facts = report2.facts
    assert (facts.kv_capacity_tokens, facts.block_size, facts.max_num_seqs, facts.max_num_batched_tokens) == (
        12 * BLOCK,
        BLOCK,
        8,
        32,
    )
    assert facts.max_model_len == 512  # the controller rejects completions longer than that


# -- run-time control --------------------------------------------------------------


def test_auto_switches_between_mb_and_eb_at_the_next_step(model: Path) -> None:
    driver = Driver(make_scheduler(model, mode="auto", k=2, n=8))
    assert driver.control.applied().active is Mode.MB  # auto starts in MB

    def traffic(steps: int) -> list[Step]:
        done = []
        for _ in range(steps):
            driver.add(24, max_tokens=6)
            done.append(driver.step())
        return done

    assert StepKind.MIXED in kinds(traffic(12))
    update = thresholds("auto", k=2, n=8, active="eb")
    assert driver.control.apply(update) == update
    eb = traffic(12)
    assert StepKind.MIXED not in kinds(eb) and {StepKind.PREFILL, StepKind.DECODE} <= kinds(eb)
    # switch back right after a prefill step that kept decoders waiting
    while not (eb[-1].kind is StepKind.PREFILL and set(eb[-1].running) - set(eb[-1].prefill)):
        eb += traffic(1)
        assert len(eb) < 50
    driver.control.apply(thresholds("auto", k=2, n=8, active="mb"))
    mb = traffic(12)
    assert mb[0].kind is StepKind.DECODE  # the decoders' token before the first mixed step
    assert StepKind.MIXED in kinds(mb)
    assert driver.control.applied().version == update.version + 1


def test_the_phase_board_reports_the_window_the_engine_is_in(model: Path) -> None:
    driver = Driver(make_scheduler(model, mode="eb", k=2, n=4))

    def board() -> PhaseReport:
        return decode(driver.scheduler.ebplus_board(), PhaseReport)

    first = [driver.add(16, max_tokens=t)[0] for t in (2, 3, 9, 9)]  # the first two finish a step apart
    driver.add(40, max_tokens=8, count=3)
    idle = board()
    assert (idle.mode, idle.running, idle.waiting, idle.prefill_tokens) == (Mode.EB, 0, 7, 4 * 16 + 3 * 40)
    assert (idle.n, idle.k, idle.kv_tokens, idle.decode_step_s, idle.mean_output) == (4, 2, 0, 0.0, 0.0)
    assert driver.step().kind is StepKind.PREFILL
    full = board()
    assert (full.running, full.waiting, full.prefill_tokens, full.prefilling) == (4, 3, 3 * 40, True)
    assert full.kv_tokens == 4 * 16
    assert driver.step().kind is StepKind.DECODE  # the first leaves: one slot free < k
    decoding = board()
    assert (decoding.prefilling, decoding.running, decoding.freed) == (False, 3, 1)
    assert decoding.decode_step_s > 0 and decoding.mean_output == 2
    assert driver.step().finished == (first[1],)
    assert board().freed == 2  # k left: the next step opens a window


def test_a_staggered_engine_reports_when_its_timer_opens_the_next_window(model: Path) -> None:
    driver = Driver(make_scheduler(model, mode="eb", k=2, n=4))
    board = decode(driver.scheduler.ebplus_board(), PhaseReport)
    assert board.slot_at is None  # not staggered
    driver.control.apply(thresholds("eb", k=2, n=4, active="eb").replace(stagger_period_s=0.5, stagger_phase=0.25))
    driver.add(16, max_tokens=9, count=2)
    driver.step()  # a prefill window opens and admits both: the timer's next slot is ahead
    board = decode(driver.scheduler.ebplus_board(), PhaseReport)
    assert board.slot_at is not None and board.read_at <= board.slot_at <= board.read_at + 0.5
    assert (board.slot_at / 0.5 - 0.25) % 1 == pytest.approx(0, abs=1e-6) or board.slot_at == board.read_at
    driver.control.apply(thresholds("mb", k=2, n=4))
    assert decode(driver.scheduler.ebplus_board(), PhaseReport).slot_at is None  # MB has no windows


def test_apply_clamps_to_the_engine_and_rejects_what_it_cannot_read(model: Path) -> None:
    driver = Driver(make_scheduler(model, mode="eb", k=2, n=4, max_num_seqs=8))
    applied = driver.control.apply(thresholds("eb", k=12, n=16))
    assert (applied.n, applied.k) == (8, 8)  # N only lowers the start-up max_num_seqs; k <= N
    assert driver.control.applied() == applied
    with pytest.raises(ValueError):
        driver.scheduler.ebplus_apply(b"not a threshold update")
    assert driver.control.applied() == applied


def test_an_async_engine_gets_the_async_variant_running_the_same_policy(model: Path) -> None:
    scheduler = make_scheduler(model, async_scheduling=True, mode="eb", k=2, n=4)
    assert isinstance(scheduler, EBPlusAsyncScheduler) and isinstance(scheduler, AsyncScheduler)
    driver = Driver(scheduler)
    mixed_workload(driver)
    steps = driver.run()
    assert kinds(steps) == {StepKind.PREFILL, StepKind.DECODE}
    assert max(len(s.running) for s in steps) == 4
    assert all(driver.output_len(r) == driver.requests[r].max_tokens for r in driver.requests)


@pytest.mark.parametrize("blocks", KV.values(), ids=KV.keys())
def test_eb_with_a_step_in_flight_still_never_mixes(model: Path, blocks: int) -> None:
    # async scheduling: the next step is scheduled while the previous one's tokens are outstanding
    driver = Driver(make_scheduler(model, async_scheduling=True, num_blocks=blocks, mode="eb", k=2, n=4))
    mixed_workload(driver)
    driver.run_pipelined()
    assert all(driver.output_len(r) == driver.requests[r].max_tokens for r in driver.requests)
    stats = driver.control.drain().stats
    assert stats.steps_mixed == 0 and stats.steps_prefill > 0 and stats.steps_decode > 0
    assert (stats.preemptions > 0) is (blocks == KV["kv-pressure"])
