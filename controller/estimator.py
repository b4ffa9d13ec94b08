"""The online workload estimator: p0, eta, mu_L, mu_O from completion telemetry.

A small class with explicit state, fed one observation at a time by the control
loop (and so by the simulator), read through the immutable :class:`Estimate`.

Censoring. A request stopped by ``max_tokens`` did not reach its natural end: its
natural output length is at least its cap. Counting it as a completion at the cap
would put a spurious spike in the hazard there. We treat it as right-censored,
Kaplan-Meier style: it is *at risk* for every ``t <= cap`` (it was still decoding)
but contributes no *event*. The geometric fallback uses the censored MLE
``p0 = events / sum(lengths)`` for the same reason.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from ebplus.controller import theory

Clock = Callable[[], float]


@dataclass(frozen=True)
class Estimate:
    """One workload estimate, produced by :meth:`WorkloadEstimator.update`."""

    p0: float  # hazard at t = 0 (1/tokens)
    eta: float  # hazard slope (1/tokens^2), >= 0
    mu_l: float  # mean input length (tokens)
    mu_o: float  # mean generated output length, censored requests at their cap (tokens)
    n_samples: int  # output lengths in the window
    n_censored: int  # of which stopped by max_tokens
    t_lo: int  # fitted hazard range, first t
    t_hi: int  # fitted hazard range, last t (the 95th percentile)
    method: str  # "wls", or "fallback: <reason>" when the geometric MLE was used
    timestamp: float
    mu_o_sq: float = 0.0  # mean squared output length (0: unknown)

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
            t_lo=0,
            t_hi=0,
            method=method,
            timestamp=0.0,
            mu_o_sq=2.0 * mu_o * mu_o,
        )

    @property
    def mean_age(self) -> float:
        """Mean age (tokens generated) of a running request, ``E[O^2] / (2 E[O])``.

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
        """Time-averaged KV context of a decoding request, ``mu_L + E[O^2] / (2 mu_O)``.

        A request with output ``O`` reads ``sum_{a<O} (L + a)`` KV tokens over its
        decode steps; per decode step that averages to this.
        """
        return self.mu_l + self.mean_age


