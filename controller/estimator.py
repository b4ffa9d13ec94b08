"""The online workload estimator: what the closed forms need of the traffic, from finished *and* running requests.

The controller's workload estimate (``p0``, ``eta``, ``mu_L``, ``mu_O``) used to
come from a window of the last completions. That window is biased exactly when it
matters: at a cold start it holds the first cohort's *shortest* requests (the long
ones are still running), after a shift to longer outputs it lags in the unsafe
direction for N*, and under ``vllm bench serve --ignore-eos`` (every request ends at
its cap) it held no natural stop at all and the fit collapsed.

The window here is defined by *admission*: per replica, the requests with the most
recent admission sequence numbers, finished or still running. A request's
admission does not depend on its length, so censoring a running one at its age is
independent of its length - the condition under which censored maximum likelihood
(Kaplan-Meier, and the fit in :mod:`ebplus.controller.departures`) is unbiased.
Replicas report their running requests' ages and caps with each telemetry push
(a bounded, evenly spaced sample, weighted up to the running count).

The :class:`Estimate` carries the departure model (which family was fitted and how
well it fits) and the two hazard parameters the closed forms consume:

* where the natural lengths follow a linear hazard from the first token (``t0 = 0``)
  and caps seldom bind, the fitted ``(p0, eta)``;
* otherwise (a minimum length, departures dominated by caps, a family that does not
  fit) the constant-hazard equivalent of the *realized* departures, ``p0 = 1/E[D]``,
  ``eta = 0``: the long-run rate at which a slot frees, which is what the CFR
  threshold balances, and what kept online EB within 2% of the best fixed k on the
  +-50% workloads before (their linear fit from 0 fails and fell back to it).

``mu_o`` is the mean realized output ``E[min(O, cap)]``; ``mu_l`` counts the prompt
tokens actually computed (prompt minus prefix-cache hits), as prefill cost and the
KV a request holds of its own do.
"""

from __future__ import annotations

import bisect
import itertools
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ebplus.controller import departures, theory
from ebplus.controller.messages import CompletionRecord, FinishReason, RunningRequest

Clock = Callable[[], float]

#: Goodness of fit (KS distance) above which the linear hazard is not used for theta.
GOF_LIMIT = 0.1
#: Share of departures at the cap above which theta uses the realized departure rate.
CAPPED_LIMIT = 0.1


@dataclass(frozen=True)
class Estimate:
    """One workload estimate, produced by :meth:`WorkloadEstimator.update`."""

    p0: float  # hazard at t = 0 the closed forms use (1/tokens)
    eta: float  # hazard slope the closed forms use (1/tokens^2), >= 0
    mu_l: float  # mean prompt tokens computed (prompt minus prefix-cache hits)
    mu_o: float  # mean realized output E[min(O, cap)] (tokens)
    n_samples: int  # requests in the window (finished and running)
    n_censored: int  # of which running, aborted or capped
    method: str  # how p0/eta were obtained (see the module docstring)
    timestamp: float
    mu_o_sq: float = 0.0  # mean squared realized output (0: unknown)
    model: str = "geometric"  # the departure model fitted ("linear-hazard", "shifted-linear-hazard", "caps")
    gof: float = 0.0  # its goodness of fit: KS distance to the Kaplan-Meier estimate (0 = perfect)
    t0: int = 0  # no natural stop before this many tokens
    natural_p0: float = 0.0  # the natural length's fitted hazard
    natural_eta: float = 0.0
    capped_share: float = 0.0  # share of departures at the cap
    n_running: int = 0  # running requests in the window (weighted)
    mu_l_prompt: float = 0.0  # mean prompt length, cache hits included

    @classmethod
    def geometric(cls, mu_l: float, mu_o: float, method: str) -> Estimate:
        """A workload assumed rather than measured: geometric outputs of mean ``mu_o``.

        ``p0 = 1/mu_o``, no hazard slope, ``E[O^2] = 2 mu_o^2``; no samples behind it.
        """
        return cls(
            p0=1.0 / mu_o,
            eta=0.0,
            mu_l=mu_l,
            mu_o=mu_o,
            n_samples=0,
            n_censored=0,
            method=method,
            timestamp=0.0,
            mu_o_sq=2.0 * mu_o * mu_o,
            mu_l_prompt=mu_l,
        )

    @property
    def mean_age(self) -> float:
        """Mean age (tokens generated) of a running request, ``E[D^2] / (2 E[D])``.

        A slot refilled as soon as it frees holds a request whose age is the
        equilibrium (inspection-paradox) age of the renewal process: long requests
        hold their slots longer. For geometric outputs this is ``~1/p0``, the value
        the paper's N* uses; ``1/p0`` is the fallback when ``mu_o_sq`` is unknown.
        """
        if self.mu_o_sq <= 0:
            return 1.0 / self.p0
        return self.mu_o_sq / (2.0 * self.mu_o)

    @property
    def decode_context(self) -> float:
        """Time-averaged KV context of a decoding request, ``mu_L + E[D^2] / (2 mu_O)``.

        A request with output ``O`` reads ``sum_{a<O} (L + a)`` KV tokens over its
        decode steps; per decode step that averages to this.
        """
        return self.mu_l + self.mean_age


