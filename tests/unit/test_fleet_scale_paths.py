"""The fleet-scale fast paths give what the straightforward paths gave, record for record.

Validation of a whole batch, bulk absorption, the estimator's window without sorting, the
cost fitter's ring windows, the refits an update skips: each is checked against a plain
reference (the code they replaced) on random inputs, so the simulator's results (which run the same controller)
cannot drift through them.
"""

from __future__ import annotations

import json
import math
from collections import Counter, deque

import msgspec
import numpy as np
import pytest
from factories import PRIOR, batch, registration
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ebplus.controller import persistence, replica_work
from ebplus.controller.config import ControllerConfig
from ebplus.controller.cost_fit import CostModelFitter, _Window
from ebplus.controller.estimator import WorkloadEstimator
from ebplus.controller.evidence import _Ledger
from ebplus.controller.fleet import FleetController
from ebplus.controller.messages import CompletionRecord, FinishReason, RunningRequest, StepRecord
from ebplus.controller.telemetry import intake

# -- validation ----------------------------------------------------------------------------

ints = st.one_of(
    st.integers(min_value=-3, max_value=60),
    st.sampled_from([0, 1, 10**7, 10**7 + 1, 2**62, 2**62 + 1, 10**11 + 1]),
    st.just(True),
    st.just(3.0),
    st.just(2.5),
    st.just(math.nan),
    st.none(),
)
floats = st.one_of(st.floats(min_value=-1, max_value=700), st.just(math.inf), st.just(math.nan), st.just(2), st.none())
finishes = st.one_of(st.sampled_from(list(FinishReason)), st.sampled_from(["stop", "abort", "nope"]), st.none())
good_completion = st.builds(
    CompletionRecord,
    st.integers(1, 5000),
    st.integers(1, 5000),
    st.sampled_from(list(FinishReason)),
    st.integers(-1, 10**6),
    st.integers(0, 5000),
    st.integers(0, 5000),
).map(  # plausible too: no more output than its max_tokens (0: unknown), no more cached than its prompt
    lambda r: msgspec.structs.replace(
        r, max_tokens=r.max_tokens and max(r.max_tokens, r.output_len), cached_tokens=min(r.cached_tokens, r.input_len)
    )
)
any_completion = st.builds(CompletionRecord, ints, ints, finishes, ints, ints, ints)


#: Values at and just past every bound a check applies, and of every wrong type.
edges = st.sampled_from([-2, -1, 0, 1, 10**7, 10**7 + 1, 2**62, 2**62 + 1, 10**11, 10**11 + 1, True, 2.0, 0.0, -0.5,
                         600.0, 600.5, math.inf, math.nan, None, "stop", "x"])  # fmt: skip


def _one_field_off(good: st.SearchStrategy, kind: type, values: st.SearchStrategy) -> st.SearchStrategy:
    """A valid record with one field replaced: the records a batch check is most likely to get wrong."""
    fields = st.sampled_from(kind.__struct_fields__)
    return st.tuples(good, fields, values).map(lambda t: t[0].replace(**{t[1]: t[2]}) if hasattr(t[0], "replace")
                                               else msgspec.structs.replace(t[0], **{t[1]: t[2]}))  # fmt: skip
good_step = st.builds(
    StepRecord, st.integers(0, 9000), st.integers(1, 900), st.integers(0, 900), st.integers(0, 900),
    st.floats(1e-4, 5.0), st.integers(0, 10**6),
)  # fmt: skip
any_step = st.builds(StepRecord, ints, ints, ints, ints, floats, ints)
good_running = st.builds(
    RunningRequest, st.integers(0, 10**6), st.integers(1, 5000), st.integers(0, 5000), st.integers(0, 5000),
    st.integers(0, 5000),
)  # fmt: skip
any_running = st.builds(RunningRequest, ints, ints, ints, ints, ints)


#: The batch field that carries each kind of record.
FIELD = {CompletionRecord: "completions", StepRecord: "steps", RunningRequest: "running"}


def _received(records: list, kind: type) -> tuple[list, Counter]:
    """What the intake keeps of one batch of ``records``, and what it counts."""
    rejected: Counter[str] = Counter()
    got = intake(batch("r0", **{FIELD[kind]: records}), rejected)
    assert got is not None
    return getattr(got, FIELD[kind]), rejected


