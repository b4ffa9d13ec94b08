"""Online estimators: the workload (p0, eta, mu_L, mu_O) and the step cost model.

Both are small classes with explicit state, fed one observation at a time by the
controller actor and by the simulator, and read through immutable records
(:class:`Estimate`, :class:`CostFit`) that downstream code consumes.

Censoring. A request stopped by ``max_tokens`` did not reach its natural end: its
natural output length is at least its cap. Counting it as a completion at the cap
would put a spurious spike in the hazard there. We treat it as right-censored,
Kaplan-Meier style: it is *at risk* for every ``t <= cap`` (it was still decoding)
but contributes no *event*. The geometric fallback uses the censored MLE
``p0 = events / sum(lengths)`` for the same reason.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
from ebplus.controller import theory
from ebplus.controller.cost_model import CostModel, step_kind

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


def _check_length(name: str, value: int, lo: int) -> int:
    try:
        x = float(value)
    except (TypeError, ValueError):
        x = math.nan
    if not x.is_integer() or x < lo:
        raise ValueError(f"{name} must be an integer >= {lo}, got {value!r}")
    return int(x)


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
            _check_length(name, value, 1)
        self.update_every = update_every
        self.min_samples = min_samples
        self.first_update = update_every if first_update is None else _check_length("first_update", first_update, 1)
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
        inp = _check_length("input_len", input_len, 1)
        out = _check_length("output_len", output_len, 1)
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

    def state(self) -> dict:
        """Plain-data snapshot for persistence (see :meth:`from_state`)."""
        return {
            "outputs": list(self._outputs),
            "censored": list(self._censored),
            "inputs": list(self._inputs),
            "completions": self.completions,
            "pending": self.pending,
            "updates": self.updates,
            "estimate": None if self.estimate is None else dataclasses.asdict(self.estimate),
        }

    def restore(self, state: dict) -> None:
        """Load a snapshot made by :meth:`state` (windows keep their own sizes)."""
        self._outputs.clear()
        self._censored.clear()
        self._inputs.clear()
        self._outputs.extend(int(x) for x in state["outputs"])
        self._censored.extend(bool(x) for x in state["censored"])
        self._inputs.extend(int(x) for x in state["inputs"])
        self.completions = int(state["completions"])
        self.pending = int(state["pending"])
        self.updates = int(state["updates"])
        saved = state.get("estimate")
        self.estimate = None if saved is None else Estimate(**saved)


# ---------------------------------------------------------------------------
# cost model


def robust_linear_fit(
    design: np.ndarray,
    y: np.ndarray,
    lower: Iterable[float] | None = None,
    iterations: int = 12,
    prior: Iterable[float] | None = None,
    prior_sd: Iterable[float] | None = None,
) -> np.ndarray:
    """Huber regression by iteratively reweighted least squares, with lower bounds and an optional prior.

    Each pass weights residuals beyond 1.345 x the MAD-based sigma down (Huber's
    weights), so a few steps slowed by a GC pause or a page fault do not drag
    the fit. A coefficient that falls below its bound is pinned there and the
    rest refitted. Columns are scaled to unit norm for conditioning. IRLS on a
    few columns is a handful of small ``lstsq`` calls: cheap enough for the
    controller's update path.

    With ``prior`` (and its standard deviations ``prior_sd``) each coefficient
    also gets a Gaussian pseudo-observation weighted ``(sigma / sd)^2`` against
    the data's residual sigma: the MAP estimate. Well-determined coefficients
    follow the data; directions the data leave open (an engine that always runs
    nearly the same batch size cannot separate fixed from per-sequence cost)
    stay near the prior instead of running to a bound. No ``sd`` counts as
    tighter than a coefficient change that moves the prediction by 1e-3 of the
    largest ``y``: a relative sd of a prior coefficient that is exactly 0 (a
    previous fit pinned at its bound, restored as the prior) would otherwise
    give an infinite weight, and the fit NaN.
    """
    design = np.asarray(design, dtype=float)
    y = np.asarray(y, dtype=float)
    p = design.shape[1]
    lb = np.full(p, -np.inf) if lower is None else np.asarray(list(lower), dtype=float)
    scale = np.linalg.norm(design, axis=0)
    scale[scale == 0] = 1.0
    xs = design / scale
    if prior is not None:
        mu = np.asarray(list(prior), dtype=float)
        sd = np.asarray(list(prior_sd), dtype=float) if prior_sd is not None else np.abs(mu)
        x_max = np.abs(design).max(axis=0, initial=0.0)
        x_max[x_max == 0] = 1.0
        sd = np.maximum(sd, 1e-3 * float(np.abs(y).max(initial=0.0)) / x_max)
        xs_aug = np.vstack([xs, np.diag(1.0 / scale)])
        y_aug = np.concatenate([y, mu])
    weights = np.ones_like(y)
    coef = np.zeros(p)
    prior_w = np.zeros(p)
    floor = 1e-12 * max(float(np.abs(y).max()), 1e-300)
    lb_scaled = lb * scale
    for _ in range(iterations):
        previous = coef
        if prior is None:
            coef = _weighted_fit(xs, y, weights, lb_scaled, np.zeros(p, dtype=bool))
        else:
            coef = _weighted_fit(xs_aug, y_aug, np.concatenate([weights, prior_w]), lb_scaled, np.zeros(p, dtype=bool))
        # converged when no coefficient moved by more than 1e-6 of the largest
        if np.max(np.abs(coef - previous)) <= 1e-6 * max(float(np.max(np.abs(coef))), 1e-300):
            break
        resid = y - xs @ coef
        dev = np.abs(resid - np.median(resid))
        sigma = max(1.4826 * float(np.median(dev)), floor)
        cut = 1.345 * sigma
        abs_r = np.abs(resid)
        weights = np.minimum(1.0, cut / np.maximum(abs_r, 1e-300))
        if prior is not None:
            prior_w = (sigma / np.maximum(sd, 1e-300)) ** 2
    return coef / scale


def _weighted_fit(xs: np.ndarray, y: np.ndarray, w: np.ndarray, lb: np.ndarray, pinned: np.ndarray) -> np.ndarray:
    """Weighted least squares; coefficients that violate ``lb`` are pinned to it (in place)."""
    sw = np.sqrt(w)
    while True:
        coef = np.where(pinned, lb, 0.0)
        free = ~pinned
        rhs = (y - xs[:, pinned] @ lb[pinned]) * sw
        coef[free], *_ = np.linalg.lstsq(xs[:, free] * sw[:, None], rhs, rcond=None)
        violated = free & (coef < lb)
        if not violated.any():
            return coef
        pinned |= violated


@dataclass(frozen=True)
class CostFit:
    """A fitted cost model and how much data each part rests on."""

    model: CostModel
    n_prefill_steps: int
    n_decode_steps: int
    n_mixed_steps: int
    fitted: tuple[str, ...]  # which parts came from data: "prefill", "decode", "mixed"


class CostModelFitter:
    """Fits ``(alpha_p, beta_p)``, ``(alpha_d, beta_d, beta_kv)`` and ``beta_mb(r)`` from step timings.

    Each step kind keeps its own window so a long decode phase does not evict the
    prefill samples. Parts with fewer than ``min_steps`` samples (or without
    enough spread in the regressors) keep the prior's values.

    KV reads. Decode cost grows with the context the decodes read. Within an EB
    decode phase the batch shrinks while the context grows, so a fit of decode
    time on the batch size alone is confounded (it can send ``alpha_d`` to zero,
    and with it ``theta0`` to one). When the engine reports ``kv_tokens`` the
    decode fit has a ``beta_kv`` column and mixed steps are charged the same
    ``beta_kv``; when it does not, the KV cost is absorbed into ``alpha_d, beta_d``
    and the fitted model's ``beta_kv`` is 0 (no double count).

    Every fit is regularised toward the prior (``prior_sd``: its relative standard
    deviation), see :func:`robust_linear_fit`.

    Args:
        prior: the values used before data arrives (a shipped profile, or the
            last persisted fit).
        window: samples kept per step kind.
        min_steps: samples needed before a part is fitted.
        prior_sd: relative standard deviation of the prior on each coefficient.
    """

    def __init__(self, prior: CostModel, window: int = 2048, min_steps: int = 20, prior_sd: float = 0.5) -> None:
        self.prior = prior
        self.min_steps = min_steps
        self.prior_sd = prior_sd
        self._prefill: deque[tuple[int, float]] = deque(maxlen=window)
        self._decode: deque[tuple[int, int, float]] = deque(maxlen=window)
        self._mixed: deque[tuple[int, int, int, float]] = deque(maxlen=window)

    def observe_step(self, n_prefill_tokens: int, n_decode_tokens: int, seconds: float, kv_tokens: int = 0) -> None:
        """Record one step. Raises ``ValueError`` for empty steps or bad timings."""
        p = _check_length("n_prefill_tokens", n_prefill_tokens, 0)
        d = _check_length("n_decode_tokens", n_decode_tokens, 0)
        kv = _check_length("kv_tokens", kv_tokens, 0)
        s = float(seconds)
        if not (math.isfinite(s) and s > 0):
            raise ValueError(f"step seconds must be finite and > 0, got {seconds!r}")
        if p + d == 0:
            raise ValueError("a step must schedule at least one token")
        kind = step_kind(p, d)
        if kind == "prefill":
            self._prefill.append((p, s))
        elif kind == "decode":
            self._decode.append((d, kv, s))
        else:
            self._mixed.append((p, d, kv, s))

    @staticmethod
    def _spread(x: np.ndarray) -> bool:
        return x.size > 0 and float(x.max()) > 1.2 * float(x.min())

    def _sd(self, values: tuple[float, ...], floor: float) -> np.ndarray:
        return self.prior_sd * np.maximum(np.abs(np.asarray(values, dtype=float)), floor)

    def _fit_prefill(self) -> tuple[tuple[float, float], bool]:
        prior = self.prior
        default = (prior.alpha_p, prior.beta_p)
        if len(self._prefill) < self.min_steps:
            return default, False
        arr = np.asarray(self._prefill, dtype=float)
        n, t = arr[:, 0], arr[:, 1]
        if not self._spread(n):
            return default, False
        design = np.column_stack([np.ones_like(n), n])
        sd = self._sd(default, 0.0)
        alpha, beta = robust_linear_fit(design, t, lower=(1e-9, 0.0), prior=default, prior_sd=sd)
        return (float(alpha), float(beta)), True

    def _fit_decode(self) -> tuple[tuple[float, float, float], bool]:
        prior = self.prior
        default = (prior.alpha_d, prior.beta_d, prior.beta_kv)
        if len(self._decode) < self.min_steps:
            return default, False
        arr = np.asarray(self._decode, dtype=float)
        n, kv, t = arr[:, 0], arr[:, 1], arr[:, 2]
        with_kv = bool(kv.any())
        if not (self._spread(n) or (with_kv and self._spread(kv))):
            return default, False
        if with_kv:
            design = np.column_stack([np.ones_like(n), n, kv])
            sd = self._sd(default, 0.0)
            sd[2] = self.prior_sd * max(prior.beta_kv, 1e-3 * prior.beta_d, 1e-12)
            a, b, k = robust_linear_fit(design, t, lower=(1e-9, 0.0, 0.0), prior=default, prior_sd=sd)
            return (float(a), float(b), float(k)), True
        design = np.column_stack([np.ones_like(n), n])
        a, b = robust_linear_fit(design, t, lower=(1e-9, 0.0), prior=default[:2], prior_sd=self._sd(default[:2], 0.0))
        return (float(a), float(b), 0.0), True

    def fit(self) -> CostFit:
        prior = self.prior
        (alpha_p, beta_p), got_p = self._fit_prefill()
        (alpha_d, beta_d, beta_kv), got_d = self._fit_decode()
        fitted = [name for name, ok in (("prefill", got_p), ("decode", got_d)) if ok]
        alpha_mb, coeffs = prior.alpha_mb, prior.beta_mb
        if len(self._mixed) >= self.min_steps:
            arr = np.asarray(self._mixed, dtype=float)
            n = arr[:, 0] + arr[:, 1]
            r = arr[:, 1] / n
            t = arr[:, 3] - beta_kv * arr[:, 2]  # the KV reads priced as in decode steps
            if self._spread(n) and float(r.max() - r.min()) > 0.1:
                design = np.column_stack([np.ones_like(n), n, n * r, n * r * r])
                pri = (prior.alpha_mixed, *prior.beta_mb)
                sd = self._sd(pri, 0.0)
                sd[1:] = self._sd(prior.beta_mb, 0.25 * max(abs(x) for x in prior.beta_mb))
                a0, a, b, c = robust_linear_fit(design, t, lower=(1e-9, -np.inf, -np.inf, 0.0), prior=pri, prior_sd=sd)
                candidate = (float(a), float(b), float(c))
                # keep the fit only if it is a usable cost curve: >= 0 on all of [0, 1],
                # the very check CostModel applies (a looser one let a fit through that
                # CostModel then rejected, and the controller's re-plan raised)
                if theory.beta_mb_min(candidate)[1] >= 0:
                    alpha_mb, coeffs = float(a0), candidate
                    fitted.append("mixed")
        model = CostModel(
            alpha_p=alpha_p,
            beta_p=beta_p,
            alpha_d=alpha_d,
            beta_d=beta_d,
            beta_mb=coeffs,
            alpha_mb=alpha_mb,
            beta_kv=beta_kv,
        )
        return CostFit(
            model=model,
            n_prefill_steps=len(self._prefill),
            n_decode_steps=len(self._decode),
            n_mixed_steps=len(self._mixed),
            fitted=tuple(fitted),
        )
