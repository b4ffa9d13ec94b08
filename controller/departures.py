"""The departure model: how long a request holds its decode slot.

What frees a slot is a request's *realized* departure ``D = min(O, c)``: its
natural length ``O`` (where EOS or a stop would end it) cut at its cap ``c``
(``max_tokens``, or what the model length leaves). Caps are known when a request
is admitted; natural lengths are what must be estimated. The controller sees
requests of three kinds:

* finished by a natural stop at ``L``: an *event* of ``O`` at ``L``;
* finished at their cap, or aborted: ``O`` is longer than what they produced
  (right-censored) - the cap itself is a certain departure, not a censoring of ``D``;
* still running at age ``a``: ``O > a`` (right-censored), their cap known.

Statistics. The natural length's discrete-time hazard ``h(t) = P(O = t | O >= t)``
is fitted by maximum likelihood with censoring: at each age ``t`` the requests at
risk ``n_t`` and the natural stops ``e_t`` give the binomial log-likelihood
``sum_t e_t log h(t) + (n_t - e_t) log(1 - h(t))`` - a binomial GLM with identity
link - for the family of the paper's closed forms, a linear hazard, shifted by the
shortest natural length seen: ``h(t) = 0`` for ``t <= t0``, ``p0 + eta (t - t0)``
after, with ``eta >= 0`` (``t0`` is that family's maximum-likelihood value). The
shift matters for traffic with a minimum length (the paper's +-50% workloads: no
request stops before half the mean); without it a linear hazard from 0 fits such
data badly and, at a cold start, extrapolates the unseen tail far too long. The
likelihood is concave in ``(p0, eta)``; the fit is a few Newton steps.

Why MLE with censoring rather than a fit to the empirical hazard of finished
requests: requests still running are exactly the long ones a window of finished
requests misses - at a cold start (the first cohort's shortest requests finish
first) and after a shift to longer outputs. Counting them as censored removes that
bias; the parametric family then extrapolates the part of the distribution not
seen yet, and errs long (the safe side for the memory-safe N*) when data are few.

The realized moments the planner needs follow from the fit and each request's cap:
``E[min(O, c)] = sum_{t<c} S(t)``, ``E[min(O, c)^2] = sum_{t<c} (2t + 1) S(t)``. When
no natural stop was seen at all (``vllm bench serve --ignore-eos`` ends every
request at its cap), nothing is known of ``O`` beyond the caps, and the departures
are the caps themselves.

Goodness of fit: the largest distance between the model's realized survival and
the Kaplan-Meier estimate of the realized departures over the ages observed (a
Kolmogorov-Smirnov statistic, 0 = perfect).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: Ages with fewer requests at risk (weighted) are left out of the goodness-of-fit statistic.
MIN_AT_RISK = 5.0
#: Likelihood-ratio statistic a hazard slope must exceed to be fitted (chi-square, 1 dof: 3.84 is the 5% level).
SLOPE_TEST = 3.84
#: How far past the longest observation the survival is tabulated, at most.
MAX_HORIZON = 1 << 20


@dataclass(frozen=True)
class Sample:
    """The requests of an estimation window, as arrays of equal length.

    Attributes:
        durations: output tokens at departure, or produced so far (running).
        natural: departed by a natural stop (an event of the natural length).
        capped: departed at its cap (a certain departure; censors the natural length).
        caps: the request's cap (0: not known).
        weights: how many requests each entry stands for (running samples stand for more).
        running: still running (censored at ``durations``).
    """

    durations: np.ndarray
    natural: np.ndarray
    capped: np.ndarray
    caps: np.ndarray
    weights: np.ndarray
    running: np.ndarray

    @classmethod
    def of(
        cls,
        durations: np.ndarray,
        natural: np.ndarray,
        capped: np.ndarray | None = None,
        caps: np.ndarray | None = None,
        weights: np.ndarray | None = None,
        running: np.ndarray | None = None,
    ) -> Sample:
        d = np.asarray(durations, dtype=np.int64)
        size = d.size
        return cls(
            durations=d,
            natural=np.asarray(natural, dtype=bool),
            capped=np.zeros(size, bool) if capped is None else np.asarray(capped, dtype=bool),
            caps=np.zeros(size, np.int64) if caps is None else np.asarray(caps, dtype=np.int64),
            weights=np.ones(size) if weights is None else np.asarray(weights, dtype=float),
            running=np.zeros(size, bool) if running is None else np.asarray(running, dtype=bool),
        )

    @property
    def size(self) -> int:
        return int(self.durations.size)


@dataclass(frozen=True)
class DepartureFit:
    """The fitted departure model and what the planner reads from it.

    ``p0``/``eta``/``t0`` describe the natural length; ``mean``/``second`` the
    realized departures (caps applied); ``model`` names the family that was fitted.
    """

    model: str  # "linear-hazard" (t0 = 0), "shifted-linear-hazard", "caps" (no natural stop seen)
    p0: float
    eta: float
    t0: int
    mean: float  # E[D], tokens
    second: float  # E[D^2]
    gof: float  # KS distance, model vs Kaplan-Meier of the realized departures
    capped_share: float  # model-implied share of departures at the cap
    events: float  # natural stops in the window (weighted)
    censored: float  # capped, aborted and running entries (weighted)

    @property
    def mean_age(self) -> float:
        """Mean age of a running request (the renewal process's equilibrium age), ``E[D^2] / (2 E[D])``."""
        return self.second / (2.0 * self.mean)


def _risk_table(sample: Sample, horizon: int) -> tuple[np.ndarray, np.ndarray]:
    """``(n_t, e_t)`` for ``t = 0..horizon``: weighted requests at risk at age ``t`` and natural stops at ``t``."""
    d = np.minimum(sample.durations, horizon)
    w = sample.weights
    counts = np.bincount(d, weights=w, minlength=horizon + 1)
    at_risk = np.cumsum(counts[::-1])[::-1]  # n_t = #{d >= t}
    events = np.bincount(d[sample.natural], weights=w[sample.natural], minlength=horizon + 1)
    return at_risk, events


def _fit_hazard(at_risk: np.ndarray, events: np.ndarray, t0: int) -> tuple[float, float]:
    """Maximum-likelihood ``(p0, eta)`` of ``h(t) = p0 + eta (t - t0)`` for ``t > t0``, ``0 < h < 1``.

    The log-likelihood is concave in ``(p0, eta)``: Newton's method with a
    backtracking line search that keeps every ``h`` in ``(0, 1)``, and ``eta`` held
    at its bound 0 when the unconstrained optimum has a negative slope. ``eta`` is
    scaled by the age range so both parameters are of the hazard's order
    (a general-purpose solver stalled on the raw scales, at ``eta = 0``).
    """
    t = np.arange(at_risk.size)
    keep = (t > t0) & (at_risk > 0)
    n, e = at_risk[keep], events[keep]
    s = n - e
    span = max(float(t[keep].max() - t0), 1.0) if keep.any() else 1.0
    x = (t[keep] - t0) / span  # in (0, 1]
    pooled = float(e.sum() / max(n.sum(), 1e-300))
    if pooled <= 0.0:
        return 1e-12, 0.0

    def loglik(a: float, b: float) -> float:
        h = a + b * x
        if np.any(h <= 0.0) or np.any(h >= 1.0):
            return -math.inf
        return float(np.dot(e, np.log(h)) + np.dot(s, np.log1p(-h)))

    def newton(a: float, b: float, free_b: bool) -> tuple[float, float]:
        value = loglik(a, b)
        for _ in range(100):
            h = a + b * x
            g1 = e / h - s / (1.0 - h)
            w = e / (h * h) + s / ((1.0 - h) ** 2)
            if free_b:
                grad = np.array([g1.sum(), np.dot(g1, x)])
                hess = np.array([[w.sum(), np.dot(w, x)], [np.dot(w, x), np.dot(w, x * x)]])
                try:
                    step = np.linalg.solve(hess + 1e-300 * np.eye(2), grad)
                except np.linalg.LinAlgError:
                    step = grad / max(float(np.trace(hess)), 1e-300)
            else:
                step = np.array([g1.sum() / max(w.sum(), 1e-300), 0.0])
            scale = 1.0
            while scale > 1e-12:
                a_new, b_new = a + scale * step[0], b + scale * step[1]
                new = loglik(a_new, b_new)
                if new >= value:
                    break
                scale *= 0.5
            else:
                break
            converged = abs(new - value) <= 1e-12 * max(1.0, abs(value))
            a, b, value = a_new, b_new, new
            if converged:
                break
        return a, b

    a, b = newton(min(pooled, 0.5), 0.0, free_b=False)  # the constant hazard: always feasible
    a2, b2 = newton(a, 0.0, free_b=True)
    # With no floor on the lengths (t0 = 0), a slope only where the data show one (a
    # likelihood-ratio test of eta = 0): the constrained estimate max(0, eta) is positive
    # half the time when the truth is 0, and a spurious slope fitted to a few early
    # departures shortens the extrapolated tail - an underestimate of the mean, the
    # unsafe side for N*. Lengths with a floor (t0 > 0) are not memoryless to begin with:
    # there the slope is fitted freely (forcing it to 0 extrapolates the early hazard
    # into a tail 25-40% too long at a cold start, see benchmarks.cold_start).
    if b2 > 0.0 and (t0 > 0 or 2.0 * (loglik(a2, b2) - loglik(a, b)) > SLOPE_TEST):
        a, b = a2, b2
    return float(a), float(b) / span


def _survival(p0: float, eta: float, t0: int, horizon: int) -> np.ndarray:
    """``S(t) = P(O > t)`` for ``t = 0..horizon`` under the shifted linear hazard."""
    t = np.arange(1, horizon + 1)
    h = np.where(t > t0, np.clip(p0 + eta * (t - t0), 0.0, 1.0), 0.0)
    with np.errstate(divide="ignore"):
        log_s = np.cumsum(np.log1p(-np.minimum(h, 1.0 - 1e-16)))
    return np.concatenate([[1.0], np.exp(log_s)])


def _horizon(sample: Sample, p0: float, eta: float, t0: int) -> int:
    """Ages to tabulate: past every cap and observation, and where the natural survival is negligible."""
    longest = int(max(sample.durations.max(initial=1), sample.caps.max(initial=0)))
    if p0 <= 1e-12 and eta <= 0:
        return longest + 1
    # S(t) < 1e-9 at t - t0 = x: p0 x + eta x^2 / 2 >= 21
    x = 21.0 / p0 if eta <= 0 else (-p0 + math.sqrt(p0 * p0 + 42.0 * eta)) / eta
    return int(min(MAX_HORIZON, max(longest + 1, t0 + 1 + math.ceil(x))))


def _kaplan_meier(sample: Sample, horizon: int) -> tuple[np.ndarray, np.ndarray]:
    """The realized departures' survival (natural stops and caps are events) and the numbers at risk."""
    d = np.minimum(sample.durations, horizon)
    w = sample.weights
    departed = sample.natural | sample.capped
    counts = np.bincount(d, weights=w, minlength=horizon + 1)
    at_risk = np.cumsum(counts[::-1])[::-1]
    events = np.bincount(d[departed], weights=w[departed], minlength=horizon + 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        factor = np.where(at_risk > 0, 1.0 - events / np.where(at_risk > 0, at_risk, 1.0), 1.0)
    return np.cumprod(factor), at_risk


def fit(sample: Sample) -> DepartureFit:
    """Fit the departure model to a window (see the module docstring). Raises ``ValueError`` on an empty one."""
    if sample.size == 0 or float(sample.weights.sum()) <= 0:
        raise ValueError("no requests to fit a departure model to")
    stops = sample.durations[sample.natural]
    events = float(sample.weights[sample.natural].sum())
    censored = float(sample.weights[~sample.natural].sum())
    if stops.size == 0:
        model, p0, eta, t0 = "caps", 0.0, 0.0, int(sample.durations.max())
    else:
        t0 = int(stops.min()) - 1
        table_horizon = int(sample.durations.max())
        at_risk, counts = _risk_table(sample, table_horizon)
        p0, eta = _fit_hazard(at_risk, counts, t0)
        model = "linear-hazard" if t0 == 0 else "shifted-linear-hazard"
    horizon = _horizon(sample, p0, eta, t0)
    surv = _survival(p0, eta, t0, horizon) if model != "caps" else np.ones(horizon + 1)
    mean, second, capped_share, model_surv = _realized(sample, surv, horizon)
    km, km_at_risk = _kaplan_meier(sample, horizon)
    seen = km_at_risk >= MIN_AT_RISK
    gof = float(np.max(np.abs(model_surv[seen] - km[seen]))) if seen.any() else 1.0
    return DepartureFit(model, p0, eta, t0, mean, second, gof, capped_share, events, censored)


def _realized(sample: Sample, surv: np.ndarray, horizon: int) -> tuple[float, float, float, np.ndarray]:
    """Realized moments ``E[min(O, c)]``, ``E[min(O, c)^2]``, the share departing at the cap, and the
    realized survival ``P(D > t)`` (a mixture over the window's caps), for ``t = 0..horizon``."""
    t = np.arange(horizon + 1)
    first = np.concatenate([[0.0], np.cumsum(surv)])  # first[c] = sum_{t<c} S(t)
    second = np.concatenate([[0.0], np.cumsum((2 * t + 1) * surv)])
    caps = np.where(sample.caps > 0, np.minimum(sample.caps, horizon), horizon)
    w = sample.weights / sample.weights.sum()
    mean = float(np.dot(w, first[caps]))
    sq = float(np.dot(w, second[caps]))
    capped_share = float(np.dot(w, np.where(sample.caps > 0, surv[np.maximum(caps - 1, 0)], 0.0)))
    # P(D > t) = sum_i w_i S(t) [t < c_i]
    cap_mass = np.bincount(caps, weights=w, minlength=horizon + 1)
    alive = 1.0 - np.cumsum(cap_mass)  # share of requests whose cap is above t
    return mean, sq, capped_share, surv * np.clip(alive, 0.0, 1.0)