def _one_by_one(records: list, kind: type) -> tuple[list, Counter]:
    """The same records sent one per batch: no record can affect another's fate."""
    kept: list = []
    rejected: Counter[str] = Counter()
    for record in records:
        got, why = _received([record], kind)
        kept += got
        rejected += why
    return kept, rejected


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(
        [
            (CompletionRecord, good_completion, _one_field_off(good_completion, CompletionRecord, edges)),
            (CompletionRecord, good_completion, any_completion),
            (StepRecord, good_step, _one_field_off(good_step, StepRecord, edges)),
            (StepRecord, good_step, any_step),
            (RunningRequest, good_running, _one_field_off(good_running, RunningRequest, edges)),
            (RunningRequest, good_running, any_running),
        ]
    ),
    st.data(),
)
def test_batch_validation_accepts_and_rejects_exactly_as_record_by_record(case, data) -> None:
    """The strict decode of a whole batch, and the lenient one of a batch that fails it, keep and count
    what each record alone would get."""
    kind, good, anything = case
    records = data.draw(st.lists(st.one_of(good, good, good, anything), max_size=12) | st.lists(anything, max_size=2))
    assert _received(records, kind) == _one_by_one(records, kind)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from([(CompletionRecord, good_completion), (StepRecord, good_step), (RunningRequest, good_running)]),
       st.data())  # fmt: skip
def test_valid_records_arrive_as_sent(case, data) -> None:
    kind, good = case
    records = data.draw(st.lists(good, max_size=12))
    assert _received(records, kind) == (records, Counter())


EDGE_VALUES = [-2, -1, 0, 1, 10**7, 10**7 + 1, 2**62, 2**62 + 1, 10**11, 10**11 + 1, True, 2.0, 0.0, -0.5, 600.0,
               600.5, math.inf, math.nan, None, "stop", "x", FinishReason.ABORT, FinishReason.LENGTH]  # fmt: skip
GOOD = [
    CompletionRecord(10, 5, FinishReason.STOP, 1, 20, 2),
    CompletionRecord(10, 5, FinishReason.ERROR, 1, 20, 2),
    StepRecord(100, 50, 50, 3, 0.02, 700),
    StepRecord(0, 50, 50, 3, 0.02, 700),
    RunningRequest(4, 10, 3, 20, 2),
]


@pytest.mark.parametrize("good", GOOD)
def test_batch_validation_agrees_on_every_field_at_every_edge(good: object) -> None:
    kind = type(good)
    for name in kind.__struct_fields__:
        for value in EDGE_VALUES:
            records = [good, msgspec.structs.replace(good, **{name: value})]
            assert _received(records, kind) == _one_by_one(records, kind), (name, value)


# -- the estimator's window ----------------------------------------------------------------


def _reference_sample(est: WorkloadEstimator) -> tuple:
    """The window as the estimator computed it before the fleet-scale change (sorting every replica)."""
    live = [w for w in est._replicas.values() if w.done or w.running]
    share = max(1, math.ceil(est.window / max(len(live), 1)))
    rows = []
    for w in live:
        seqs = sorted(w.done)
        lo = seqs[-share] - 1 if len(seqs) >= share else -1
        rows += [("done", seq, rec.output_len) for seq, rec in w.done.items() if seq > lo]
        rows += [("run", r.seq, r.age) for r in w.running if r.seq > lo and r.seq not in w.done]
    return tuple(rows)


def _sample_rows(est: WorkloadEstimator) -> tuple:
    s = est.sample()
    return tuple(zip(s.durations.tolist(), s.running.tolist(), s.weights.tolist(), strict=True))


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31), st.integers(1, 6), st.sampled_from([10, 37, 500]))
def test_the_window_is_the_one_sorting_found(seed: int, replicas: int, window: int) -> None:
    """Completions out of admission order, several replicas, trimming: same requests, same order."""
    rng = np.random.default_rng(seed)
    fast = WorkloadEstimator(window=window, update_every=1, min_samples=1)
    slow = WorkloadEstimator(window=window, update_every=1, min_samples=1)
    for step in range(30):
        rid = f"r{rng.integers(replicas)}"
        first = int(rng.integers(0, 3000))
        recs = [CompletionRecord(10, int(o), FinishReason.STOP, first + int(j)) for j, o in
                enumerate(rng.integers(1, 300, rng.integers(1, 60)))]  # fmt: skip
        fast.observe_many(recs, rid)
        for rec in recs:
            slow.observe(rec, rid)
        running = [RunningRequest(seq=int(q), input_len=5, age=int(q) % 7) for q in rng.integers(0, 3200, 20)]
        fast.observe_running(rid, running, 40)
        slow.observe_running(rid, running, 40)
        if step % 5 == 4:
            got = fast.sample()
            assert tuple(got.durations.tolist()) == tuple(r[2] for r in _reference_sample(slow))
            assert _sample_rows(fast) == _sample_rows(slow)
    assert fast.completions == slow.completions and list(fast._inputs) == list(slow._inputs)