def fit_hazard(
    lengths: np.ndarray, censored: np.ndarray, *, min_at_risk: int = 5, quantile: float = 95.0
) -> tuple[float, float, int, int, str]:
    """Weighted least-squares fit of the empirical hazard ``h(t) = p0 + eta*t``.

    ``h(t) = #{events at t} / #{at risk at t}`` over ``t in [1, t95]``, weighted by
    the number at risk (the inverse variance of ``h(t)`` up to a factor), points
    with fewer than ``min_at_risk`` at risk skipped. A negative slope is clipped to
    0 and ``p0`` refitted as the pooled rate; an unusable fit (too few points,
    ``p0 <= 0``) falls back to the censored geometric MLE.

    Returns ``(p0, eta, t_lo, t_hi, method)``.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    censored = np.asarray(censored, dtype=bool)
    events_total = int((~censored).sum())
    exposure = float(lengths.sum())
    fallback_p0 = min(1.0, max(events_total, 1) / exposure)
    t_hi = max(1, int(np.percentile(lengths, quantile)))

    def fallback(reason: str) -> tuple[float, float, int, int, str]:
        return fallback_p0, 0.0, 1, t_hi, f"fallback: {reason}"

    if events_total == 0:
        return fallback("no uncensored completions")
    size = int(lengths.max()) + 2
    all_counts = np.bincount(lengths, minlength=size)
    event_counts = np.bincount(lengths[~censored], minlength=size)
    at_risk = np.cumsum(all_counts[::-1])[::-1]  # at_risk[t] = #{O >= t}
    t = np.arange(1, t_hi + 1)
    n_t = at_risk[1 : t_hi + 1].astype(float)
    d_t = event_counts[1 : t_hi + 1].astype(float)
    keep = n_t >= min_at_risk
    t, n_t, d_t = t[keep], n_t[keep], d_t[keep]
    if t.size < 2:
        return fallback(f"{t.size} hazard points with >= {min_at_risk} at risk")
    h = d_t / n_t
    sw = np.sqrt(n_t)
    design = np.column_stack([np.ones_like(t, dtype=float), t.astype(float)])
    (p0, eta), *_ = np.linalg.lstsq(design * sw[:, None], h * sw, rcond=None)
    if not (math.isfinite(p0) and math.isfinite(eta)):
        return fallback("non-finite fit")
    if eta < 0:
        eta = 0.0
        p0 = float(d_t.sum() / n_t.sum())
    if p0 <= 0:
        return fallback(f"fitted p0 = {p0:.3g} <= 0")
    return min(float(p0), 1.0), float(eta), int(t[0]), int(t[-1]), "wls"


@dataclass
class EstimatorState:
    """What :class:`WorkloadEstimator` persists: its windows and counters."""

    outputs: list[int]
    censored: list[bool]
    inputs: list[int]
    completions: int
    pending: int
    updates: int
    estimate: Estimate | None = None


class WorkloadEstimator:
    """Sliding windows of recent lengths and the periodic hazard fit (seed §3.4).

    Args:
        window: size of ``W_O``, the recent output lengths (authors: 500).
        input_window: size of ``W_L``; defaults to ``window``.
        update_every: completions between updates, ``M`` (authors: 100).
        min_samples: no estimate before this many outputs are in the window.
        first_update: completions before the first update (default ``update_every``).
            A cold controller runs on guesses (MB for EB+, ``theta_cold``) until then.
        min_at_risk: hazard points with fewer requests at risk are skipped.
        clock: injected for tests; stamps each :class:`Estimate`.
    """

    def __init__(
        self,
        window: int = 500,
        input_window: int | None = None,
        update_every: int = 100,
        min_samples: int = 30,
        first_update: int | None = None,
        min_at_risk: int = 5,
        clock: Clock = time.time,
    ) -> None:
        for name, value in (("window", window), ("update_every", update_every), ("min_samples", min_samples)):
            theory.int_at_least(name, value, 1)
        self.update_every = update_every
        self.min_samples = min_samples
        self.first_update = update_every if first_update is None else theory.int_at_least("first_update", first_update, 1)
        self.min_at_risk = min_at_risk
        self._clock = clock
        self._outputs: deque[int] = deque(maxlen=window)
        self._censored: deque[bool] = deque(maxlen=window)
        self._inputs: deque[int] = deque(maxlen=input_window or window)
        self.completions = 0  # all observed, ever
        self.pending = 0  # observed since the last update
        self.updates = 0
        self.estimate: Estimate | None = None

    def observe(self, input_len: int, output_len: int, censored: bool = False) -> None:
        """Record one finished request. Raises ``ValueError`` on impossible lengths."""
        inp = theory.int_at_least("input_len", input_len, 1)
        out = theory.int_at_least("output_len", output_len, 1)
        self._inputs.append(inp)
        self._outputs.append(out)
        self._censored.append(bool(censored))
        self.completions += 1
        self.pending += 1

    def observe_many(
        self, input_lens: Iterable[int], output_lens: Iterable[int], censored: Iterable[bool] | None = None
    ) -> None:
        outs = list(output_lens)
        cens = [False] * len(outs) if censored is None else list(censored)
        for inp, out, c in zip(input_lens, outs, cens, strict=True):
            self.observe(inp, out, c)

    @property
    def n_samples(self) -> int:
        return len(self._outputs)

    def update_due(self) -> bool:
        """True once ``update_every`` completions arrived and the window is warm."""
        due = self.update_every if self.updates else self.first_update
        return self.pending >= due and self.n_samples >= self.min_samples

    def update(self) -> Estimate | None:
        """Fit the windows now; ``None`` while fewer than ``min_samples`` are held."""
        if self.n_samples < self.min_samples:
            return None
        lengths = np.fromiter(self._outputs, dtype=np.int64, count=len(self._outputs))
        censored = np.fromiter(self._censored, dtype=bool, count=len(self._censored))
        p0, eta, t_lo, t_hi, method = fit_hazard(lengths, censored, min_at_risk=self.min_at_risk)
        self.estimate = Estimate(
            p0=p0,
            eta=eta,
            mu_l=float(np.mean(np.fromiter(self._inputs, dtype=float))),
            mu_o=float(lengths.mean()),
            n_samples=int(lengths.size),
            n_censored=int(censored.sum()),
            t_lo=t_lo,
            t_hi=t_hi,
            method=method,
            timestamp=self._clock(),
            mu_o_sq=float(np.mean(np.square(lengths, dtype=float))),
        )
        self.pending = 0
        self.updates += 1
        return self.estimate

    def state(self) -> EstimatorState:
        """A snapshot for persistence (see :meth:`restore`)."""
        return EstimatorState(
            outputs=list(self._outputs),
            censored=list(self._censored),
            inputs=list(self._inputs),
            completions=self.completions,
            pending=self.pending,
            updates=self.updates,
            estimate=self.estimate,
        )

    def restore(self, state: EstimatorState) -> None:
        """Load a snapshot made by :meth:`state` (windows keep their own sizes)."""
        self._outputs.clear()
        self._censored.clear()
        self._inputs.clear()
        self._outputs.extend(state.outputs)
        self._censored.extend(state.censored)
        self._inputs.extend(state.inputs)
        self.completions = state.completions
        self.pending = state.pending
        self.updates = state.updates
        self.estimate = state.estimate