@dataclass
class ReplicaWindow:
    """One replica's recent admissions: finished ones by sequence number, and its running sample."""

    done: dict[int, CompletionRecord] = field(default_factory=dict)
    running: list[RunningRequest] = field(default_factory=list)
    running_total: int = 0
    next_seq: int = 0  # for records without a sequence number (engines that do not report one)

    @property
    def newest(self) -> int:
        last_done = max(self.done, default=-1)
        last_running = max((r.seq for r in self.running), default=-1)
        return max(last_done, last_running)


@dataclass
class EstimatorState:
    """What :class:`WorkloadEstimator` persists."""

    replicas: dict[str, ReplicaWindow]
    inputs: list[int]
    cached: list[int]
    completions: int
    pending: int
    updates: int
    estimate: Estimate | None = None
    first: Estimate | None = None
    #: windows of replicas that left, oldest departure first (state saved before they existed: none)
    departed: list[ReplicaWindow] = field(default_factory=list)


def _recent(
    done: dict[int, CompletionRecord], newest: list[int], share: int
) -> tuple[int, list[tuple[int, CompletionRecord]]]:
    """``(lo, items)``: the admission number below the ``share`` newest finished requests (-1: all of them are
    in), and the ``(seq, record)`` items above it, in the order they were recorded.

    ``newest`` holds the ``share`` largest keys of ``done``, ascending. A replica holds up to
    twice the whole window while a fleet's window gives it a share of it (2 records of 500
    with 256 replicas): the newest admissions were mostly recorded last, so they are looked
    for from the end, and the rest of ``done`` is not visited.
    """
    if len(done) < share:
        return -1, list(done.items())
    lo = newest[0] - 1
    if 2 * share >= len(done):
        return lo, [(seq, rec) for seq, rec in done.items() if seq > lo]
    out = []
    for seq, rec in reversed(done.items()):
        if seq > lo:
            out.append((seq, rec))
            if len(out) == share:
                break
    out.reverse()
    return lo, out


def _window_arrays(
    finished: list[CompletionRecord], running: list[RunningRequest], counts: list[tuple[int, int]],
    scales: list[float],
) -> departures.Sample:  # fmt: skip
    """The sample of windows given as their finished and running requests (``counts`` of each a window, the
    running ones standing for ``scales`` requests each): a window's finished requests, then its running ones.

    Built a column at a time and placed window by window with numpy (at fleet scale, thousands of
    running requests): the entries, their types and their order are those of a row at a time.
    """
    stop, length = FinishReason.STOP, FinishReason.LENGTH
    n_done = np.array([f for f, _ in counts], dtype=np.int64)
    n_run = np.array([r for _, r in counts], dtype=np.int64)
    start = np.cumsum(n_done + n_run) - n_done - n_run  # each window's first entry
    # where each entry goes: a window's finished ones from its start, its running ones after them
    at_done = np.repeat(start - (np.cumsum(n_done) - n_done), n_done) + np.arange(len(finished))
    at_run = np.repeat(start + n_done - (np.cumsum(n_run) - n_run), n_run) + np.arange(len(running))
    age = np.array([r.age for r in running], dtype=np.int64)
    cap = np.array([r.max_tokens for r in running], dtype=np.int64)
    at_cap = (cap > 0) & (cap <= age)
    size = len(finished) + len(running)
    columns = []
    for dtype, done_values, run_values in (
        (np.int64, [r.output_len for r in finished], np.maximum(age, 0)),
        (bool, [r.finish is stop for r in finished], False),
        (bool, [r.finish is length for r in finished], at_cap),
        (np.int64, [r.max_tokens or (r.output_len if r.finish is length else 0) for r in finished], cap),
        (float, 1.0, np.repeat(np.array(scales, dtype=float), n_run)),
        (bool, False, ~at_cap),
    ):
        column = np.empty(size, dtype=dtype)
        column[at_done] = done_values
        column[at_run] = run_values
        columns.append(column)
    return departures.Sample.of(*columns)


