"""The step cost model fitted online from a replica's step timings.

Each replica's :class:`CostModelFitter` keeps recent step timings per kind and
fits ``(alpha_p, beta_p)``, ``(alpha_d, beta_d, beta_kv)`` and ``beta_mb(r)``
with a robust, bounded, prior-regularised regression (:func:`robust_linear_fit`);
``ebplus profile`` runs the same fitter on a real engine's measured steps.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from ebplus.controller import theory
from ebplus.controller.cost_model import CostModel
from ebplus.controller.messages import StepKind, StepRecord

#: A fitted fixed cost per step may not fall below this fraction of the median step time of its
#: kind. Every step pays for a launch, a sampler pass and the scheduler; a fit that drives the
#: intercept to zero (steps of nearly one size, or a burst of cheap ones) is the regression's edge,
#: not the hardware, and the closed forms divide by it (theta0's c = alpha_p / alpha_d ran to 1e6
#: after a controller restart). Relative to the data, not the prior: a prior from another device
#: may be off by orders of magnitude.
ALPHA_FLOOR = 0.01


def _alpha_floor(seconds: np.ndarray) -> float:
    return max(1e-9, ALPHA_FLOOR * _median(seconds))


def _median(x: np.ndarray) -> float:
    """``np.median`` of a non-empty 1-d array, the same float: one partition, without its general-axis
    machinery, which was half of an IRLS pass (two medians a pass, ~8 passes a regression).

    For an even size the two middle order statistics are ``part[m]`` of a partition at ``m`` and the
    largest of the ``m`` values it leaves below: one selection and a max, where a partition at both
    ``m - 1`` and ``m`` makes a second selection pass (a third of a refit's time). Only which of two
    tied zeros (-0.0, 0.0) is picked can differ, and the fit reads its medians through ``abs`` of a
    difference and ``max(.., floor)``, where the sign of a zero does not show.
    """
    n = x.size
    m = n // 2
    part = np.partition(x, m)
    if n % 2:
        return float(part[m])
    return float((np.maximum.reduce(part[:m]) + part[m]) / 2)  # (ndarray.max's reduction, without its wrapper)


def _settled(coef: np.ndarray, previous: np.ndarray) -> bool:
    """``max|coef - previous| <= 1e-6 * max(max|coef|, 1e-300)``: no coefficient moved by more than 1e-6 of the
    largest. On a few coefficients in Python floats (the same differences and maxima); a NaN fails the test,
    as np.max's NaN fails the comparison."""
    now, before = coef.tolist(), previous.tolist()
    moved = [abs(a - b) for a, b in zip(now, before, strict=True)]
    sizes = [abs(a) for a in now]
    if any(x != x for x in moved) or any(x != x for x in sizes):
        return False
    return max(moved) <= 1e-6 * max(max(sizes), 1e-300)


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
        sd_floor = np.maximum(sd, 1e-300)  # what each pass divides sigma by
    weights = np.ones_like(y)
    coef = np.zeros(p)
    prior_w = np.zeros(p)
    floor = 1e-12 * max(float(np.abs(y).max()), 1e-300)
    lb_scaled = lb * scale
    # what every pass that pins nothing solves with (see _weighted_fit): the same for all passes
    none = np.zeros(p, dtype=bool)
    system = (xs, y) if prior is None else (xs_aug, y_aug)
    unpinned = (system[0][:, ~none], system[1] - system[0][:, none] @ lb_scaled[none])
    for _ in range(iterations):
        previous = coef
        if prior is None:
            coef = _weighted_fit(xs, y, weights, lb_scaled, np.zeros(p, dtype=bool), unpinned)
        else:
            coef = _weighted_fit(
                xs_aug, y_aug, np.concatenate([weights, prior_w]), lb_scaled, np.zeros(p, dtype=bool), unpinned
            )
        if _settled(coef, previous):
            break
        resid = y - xs @ coef
        dev = np.abs(resid - _median(resid))
        sigma = max(1.4826 * _median(dev), floor)
        cut = 1.345 * sigma
        abs_r = np.abs(resid)
        weights = np.minimum(1.0, cut / np.maximum(abs_r, 1e-300))
        if prior is not None:
            prior_w = (sigma / sd_floor) ** 2
    return coef / scale


def _weighted_fit(
    xs: np.ndarray, y: np.ndarray, w: np.ndarray, lb: np.ndarray, pinned: np.ndarray,
    unpinned: tuple[np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:  # fmt: skip
    """Weighted least squares; coefficients that violate ``lb`` are pinned to it (in place).

    ``unpinned``: ``(xs[:, ~pinned], y - xs[:, pinned] @ lb[pinned])`` for nothing pinned, made once by a
    caller that solves many passes on the same ``xs``, ``y`` and ``lb`` (IRLS): the pass that pins nothing
    (most of them) uses those arrays rather than build equal ones again.
    """
    while True:
        # the normal equations (a few columns, each scaled to unit norm by the caller): an SVD of the
        # p x p system instead of the n x p one, a tenth of a 2048-step refit's time
        if unpinned is not None and not pinned.any():
            # every coefficient free: the solution is the coefficients, and a violation any of them below lb
            x, rhs = unpinned
            wx = x * w[:, None]
            coef = np.linalg.lstsq(x.T @ wx, wx.T @ rhs, rcond=None)[0]
            violated = coef < lb
        else:
            free = ~pinned
            x, rhs = xs[:, free], y - xs[:, pinned] @ lb[pinned]
            coef = np.where(pinned, lb, 0.0)
            wx = x * w[:, None]
            coef[free], *_ = np.linalg.lstsq(x.T @ wx, wx.T @ rhs, rcond=None)
            violated = free & (coef < lb)
        if not violated.any():
            return coef
        pinned |= violated


class _Window:
    """The newest ``size`` rows of step samples, oldest first: a ring in one float array.

    Not a deque of tuples: at 256 replicas those were 1.5 M small objects that every full
    garbage collection walked (~90 ms, a pause on the controller's event loop), and that
    each refit converted to an array. The values are the same floats either way.
    """

    def __init__(self, size: int, columns: int) -> None:
        self._data = np.zeros((size, columns))
        self._head = 0  # next row to write
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def extend(self, rows: list[tuple]) -> None:
        if not rows:
            return
        size = self._data.shape[0]
        block = np.asarray(rows[-size:], dtype=float)
        first = min(len(block), size - self._head)
        self._data[self._head : self._head + first] = block[:first]
        self._data[: len(block) - first] = block[first:]
        self._head = (self._head + len(block)) % size
        self._len = min(size, self._len + len(rows))

    def rows(self) -> np.ndarray:
        """A copy of the rows held, oldest first."""
        if self._len < self._data.shape[0]:
            return self._data[: self._len].copy()
        return np.concatenate([self._data[self._head :], self._data[: self._head]])


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
        self._prefill = _Window(window, 2)  # prefill tokens, seconds
        self._decode = _Window(window, 3)  # sequences, KV tokens read, seconds
        self._mixed = _Window(window, 4)  # prefill tokens, decode tokens, KV tokens read, seconds

    def observe_step(self, n_prefill_tokens: int, n_decode_tokens: int, seconds: float, kv_tokens: int = 0) -> None:
        """Record one step. Raises ``ValueError`` for empty steps or bad timings."""
        p = theory.int_at_least("n_prefill_tokens", n_prefill_tokens, 0)
        d = theory.int_at_least("n_decode_tokens", n_decode_tokens, 0)
        kv = theory.int_at_least("kv_tokens", kv_tokens, 0)
        s = float(seconds)
        if not (math.isfinite(s) and s > 0):
            raise ValueError(f"step seconds must be finite and > 0, got {seconds!r}")
        if p + d == 0:
            raise ValueError("a step must schedule at least one token")
        kind = StepKind.of(p, d)
        if kind is StepKind.PREFILL:
            self._prefill.extend([(p, s)])
        elif kind is StepKind.DECODE:
            self._decode.extend([(d, kv, s)])
        else:
            self._mixed.extend([(p, d, kv, s)])

    def observe_records(self, records: Iterable[StepRecord]) -> None:
        """:meth:`observe_step` for each record, in order, without checking them again.

        For records that passed :func:`ebplus.controller.telemetry.intake` (the
        controller's path, one call per telemetry batch).
        """
        prefill, decode, mixed = [], [], []
        for rec in records:
            p, d, s = rec.prefill_tokens, rec.decode_tokens, float(rec.seconds)
            if not d:
                prefill.append((p, s))
            elif not p:
                decode.append((d, rec.kv_tokens, s))
            else:
                mixed.append((p, d, rec.kv_tokens, s))
        for window, rows in ((self._prefill, prefill), (self._decode, decode), (self._mixed, mixed)):
            window.extend(rows)

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
        arr = self._prefill.rows()
        n, t = arr[:, 0], arr[:, 1]
        if not self._spread(n):
            return default, False
        design = np.column_stack([np.ones_like(n), n])
        sd = self._sd(default, 0.0)
        alpha, beta = robust_linear_fit(design, t, lower=(_alpha_floor(t), 0.0), prior=default, prior_sd=sd)
        return (float(alpha), float(beta)), True

    def _fit_decode(self) -> tuple[tuple[float, float, float], bool]:
        prior = self.prior
        default = (prior.alpha_d, prior.beta_d, prior.beta_kv)
        if len(self._decode) < self.min_steps:
            return default, False
        arr = self._decode.rows()
        n, kv, t = arr[:, 0], arr[:, 1], arr[:, 2]
        with_kv = bool(kv.any())
        if not (self._spread(n) or (with_kv and self._spread(kv))):
            return default, False
        if with_kv:
            design = np.column_stack([np.ones_like(n), n, kv])
            sd = self._sd(default, 0.0)
            sd[2] = self.prior_sd * max(prior.beta_kv, 1e-3 * prior.beta_d, 1e-12)
            a, b, k = robust_linear_fit(design, t, lower=(_alpha_floor(t), 0.0, 0.0), prior=default, prior_sd=sd)
            return (float(a), float(b), float(k)), True
        design = np.column_stack([np.ones_like(n), n])
        sd2 = self._sd(default[:2], 0.0)
        a, b = robust_linear_fit(design, t, lower=(_alpha_floor(t), 0.0), prior=default[:2], prior_sd=sd2)
        return (float(a), float(b), 0.0), True

    def fit(self) -> CostFit:
        """Fit the model to the steps held now."""
        prior = self.prior
        (alpha_p, beta_p), got_p = self._fit_prefill()
        (alpha_d, beta_d, beta_kv), got_d = self._fit_decode()
        fitted = [name for name, ok in (("prefill", got_p), ("decode", got_d)) if ok]
        alpha_mb, coeffs = prior.alpha_mb, prior.beta_mb
        if len(self._mixed) >= self.min_steps:
            arr = self._mixed.rows()
            n = arr[:, 0] + arr[:, 1]
            r = arr[:, 1] / n
            t = arr[:, 3] - beta_kv * arr[:, 2]  # the KV reads priced as in decode steps
            if self._spread(n) and float(r.max() - r.min()) > 0.1:
                design = np.column_stack([np.ones_like(n), n, n * r, n * r * r])
                pri = (prior.alpha_mixed, *prior.beta_mb)
                sd = self._sd(pri, 0.0)
                sd[1:] = self._sd(prior.beta_mb, 0.25 * max(abs(x) for x in prior.beta_mb))
                lower = (_alpha_floor(t), -np.inf, -np.inf, 0.0)
                a0, a, b, c = robust_linear_fit(design, t, lower=lower, prior=pri, prior_sd=sd)
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
