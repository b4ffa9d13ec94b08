"""Per-token latency of a simulated run: inter-token gaps, stalls, SLO attainment and goodput.

An output token appears at the end of the step that produced it: a request's
first token at the end of the step that computes its prompt's last chunk, each
later one at the end of a decode (or mixed) step that includes it, or - after a
preemption - at the end of the step that finishes recomputing its context. The
*inter-token latency* (ITL) is the time between two consecutive tokens of one
request; a request's *stall* is its largest ITL (what an EB prefill phase adds to
every decoding request, and what a user watching a stream notices).

Cost: the simulator's 50,000-request runs take tens of thousands of steps with up
to ``max_num_seqs`` decodes each, so nothing here loops over tokens in Python.
Gaps go into a fixed log-spaced histogram (percentiles within 1.2%), and per
running slot only the time of its latest token and its largest gap are kept,
updated with numpy over the step's decoding slots. A run of identical decode steps
advanced at once (the simulator's ``jump``) is accounted exactly: its first step
gives each request its own gap, every later one the same gap to all of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: Histogram of gaps: log-spaced bins from 1 us to 10^4 s, 200 per decade (each 1.16% wide).
BINS_PER_DECADE = 200
LOG10_LO, LOG10_HI = -6, 4
N_BINS = (LOG10_HI - LOG10_LO) * BINS_PER_DECADE


def _bin(seconds: np.ndarray) -> np.ndarray:
    idx = ((np.log10(np.maximum(seconds, 10.0**LOG10_LO)) - LOG10_LO) * BINS_PER_DECADE).astype(np.int64)
    return np.minimum(idx, N_BINS - 1)


def _bin1(seconds: float) -> int:
    """:func:`_bin` of one value, without numpy's per-call overhead."""
    return min(int((math.log10(max(seconds, 10.0**LOG10_LO)) - LOG10_LO) * BINS_PER_DECADE), N_BINS - 1)


def histogram_percentile(hist: np.ndarray, q: float) -> float:
    """The ``q``-th percentile of the gaps counted in ``hist`` (log-interpolated within a bin; NaN when empty)."""
    total = int(hist.sum())
    if total == 0:
        return float("nan")
    cum = np.cumsum(hist)
    target = q / 100.0 * total
    # the first bin whose cumulative count reaches the target (for q = 0: the first non-empty bin)
    i = int(np.searchsorted(cum, target, side="left" if target > 0 else "right"))
    i = min(i, N_BINS - 1)
    before = float(cum[i - 1]) if i else 0.0
    frac = (target - before) / float(hist[i]) if hist[i] else 0.0
    return float(10.0 ** (LOG10_LO + (i + min(max(frac, 0.0), 1.0)) / BINS_PER_DECADE))


class TokenClock:
    """Every gap in a histogram; per running slot the latest token's time and the largest gap so far.

    The per-slot arrays are rows of ``slots`` (a ``(2, max_num_seqs)`` float array
    the simulator compacts together with its own slot arrays when requests
    leave). A request's values move to the per-request arrays when it leaves its
    slot (finished or preempted) and back when it is admitted again.
    """

    def __init__(self, requests: int, slots: np.ndarray, peer: TokenClock | None = None) -> None:
        self.last, self.gap = slots[0], slots[1]  # per slot
        if peer is None:
            self.req_last = np.full(requests, np.nan)  # per request, while it holds no slot
            self.req_gap = np.zeros(requests)
        else:  # another replica's clock of the same fleet: the per-request arrays are shared
            self.req_last, self.req_gap = peer.req_last, peer.req_gap
        self.hist = np.zeros(N_BINS, np.int64)

    def admit(self, slot: int, rid: int) -> None:
        self.last[slot] = self.req_last[rid]
        self.gap[slot] = self.req_gap[rid]

    def release(self, slots: np.ndarray | int, rids: np.ndarray | int) -> None:
        self.req_last[rids] = self.last[slots]
        self.req_gap[rids] = self.gap[slots]

    def first_token(self, slot: int, t: float) -> None:
        """The request in ``slot`` emitted its first output token at ``t`` (no gap before it)."""
        self.last[slot] = t

    def tokens(self, sel: slice | np.ndarray, t_first: float, later: np.ndarray | None = None) -> None:
        """The requests in slots ``sel`` emitted a token at ``t_first``, then one per entry of ``later`` (durations).

        A step's gaps are usually all equal (every request decoded in the step
        before), so they are counted as one bin unless they differ.
        """
        gaps = t_first - self.last[sel]
        if gaps.size == 0:
            return
        lo, hi = float(gaps.min()), float(gaps.max())
        if lo == hi:
            self.hist[_bin1(lo)] += gaps.size
        else:
            self.hist += np.bincount(_bin(gaps), minlength=N_BINS)
        t_end = t_first
        if later is not None and later.size:
            # each request got a token at the end of every later step: the same gaps for all of them
            np.add.at(self.hist, _bin(later), gaps.size)
            gaps = np.maximum(gaps, float(later.max()))
            t_end = t_first + float(later.sum())
        self.gap[sel] = np.maximum(self.gap[sel], gaps)
        self.last[sel] = t_end


@dataclass(frozen=True)
class SloTargets:
    """Per-request latency targets (seconds; ``None``: no target). A request meets

    * ``ttft_s`` if its time to first token is at most that;
    * ``itl_s`` if its largest inter-token gap (its stall) is at most that;
    * ``tpot_s`` if its mean time per output token after the first is at most that.

    Requests with one output token have no gap and no TPOT: they meet those two.
    """

    ttft_s: float | None = None
    itl_s: float | None = None
    tpot_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_s", "itl_s", "tpot_s"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
                raise ValueError(f"slo {name} must be a number > 0, got {v!r}")

    def as_json(self) -> dict[str, float | None]:
        return {"ttft_s": self.ttft_s, "itl_s": self.itl_s, "tpot_s": self.tpot_s}


def slo_report(
    targets: SloTargets | None, ttft: np.ndarray, stall: np.ndarray, tpot: np.ndarray, span_s: float
) -> dict[str, float | None]:
    """Attainment of each target (fraction of requests meeting it; ``None`` without a target) and goodput.

    ``tpot`` is NaN for requests with one output token. Goodput is the requests
    meeting every given target per second of the run (with no targets: every
    request, i.e. the request throughput).
    """
    targets = targets or SloTargets()
    ok = np.ones(ttft.size, bool)
    out: dict[str, float | None] = {}
    for key, values, target in (
        ("ttft_attainment", ttft, targets.ttft_s),
        ("itl_attainment", stall, targets.itl_s),
        ("tpot_attainment", tpot, targets.tpot_s),
    ):
        if target is None:
            out[key] = None
            continue
        met = ~(values > target)  # NaN (no such latency) meets it
        out[key] = float(met.mean()) if met.size else float("nan")
        ok &= met
    out["goodput_req_per_s"] = float(ok.sum()) / span_s if span_s > 0 else float("nan")
    return out