def test_a_restored_window_gives_the_same_estimate_whatever_older_records_a_state_holds() -> None:
    """States written before the fleet-scale change kept ``window`` records per replica, not the
    replica's share of the window: they load, and the extra records change nothing."""
    rng = np.random.default_rng(3)
    est = WorkloadEstimator(window=100, update_every=10, min_samples=10)
    for r in range(4):
        recs = [CompletionRecord(20, int(o), FinishReason.STOP, i) for i, o in enumerate(rng.geometric(0.02, 300))]
        est.observe_many(recs, f"r{r}")
    slim = est.state()
    assert all(len(w.done) == 25 for w in slim.replicas.values())  # the window: 100 over 4 replicas
    fat = est.state()
    for rid, w in fat.replicas.items():
        w.done = dict(est._replicas[rid].done)  # everything held, as the old state() kept
    estimates = []
    for state in (slim, fat):
        again = WorkloadEstimator(window=100, update_every=10, min_samples=10)
        again.restore(persistence.parse(json.loads(_state_json(state))).workload)
        estimates.append(again.update())
    assert estimates[0].mu_o == estimates[1].mu_o and estimates[0].p0 == estimates[1].p0


def _state_json(workload: object) -> str:
    fc = FleetController(ControllerConfig())
    state = fc.state().model_copy(update={"workload": workload})
    return state.model_dump_json()


# -- the cost fitter -----------------------------------------------------------------------


@given(st.lists(st.integers(0, 9), max_size=40), st.integers(1, 7))
def test_ring_window_holds_what_a_bounded_deque_holds(sizes: list[int], size: int) -> None:
    ring, ref, n = _Window(size, 2), deque(maxlen=size), 0
    for k in sizes:
        rows = [(n + i, 0.5 * (n + i)) for i in range(k)]
        n += k
        ring.extend(rows)
        ref.extend(rows)
        assert len(ring) == len(ref)
        assert ring.rows().tolist() == [list(map(float, r)) for r in ref]


def test_bulk_observation_is_per_step_observation() -> None:
    rng = np.random.default_rng(5)
    one, bulk = CostModelFitter(PRIOR, window=256), CostModelFitter(PRIOR, window=256)
    records = []
    for _ in range(700):
        p, d = int(rng.integers(0, 4000)) * int(rng.random() < 0.4), int(rng.integers(0, 300))
        if p + d == 0:
            continue
        records.append(StepRecord(p, d, d, 0, 1e-3 + 1e-5 * p + 2e-5 * d + float(rng.normal(0, 1e-4)) ** 2, 10 * d))
    for rec in records:
        one.observe_step(rec.prefill_tokens, rec.decode_tokens, rec.seconds, rec.kv_tokens)
    bulk.observe_records(records)
    assert bulk.fit() == one.fit()


# -- re-plans ------------------------------------------------------------------------------


def _fleet(replicas: int, **config: object) -> FleetController:
    fc = FleetController(ControllerConfig(update_every=10**9, first_update=10**9, **config))
    for r in range(replicas):
        fc.register(registration(f"r{r}", kv_capacity_tokens=2_000_000, max_num_seqs=1024))
    return fc


def _push(fc: FleetController, rid: str, rng: np.random.Generator) -> None:
    comps = [CompletionRecord(100, int(o), FinishReason.STOP) for o in rng.geometric(1 / 50, 40)]
    steps = [StepRecord(int(p) * (i % 4 == 0), 300, 300, 10, 0.01 + 1e-6 * int(p) * (i % 4 == 0) + 1e-5 * (i % 3))
             for i, p in enumerate(rng.integers(100, 2000, 40))]  # fmt: skip
    fc.ingest(batch(rid, comps, steps))


