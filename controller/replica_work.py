"""The per-record and per-replica work of a fleet update, apart from :class:`~ebplus.controller.fleet.FleetController`'s
bookkeeping: what a batch's completions and steps do to the controller's state, and which replicas an update refits.

Each function takes a batch (or the fleet) whole, so the work is done per batch rather than per record: at
fleet scale (hundreds of replicas pushing tens of records each) the per-record Python cost is what bounds
ingestion (``docs/benchmarks/controller.md``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ebplus.controller import evidence
from ebplus.controller.estimator import WorkloadEstimator
from ebplus.controller.messages import CompletionRecord, EngineFacts, FinishReason, StepRecord
from ebplus.controller.stats import STEP_SECONDS_BUCKETS, Histogram

if TYPE_CHECKING:
    from ebplus.controller.fleet import ReplicaState

#: Cost-model refits one update makes at most (see :func:`refits`): a refit is the costliest part of a
#: replica's re-plan. Fleets of more than ``MAX_REFITS x cost_refit_every`` replicas (40 by default) refit
#: each replica less often than every ``cost_refit_every`` updates, the longest-unrefitted first.
MAX_REFITS = 4


def absorb_completions(
    received: Counter[str], workload: WorkloadEstimator, replica_id: str, records: Sequence[CompletionRecord]
) -> None:
    """Count a batch's validated completions and give the workload estimator those that say something
    about the natural length: an error says nothing; an abort censors it, and a cap is a departure known
    at admission (the departure model, ``ebplus.controller.departures``, treats each as what it is)."""
    if not records:
        return
    received["completions"] += len(records)
    kept = [r for r in records if r.finish is not FinishReason.ERROR and r.output_len >= 1]
    aborted = len(records) - len(kept) + sum(1 for r in kept if r.finish is FinishReason.ABORT)
    if aborted:
        received["aborted"] += aborted
    workload.observe_many(kept, replica_id)


def absorb_steps(received: Counter[str], replica: ReplicaState, records: Sequence[StepRecord], alpha: float) -> None:
    """A batch's validated steps into the replica's cost fitter, step-time histograms, concurrency EMA
    (weight ``alpha``) and offered-load count."""
    if not records:
        return
    received["steps"] += len(records)
    replica.steps_seen += len(records)
    replica.fitter.observe_records(records)
    c, hists = replica.concurrency, replica.step_seconds
    tokens = 0
    for rec in records:
        tokens += rec.prefill_tokens + rec.decode_tokens
        kind = rec.kind
        hist = hists.get(kind)
        if hist is None:
            hist = hists[kind] = Histogram(STEP_SECONDS_BUCKETS)
        hist.observe(rec.seconds)
        demand = float(rec.running + rec.waiting)
        c = demand if c is None else c + alpha * (demand - c)
    replica.concurrency = c
    replica.load_tokens += tokens


def plausible(rejected: Counter[str], facts: EngineFacts, records: list[CompletionRecord]) -> list[CompletionRecord]:
    """The completions a replica that declared ``facts`` can have produced: none longer, prompt and output
    together, than its ``max_model_len`` (the others counted ``implausible``)."""
    limit = facts.max_model_len
    if not limit or not records:
        return records
    kept = [r for r in records if r.input_len + r.output_len <= limit]
    if len(kept) < len(records):
        rejected["implausible"] += len(records) - len(kept)
    return kept


def fresh(rejected: Counter[str], replica: ReplicaState, cursor: str, records: list, start: int, dropped: int) -> list:
    """The records of one kind the controller does not have yet.

    ``start`` is the replica's running index of the batch's first record (-1: not
    tracked by this sender); records below the replica's cursor arrived before (a
    push that timed out at the replica and was delivered late) and are counted as
    ``duplicate``. The index passes the cursor only by records the replica's outbox
    dropped, which the batch reports (``dropped``); one that skips further (a corrupt
    or forged index) would make every later real record a duplicate: its records are
    rejected as ``cursor_jump`` and the cursor stays.
    """
    if start < 0:
        return records
    seen = getattr(replica, cursor)
    if seen >= 0 and start > seen + dropped:
        rejected["cursor_jump"] += len(records)
        return []
    skip = min(len(records), max(0, seen - start)) if seen >= 0 else 0
    if skip:
        rejected["duplicate"] += skip
    setattr(replica, cursor, max(seen, start + len(records)))
    return records[skip:]


def refits(replicas: Sequence[ReplicaState], update: int, every: int) -> set[str]:
    """The replicas whose cost model update number ``update`` refits: about 1/``every`` of the fleet
    (staggered by ordinal), none without a new step since its last refit (the fit would be the same), and
    at most :data:`MAX_REFITS`, the longest unrefitted first; and every replica never fitted."""
    first = {r.replica_id for r in replicas if r.cost is None}
    due = [
        r for r in replicas if r.cost is not None and (update + r.ordinal) % every == 0 and r.steps_seen != r.fitted_steps
    ]
    if len(due) > MAX_REFITS:
        due = sorted(due, key=lambda r: (r.fitted_at, r.ordinal))[:MAX_REFITS]
    return first | {r.replica_id for r in due}


def price_evidence(replicas: Sequence[ReplicaState], refit: set[str]) -> None:
    """Price, in one pass for the fleet (:func:`ebplus.controller.evidence.price_fleet`), the steps each
    replica's evidence gained since its last plan, under the cost model that plan measures them with: its
    current fit, for a replica this update does not refit (or fit a first time) and whose loop is closed."""
    evidence.price_fleet(
        (r.evidence, r.cost.model)
        for r in replicas
        if r.cost is not None and r.replica_id not in refit and r.planner.config.loop.enabled
    )