class WorkloadEstimator:
    """Admission-ordered windows of finished and running requests, and the periodic fit.

    Args:
        window: requests in the estimation window, fleet-wide (split evenly across replicas).
        input_window: recent prompts ``mu_L`` is averaged over; defaults to ``window``.
        update_every: completions between updates, ``M`` (authors: 100).
        min_samples: no estimate before this many finished requests are held.
        first_update: completions before the first update (default ``update_every``).
        clock: injected for tests; stamps each :class:`Estimate`.
    """

    def __init__(
        self,
        window: int = 500,
        input_window: int | None = None,
        update_every: int = 100,
        min_samples: int = 30,
        first_update: int | None = None,
        clock: Clock = time.time,
    ) -> None:
        for name, value in (("window", window), ("update_every", update_every), ("min_samples", min_samples)):
            theory.int_at_least(name, value, 1)
        self.window = window
        self.update_every = update_every
        self.min_samples = min_samples
        self.first_update = (
            update_every if first_update is None else theory.int_at_least("first_update", first_update, 1)
        )
        self._clock = clock
        self._replicas: dict[str, ReplicaWindow] = {}
        # per replica, the `_share` largest admission numbers it finished, ascending (see _recent)
        self._newest: dict[str, list[int]] = {}
        self._share = 0
        # the windows of replicas that left, oldest departure first: see forget()
        self._departed: deque[ReplicaWindow] = deque()
        self._inputs: deque[int] = deque(maxlen=input_window or window)
        self._cached: deque[int] = deque(maxlen=input_window or window)
        self.completions = 0  # all observed, ever
        self.pending = 0  # observed since the last update
        self.updates = 0
        self.estimate: Estimate | None = None
        self.first: Estimate | None = None  # the estimate of the first update, kept for comparison

    # -- observations ------------------------------------------------------

    def observe(self, record: CompletionRecord, replica: str = "") -> None:
        """Record one finished request (natural stop, cap or abort). Raises ``ValueError`` on impossible lengths."""
        theory.int_at_least("input_len", record.input_len, 1)
        theory.int_at_least("output_len", record.output_len, 1)
        self._add(replica, (record,))

    def observe_many(self, records: Sequence[CompletionRecord], replica: str = "") -> None:
        """:meth:`observe` for each of ``records``, in order (the controller's path: one call per batch).

        Raises ``ValueError`` on an impossible length, before recording any of them.
        """
        if not records:
            return
        theory.int_at_least("input_len", min(r.input_len for r in records), 1)
        theory.int_at_least("output_len", min(r.output_len for r in records), 1)
        self._add(replica, records)

    def _add(self, replica: str, records: Sequence[CompletionRecord]) -> None:
        w = self._replicas.get(replica)
        if w is None:
            w = self._replicas[replica] = ReplicaWindow()
        done, limit = w.done, 2 * self.window
        newest, share = self._newest.get(replica), self._share
        for record in records:
            seq = record.seq
            if seq < 0:
                seq, w.next_seq = w.next_seq, w.next_seq + 1
            if newest is not None and seq not in done and (len(newest) < share or seq > newest[0]):
                bisect.insort(newest, seq)
                if len(newest) > share:
                    del newest[0]
            done[seq] = record
            if len(done) > limit:  # keep the newest admissions only (trimmed in bulk: cheap per record)
                for old in sorted(done)[: len(done) - self.window]:
                    del done[old]
        self._inputs.extend(r.input_len for r in records)
        self._cached.extend(min(r.cached_tokens, r.input_len) for r in records)
        self.completions += len(records)
        self.pending += len(records)
        if self._departed:
            self._age_departed(len(records))

    def _age_departed(self, arrived: int) -> None:
        """Each completion that arrives displaces one finished request of the replicas that left, oldest first."""
        while arrived and self._departed:
            w = self._departed[0]
            for seq in list(itertools.islice(w.done, arrived)):  # held oldest admission first (see forget)
                del w.done[seq]
                arrived -= 1
            if not w.done:  # its running requests were admitted after those: they go with the last of them
                self._departed.popleft()

    def observe_running(self, replica: str, running: Sequence[RunningRequest], total: int) -> None:
        """The replica's requests still running now (a sample of ``total``); replaces its previous report."""
        w = self._replicas.setdefault(replica, ReplicaWindow())
        w.running = list(running)
        w.running_total = max(int(total), len(w.running))

    def forget(self, replica: str) -> None:
        """A replica left the fleet: its window stops taking a share and ages out.

        What it finished is evidence about the workload like any other completion, and
        what it was running, censored at the age last reported, too (those requests will
        never be reported finished). So its window - its share's finished admissions and
        the running sample admitted after them - leaves the per-replica split and joins
        the windows of replicas that left, which give up one finished request to each
        completion that arrives from then on (:meth:`_age_departed`), and hold at most a
        window between them. A fleet that scales down keeps a full window; one that churns
        through replicas holds a bounded one.
        """
        w = self._replicas.pop(replica, None)
        newest = self._newest.pop(replica, None)
        if w is None:
            return
        _, share = self._live()
        lo, recent = _recent(w.done, newest if newest is not None else sorted(w.done)[-share:], share)
        # ordered by admission once, here: each arriving completion then drops the first (_age_departed)
        kept = ReplicaWindow(done=dict(sorted(recent)), running=[r for r in w.running if r.seq > lo],
                             running_total=w.running_total)  # fmt: skip
        if kept.done:
            self._departed.append(kept)
        # replicas leaving one by one each take the share the ones left had: together at most a window
        excess = sum(len(d.done) for d in self._departed) - self.window
        if excess > 0:
            self._age_departed(excess)

    def cold_guess(self, replica: str, output_tokens: float) -> tuple[float, float] | None:
        """``(mu_l, mu_o)`` for the KV a replica's first cohort will need, before any estimate.

        ``mu_l`` is the mean prompt its running requests (and any finished ones) measure;
        ``mu_o`` is ``output_tokens``, or the mean of the requests' own caps where those
        are smaller. ``None`` until the replica has reported running requests.
        """
        w = self._replicas.get(replica)
        if w is None or not w.running:
            return None
        prompts = [r.input_len - min(r.cached_tokens, r.input_len) for r in w.running]
        caps = [min(float(r.max_tokens), output_tokens) if r.max_tokens > 0 else output_tokens for r in w.running]
        return float(np.mean(prompts)), float(np.mean(caps))

    @property
    def n_samples(self) -> int:
        """Finished requests held (running ones add to a fit, but no estimate rests on them alone)."""
        return sum(len(w.done) for w in self._replicas.values()) + sum(len(w.done) for w in self._departed)

    def update_due(self) -> bool:
        """True once ``update_every`` completions arrived and the window is warm."""
        due = self.update_every if self.updates else self.first_update
        return self.pending >= due and self.n_samples >= self.min_samples

    # -- the fit -----------------------------------------------------------

    def sample(self) -> departures.Sample:
        """The window as arrays.

        Per replica, every request admitted after the one whose completion is the
        ``window / replicas``-th newest: its finished requests, and its running ones
        (each standing for its share of the running count). All requests admitted in
        that range are there, finished or not - which is what makes censoring the
        running ones unbiased (a window of the newest admissions alone would hold only
        young running requests once more are running than it is long).
        """
        live, share = self._live()
        windows = [(w, *_recent(w.done, newest, share)) for w, newest in live]
        windows += [(w, -1, list(w.done.items())) for w in self._departed]  # trimmed when they left
        error = FinishReason.ERROR
        finished: list[CompletionRecord] = []  # every window's, in order
        running: list[RunningRequest] = []
        counts: list[tuple[int, int]] = []  # per window: finished, running
        scales: list[float] = []  # per window: how many requests each running one stands for
        for w, lo, recent in windows:
            done = w.done
            recs = [rec for _, rec in recent if rec.finish is not error]
            runs = [r for r in w.running if r.seq > lo and r.seq not in done]
            finished += recs
            running += runs
            counts.append((len(recs), len(runs)))
            scales.append(w.running_total / len(w.running) if w.running else 0.0)
        return _window_arrays(finished, running, counts, scales)

    def _live(self) -> tuple[list[tuple[ReplicaWindow, list[int]]], int]:
        """Replicas with something in their window (with their newest admissions), and each one's share of it."""
        live = [(rid, w) for rid, w in self._replicas.items() if w.done or w.running]
        share = max(1, math.ceil(self.window / max(len(live), 1)))
        if share != self._share:  # the fleet changed size: rebuilt once, then kept up by _add
            self._share = share
            self._newest = {rid: sorted(w.done)[-share:] for rid, w in self._replicas.items()}
        for rid, w in self._replicas.items():
            if rid not in self._newest:
                self._newest[rid] = sorted(w.done)[-share:]
        return [(w, self._newest[rid]) for rid, w in live], share

    def update(self) -> Estimate | None:
        """Fit the window now; ``None`` while fewer than ``min_samples`` finished requests are held."""
        if self.n_samples < self.min_samples or not self._inputs:
            return None
        sample = self.sample()
        fit = departures.fit(sample)
        prompt = float(np.mean(self._inputs))
        computed = prompt - float(np.mean(self._cached))
        if fit.model == "linear-hazard" and fit.gof <= GOF_LIMIT and fit.capped_share <= CAPPED_LIMIT:
            p0, eta, method = fit.p0, fit.eta, "mle: linear hazard"
        else:
            p0, eta, method = min(1.0, 1.0 / fit.mean), 0.0, f"mle: {fit.model}; theta from the departure rate 1/mu_o"
        self.estimate = Estimate(
            p0=p0,
            eta=eta,
            mu_l=max(computed, 1.0),
            mu_o=fit.mean,
            n_samples=sample.size,
            n_censored=int(np.count_nonzero(~sample.natural)),
            method=method,
            timestamp=self._clock(),
            mu_o_sq=fit.second,
            model=fit.model,
            gof=fit.gof,
            t0=fit.t0,
            natural_p0=fit.p0,
            natural_eta=fit.eta,
            capped_share=fit.capped_share,
            n_running=round(float(sample.weights[sample.running].sum())),
            mu_l_prompt=prompt,
        )
        if self.first is None:
            self.first = self.estimate
        self.pending = 0
        self.updates += 1
        return self.estimate

    # -- persistence -------------------------------------------------------

    def state(self) -> EstimatorState:
        """A snapshot for persistence (see :meth:`restore`): each replica's window, nothing older.

        The window is what :meth:`sample` fits: per replica, its ``window / replicas`` newest
        finished admissions and what it runs since (a resumed controller's first estimate is the
        last one's, for the same replicas). Older records the trimming still holds are not
        kept: at fleet scale they are most of the state (256 replicas each holding 500 records
        made a 5 MB snapshot for a window of 500).
        """
        _, share = self._live()
        windows = {}
        for rid, w in self._replicas.items():
            lo, recent = _recent(w.done, self._newest[rid], share)
            windows[rid] = ReplicaWindow(
                done=dict(recent),
                running=[r for r in w.running if r.seq > lo],
                running_total=w.running_total,
                next_seq=w.next_seq,
            )
        return EstimatorState(
            replicas=windows,
            inputs=list(self._inputs),
            cached=list(self._cached),
            completions=self.completions,
            pending=self.pending,
            updates=self.updates,
            estimate=self.estimate,
            first=self.first,
            departed=list(self._departed),
        )

    def restore(self, state: EstimatorState) -> None:
        """Load a snapshot made by :meth:`state` (windows keep their own sizes)."""
        self._replicas = dict(state.replicas)
        self._newest, self._share = {}, 0
        self._inputs.clear()
        self._inputs.extend(state.inputs)
        self._cached.clear()
        self._cached.extend(state.cached)
        self.completions = state.completions
        self.pending = state.pending
        self.updates = state.updates
        self.estimate = state.estimate
        self.first = state.first
        self._departed = deque(ReplicaWindow(dict(sorted(w.done.items())), w.running, w.running_total, w.next_seq)
                               for w in state.departed)  # fmt: skip