def test_refits_skip_replicas_with_no_new_step_and_are_capped_per_update(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(1)
    monkeypatch.setattr(replica_work, "MAX_REFITS", 3)
    fc = _fleet(12, cost_refit_every=1)
    for r in range(12):
        _push(fc, f"r{r}", rng)
    fc.recompute("first")  # every replica's first fit (not capped: it has none)
    fitted: list[str] = []
    for replica in fc.replicas.values():
        fit = replica.fitter.fit

        def counting(fit=fit, rid=replica.replica_id):  # type: ignore[no-untyped-def]
            fitted.append(rid)
            return fit()

        monkeypatch.setattr(replica.fitter, "fit", counting)
    fc.recompute("nothing new")
    assert fitted == []  # the same steps would give the same fit
    rounds = []
    for _ in range(4):
        for r in range(12):
            _push(fc, f"r{r}", rng)  # every replica has new steps each time: all due, three refitted
        fitted.clear()
        fc.recompute("new steps")
        rounds.append(list(fitted))
    assert all(len(r) == 3 for r in rounds)  # capped
    assert set().union(*map(set, rounds)) == set(fc.replicas)  # the longest-unrefitted first: all in turn


# -- the evidence ledger -------------------------------------------------------------------


class _RowByRowLedger:
    """The per-mode step ledger as it was written before the fleet-scale change: one row per step."""

    def __init__(self, capacity: int) -> None:
        self.rows = np.zeros((capacity, 6))
        self.size = self.head = self.total = self.phases = 0
        self.in_prefill = False

    def add(self, records: list[StepRecord]) -> int:
        added, cap = 0, self.rows.shape[0]
        for rec in records:
            if rec.prefill_tokens + rec.decode_tokens <= 0:
                continue
            prefill_only = rec.decode_tokens == 0
            starts = prefill_only and not self.in_prefill
            self.phases += starts
            self.in_prefill = prefill_only
            self.rows[self.head] = (rec.prefill_tokens, rec.decode_tokens, rec.kv_tokens, rec.seconds, rec.running,
                                    starts)  # fmt: skip
            self.head = (self.head + 1) % cap
            self.size = min(self.size + 1, cap)
            added += 1
        self.total += added
        return added


@pytest.mark.parametrize("capacity", [1, 3, 7, 64])
def test_the_evidence_ledger_written_a_batch_at_a_time_holds_what_row_by_row_writing_held(capacity: int) -> None:
    rng = np.random.default_rng(capacity)
    fast, slow = _Ledger(capacity), _RowByRowLedger(capacity)
    for _ in range(200):
        recs = [StepRecord(int(rng.integers(0, 3)) * 100, int(rng.integers(0, 3)) * 10, 5, 0, float(rng.random()),
                           int(rng.integers(0, 50))) for _ in range(int(rng.integers(0, 3 * capacity + 2)))]  # fmt: skip
        assert fast.add(recs) == slow.add(recs)
        assert (fast.rows == slow.rows).all()
        assert (fast.head, fast.size, fast.total, fast.phases, fast.in_prefill) == (
            slow.head, slow.size, slow.total, slow.phases, slow.in_prefill)  # fmt: skip


# -- the fleet's evidence priced at once ------------------------------------------------------


def _fleet_plans(seed: int) -> list:
    """Plans of three replicas of different models over a few updates, a deterministic clock and traffic."""
    from ebplus.controller.cost_model import CostModel
    from ebplus.controller.messages import Mode

    rng = np.random.default_rng(seed)
    ticks = iter(range(10**6))
    fc = FleetController(ControllerConfig(first_update=10**9), clock=lambda: 100.0 + next(ticks))
    for i in range(3):
        prior = CostModel(alpha_p=1e-3 * (1 + i), beta_p=2e-5, alpha_d=8e-3, beta_d=4e-5 / (1 + i),
                          beta_mb=(2e-5, 5e-5, 1e-5), beta_kv=1e-9 * i)  # fmt: skip
        fc.register(registration(f"r{i}", mode=Mode.AUTO, max_num_seqs=256, prior=prior))
    plans, seq = [], 0
    for _ in range(8):
        for i in range(3):
            kinds = np.arange(48) % 6  # prefill phases between decode runs, a few mixed steps
            steps = [StepRecord(int(p) if k < 2 else 0, int(d) if k >= 1 else 0, int(d), 3, float(s), int(d) * 700)
                     for k, p, d, s in zip(kinds, rng.integers(256, 8192, 48), rng.integers(8, 256, 48),
                                           rng.random(48) * 0.05 + 0.01, strict=True)]  # fmt: skip
            outs = rng.geometric(1 / 200, 20)
            comps = [CompletionRecord(512, int(o), FinishReason.STOP, seq=seq + j) for j, o in enumerate(outs)]
            seq += 20
            fc.ingest(batch(f"r{i}", comps, steps, applied_version=1 << 40))
        fc.recompute("test")
        plans.append([(r.planner.last, r.current) for r in fc.replicas.values()])
    return plans


def test_evidence_priced_for_the_fleet_at_once_makes_the_plans_priced_one_replica_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    at_once = _fleet_plans(3)
    assert all(plan.judgement.mb.measured is not None for plan, _ in at_once[-1])  # the evidence is priced
    monkeypatch.setattr(replica_work, "price_evidence", lambda replicas, refit: None)
    assert _fleet_plans(3) == at_once
