"""Closed forms of the EB+ model (seed paper §3, DESIGN §2).

Every function here is pure and validates its inputs: a bad parameter raises
``ValueError`` naming the parameter and its allowed range, so a NaN can never
leak from an estimate into a scheduling decision.

Notation (all times in seconds, lengths in tokens):

* ``alpha_p, beta_p``  prefill-only step ``T = alpha_p + beta_p * n_tokens``
* ``alpha_d, beta_d``  decode-only step ``T = alpha_d + beta_d * n_sequences``
* ``beta_mb(r)``       per-token cost of a mixed step with decode share ``r``
* ``p0, eta``          output-length hazard ``h(t) = p0 + eta * t``
* ``mu_l, mu_o``       mean input and output lengths
* ``n``                decode slots (concurrent requests), ``k`` the EB threshold
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

# Clamps used by the seed authors' controller; documented in README ("Formulas").
DELTA_THETA_MAX_FACTOR = 5.0
THETA_MIN = 0.01
THETA_MAX = 0.80

_INF = math.inf


class Winner(StrEnum):
    """Which batching policy the crossover rule prefers."""

    EB = "EB"
    MB = "MB"


# ---------------------------------------------------------------------------
# validation


def check_range(
    name: str,
    value: float,
    lo: float = -_INF,
    hi: float = _INF,
    *,
    lo_open: bool = False,
    hi_open: bool = False,
) -> float:
    """Return ``float(value)`` or raise ``ValueError`` naming ``name`` and the range.

    NaN and infinities are always rejected: no closed form here accepts them.
    """
    if type(value) is float and lo < value < hi:  # strictly inside: accepted whatever the ends (a re-plan checks ~50)
        return value
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(x) or x < lo or x > hi or (lo_open and x == lo) or (hi_open and x == hi):
        left = "(" if lo_open else "["
        right = ")" if hi_open else "]"
        raise ValueError(f"{name} must be in {left}{lo:g}, {hi:g}{right}, got {value!r}")
    return x


def _positive(name: str, value: float) -> float:
    if type(value) is float and 0.0 < value < _INF:  # the common case, answered as check_range would
        return value
    return check_range(name, value, 0.0, _INF, lo_open=True, hi_open=True)


def _non_negative(name: str, value: float) -> float:
    if type(value) is float and 0.0 <= value < _INF:
        return value
    return check_range(name, value, 0.0, _INF, hi_open=True)


#: Ints up to this size are their own float (larger ones are rounded by :func:`int_at_least`'s conversion).
_EXACT_INT = 1 << 53


def int_at_least(name: str, value: int, lo: int) -> int:
    """``value`` as an int, or ``ValueError`` naming ``name`` unless it is a whole number >= ``lo``."""
    if type(value) is int and lo <= value <= _EXACT_INT:  # a re-plan checks ~300 of these a replica
        return value
    try:
        x = float(value)
    except (TypeError, ValueError):
        x = math.nan
    if not x.is_integer() or x < lo:
        raise ValueError(f"{name} must be an integer >= {lo}, got {value!r}")
    return int(x)


# ---------------------------------------------------------------------------
# eq. (3): the CFR threshold


def _excess(v: float) -> float:
    """``v - ln(1 + v)`` without cancellation for small ``v`` (series below 1e-3)."""
    if v < 1e-3:
        # alternating series v^2/2 - v^3/3 + v^4/4 - ...; 12 terms reach 1e-36 at v=1e-3
        total = 0.0
        power = v * v
        for n in range(2, 14):
            total += (power / n) if n % 2 == 0 else -(power / n)
            power *= v
        return total
    return v - math.log1p(v)


def theta0_residual(theta: float, c: float) -> float:
    """Left side minus right side of eq. (3): ``theta/(1-theta) + ln(1-theta) - c``."""
    v = theta / (1.0 - theta)
    return _excess(v) - c


#: The largest ``c`` :func:`solve_theta0` takes (theta0 = 1 - 7e-7 there).
C_MAX = 1e6
#: Newton steps :func:`solve_theta0` allows (it takes 2-5 over the whole domain; a bound, not a tolerance).
_NEWTON_STEPS = 60
_EPS = sys.float_info.epsilon


def solve_theta0(c: float) -> float:
    """Unique root ``theta0`` in (0, 1) of ``theta/(1-theta) + ln(1-theta) = c``.

    ``c = p0 * alpha_p / alpha_d``. Substituting ``v = theta/(1-theta)`` turns the
    equation into ``v - ln(1+v) = c`` with ``v`` in ``(0, 2c + 1]``: a bracket
    always exists because ``2c + 1 - ln(2c + 2) >= c``. The left side is evaluated
    by series for small ``v`` so tiny ``c`` (where ``theta ~ sqrt(2c)``) stays exact.
    """
    c = check_range("c (= p0*alpha_p/alpha_d)", c, 1e-15, C_MAX)
    # Newton's method: the left side is increasing and convex in v, so from any v > 0 the first
    # step lands at or right of the root and every later one descends onto it, quadratically. From
    # the asymptotes (v ~ sqrt(2c) + 2c/3 for small c, v ~ c + ln(1 + v) for large c) it takes
    # 2-5 steps, where a bracketing solver (brentq) needs ~20 evaluations: a re-plan solves this once a replica.
    v = math.sqrt(2.0 * c) + 2.0 * c / 3.0 if c < 1.0 else c + math.log1p(c + math.log1p(c))
    v = _newton_step(v, c)  # now at or right of the root
    last = math.inf
    for _ in range(_NEWTON_STEPS):
        nxt = _newton_step(v, c)
        step = v - nxt
        # no more descent, or steps no longer shrinking quadratically: the root, to the rounding of
        # the left side (which cancels to ~2 eps / v relative where v is just above the series' range)
        if step <= 4.0 * _EPS * v or step > last / 2.0:
            v = min(v, nxt)
            break
        v, last = nxt, step
    return v / (1.0 + v)


def _newton_step(v: float, c: float) -> float:
    """One Newton step on ``v - ln(1 + v) = c`` (its derivative is ``v / (1 + v)``), kept above 0."""
    nxt = v - (_excess(v) - c) * (1.0 + v) / v
    return nxt if nxt > 0.0 else v / 2.0


def theta0(p0: float, alpha_p: float, alpha_d: float) -> float:
    """CFR threshold (Proposition 3.1) from the triple ``(p0, alpha_p, alpha_d)``."""
    p0 = check_range("p0", p0, 0.0, 1.0, lo_open=True)
    alpha_p = _positive("alpha_p", alpha_p)
    alpha_d = _positive("alpha_d", alpha_d)
    # A decode step fitted at the regression's floor (alpha_d ~ 1e-9 s: a few steps after a
    # controller restart) makes c astronomically large; theta0 -> 1 there, and the solver's
    # domain ends at 1e6 (theta0 = 1 - 7e-7), so c is held at that edge instead of raising:
    # the re-plan raised in the e2e controller-kill test.
    return solve_theta0(min(p0 * alpha_p / alpha_d, C_MAX))


# ---------------------------------------------------------------------------
# eq. (5): the IFR correction


def delta_theta(theta0: float, p0: float, eta: float, alpha_d: float, beta_d: float, n: int) -> float:
    """First-order IFR correction ``Delta theta`` (Theorem 3.2), unclamped.

    Positive for every ``eta > 0``; zero for a constant hazard.
    """
    t0 = check_range("theta0", theta0, 0.0, 1.0, lo_open=True, hi_open=True)
    p0 = check_range("p0", p0, 0.0, 1.0, lo_open=True)
    eta = _non_negative("eta", eta)
    alpha_d = _positive("alpha_d", alpha_d)
    beta_d = _non_negative("beta_d", beta_d)
    n = int_at_least("n", n, 1)
    if eta == 0.0:
        return 0.0
    z = -math.log1p(-t0)
    duration = z * (t0 / (1.0 - t0) - z / 2.0)
    per_token = (beta_d * n / alpha_d) * (z - t0)
    return eta * (1.0 - t0) ** 2 / (p0 * p0 * t0) * (duration + per_token)


@dataclass(frozen=True)
class ThetaStar:
    """``theta* = theta0 + Delta theta`` with the clamps applied, and the raw parts."""

    theta0: float
    delta_theta: float  # after clamping to [0, DELTA_THETA_MAX_FACTOR * theta0]
    theta_star: float  # after clamping to [THETA_MIN, THETA_MAX]


def theta_star(
    p0: float,
    eta: float,
    alpha_p: float,
    alpha_d: float,
    beta_d: float,
    n: int,
    *,
    theta_min: float = THETA_MIN,
    theta_max: float = THETA_MAX,
    delta_max_factor: float = DELTA_THETA_MAX_FACTOR,
) -> ThetaStar:
    """Threshold fraction with the seed authors' clamps.

    ``Delta theta`` is clamped to ``[0, delta_max_factor * theta0]`` because the
    expansion is first order in ``eta`` and overshoots for strongly increasing
    hazards; ``theta*`` to ``[theta_min, theta_max]`` so EB neither degenerates to
    prefill-first nor idles most of its slots.
    """
    t0 = theta0(p0, alpha_p, alpha_d)
    dt = delta_theta(t0, p0, eta, alpha_d, beta_d, n)
    dt = min(max(dt, 0.0), delta_max_factor * t0)
    ts = min(max(t0 + dt, theta_min), theta_max)
    return ThetaStar(theta0=t0, delta_theta=dt, theta_star=ts)


def k_star(theta: float, n: int) -> int:
    """``k = floor(theta * n)``, at least 1 and at most ``n``."""
    theta = check_range("theta", theta, 0.0, 1.0, lo_open=True)
    n = int_at_least("n", n, 1)
    # NOTE: the epsilon keeps exact products (0.5 * 10) from flooring one low.
    return max(1, min(n, math.floor(theta * n + 1e-9)))


# ---------------------------------------------------------------------------
# eq. (6): memory-safe batch size


def _check_n_star_inputs(
    kv_capacity: float, eps: float, p0: float, mu_l: float, theta0: float, max_num_seqs: int
) -> tuple[float, float, float, float, float, int]:
    return (
        _positive("kv_capacity", kv_capacity),
        check_range("eps", eps, 0.0, 1.0, lo_open=True, hi_open=True),
        check_range("p0", p0, 0.0, 1.0, lo_open=True),
        _positive("mu_l", mu_l),
        check_range("theta0", theta0, 0.0, 1.0, lo_open=True, hi_open=True),
        int_at_least("max_num_seqs", max_num_seqs, 1),
    )


def _mean_slot_tokens(p0: float, mu_l: float, theta0: float) -> float:
    """``D = mu_l + (1-theta0)/(theta0*p0) * ln(1/(1-theta0))``: mean KV tokens per slot at the peak."""
    return mu_l + (1.0 - theta0) / (theta0 * p0) * (-math.log1p(-theta0))


def _clamp_n(n: float, max_num_seqs: int) -> int:
    if not math.isfinite(n):
        return 1 if n < 0 else max_num_seqs
    return max(1, min(max_num_seqs, math.floor(n)))


def n_star_paper(kv_capacity: float, eps: float, p0: float, mu_l: float, theta0: float, max_num_seqs: int) -> int:
    """Memory-safe batch size, the paper's closed form (Proposition 3.3, eq. 6)."""
    c, eps, p0, mu_l, t0, cap = _check_n_star_inputs(kv_capacity, eps, p0, mu_l, theta0, max_num_seqs)
    return _n_star_paper(c, eps, p0, mu_l, cap, _mean_slot_tokens(p0, mu_l, t0))


def n_star_clt(kv_capacity: float, eps: float, p0: float, mu_l: float, theta0: float, max_num_seqs: int) -> int:
    """Memory-safe batch size, the CLT form the seed authors' code solves.

    Largest ``N`` with ``N*D + sigma*sqrt(N*ln(1/eps)) <= C`` where
    ``sigma^2 = 2*zeta*(1 + (p0*mu_l + zeta/theta0)^2) / p0^2``; a quadratic in
    ``sqrt(N)``.
    """
    c, eps, p0, mu_l, t0, cap = _check_n_star_inputs(kv_capacity, eps, p0, mu_l, theta0, max_num_seqs)
    return _n_star_clt(c, eps, p0, mu_l, t0, cap, _mean_slot_tokens(p0, mu_l, t0))


def n_stars(
    kv_capacity: float, eps: float, p0: float, mu_l: float, theta0: float, max_num_seqs: int
) -> tuple[int, int]:
    """``(n_star_paper(...), n_star_clt(...))`` of the same arguments, checked once (a plan sizes N with both)."""
    c, eps, p0, mu_l, t0, cap = _check_n_star_inputs(kv_capacity, eps, p0, mu_l, theta0, max_num_seqs)
    d = _mean_slot_tokens(p0, mu_l, t0)
    return _n_star_paper(c, eps, p0, mu_l, cap, d), _n_star_clt(c, eps, p0, mu_l, t0, cap, d)


def _n_star_paper(c: float, eps: float, p0: float, mu_l: float, cap: int, d: float) -> int:
    numerator = c - math.log(1.0 / eps) / (p0 * p0 * mu_l)
    return _clamp_n(numerator / d, cap)


def _n_star_clt(c: float, eps: float, p0: float, mu_l: float, t0: float, cap: int, d: float) -> int:
    z = -math.log1p(-t0)
    sigma = math.sqrt(2.0 * z * (1.0 + (p0 * mu_l + z / t0) ** 2)) / p0
    b = sigma * math.sqrt(math.log(1.0 / eps))
    x = (-b + math.sqrt(b * b + 4.0 * d * c)) / (2.0 * d)
    return _clamp_n(x * x, cap)


# ---------------------------------------------------------------------------
# throughput models


def beta_eb_weighted(beta_p: float, beta_d: float, mu_l: float, mu_o: float) -> float:
    """Workload-weighted per-token cost of EB: ``(beta_p*mu_l + beta_d*mu_o)/(mu_l+mu_o)``."""
    beta_p = _non_negative("beta_p", beta_p)
    beta_d = _non_negative("beta_d", beta_d)
    mu_l = _positive("mu_l", mu_l)
    mu_o = _positive("mu_o", mu_o)
    return (beta_p * mu_l + beta_d * mu_o) / (mu_l + mu_o)


def _finite3(a: float, b: float, c: float) -> bool:
    return -_INF < a < _INF and -_INF < b < _INF and -_INF < c < _INF


def beta_mb(r: float, coeffs: Sequence[float]) -> float:
    """Mixed-step per-token cost ``a + b*r + c*r^2`` at decode share ``r``."""
    if type(r) is float and 0.0 <= r <= 1.0 and len(coeffs) == 3:  # the common case, answered as below
        a, b, c = coeffs
        if type(a) is float and type(b) is float and type(c) is float and _finite3(a, b, c):
            return a + b * r + c * r * r
    r = check_range("r", r, 0.0, 1.0)
    if len(coeffs) != 3:
        raise ValueError(f"beta_mb must have 3 coefficients a,b,c, got {len(coeffs)}")
    a, b, c = (check_range(f"beta_mb[{i}]", x) for i, x in enumerate(coeffs))
    return a + b * r + c * r * r


def beta_mb_min(coeffs: Sequence[float]) -> tuple[float, float]:
    """``(r, beta_mb(r))`` at the minimum of the mixed-step cost curve over ``r`` in [0, 1].

    Exact: the minimum of a quadratic on an interval is at an end or, for a convex
    curve (``c > 0``), at its vertex ``-b / 2c`` when that lies inside. A check at a
    few sample points is not enough: a convex curve can be >= 0 at r = 0, 0.5, 1
    and negative in between.
    """
    candidates = [0.0, 1.0]
    _, b, c = coeffs
    if c > 0 and 0.0 < -b / (2.0 * c) < 1.0:
        candidates.append(-b / (2.0 * c))
    return min(((r, beta_mb(r, coeffs)) for r in candidates), key=lambda rv: rv[1])


def _eb_inputs(
    alpha_p: float, alpha_d: float, beta_p: float, beta_d: float, mu_l: float, mu_o: float
) -> tuple[float, float, float, float, float, float]:
    """The cost model's and the workload's arguments of :func:`tp_eb`, checked (in this order)."""
    return (
        _positive("alpha_p", alpha_p),
        _positive("alpha_d", alpha_d),
        _non_negative("beta_p", beta_p),
        _non_negative("beta_d", beta_d),
        _positive("mu_l", mu_l),
        _positive("mu_o", mu_o),
    )


def tp_eb(
    k: int,
    n: int,
    alpha_p: float,
    alpha_d: float,
    beta_p: float,
    beta_d: float,
    mu_l: float,
    mu_o: float,
    budget: float | None = None,
    cycle_s: float = 0.0,
) -> float:
    """EB(k) throughput in requests/s (fluid limit, seed §3.2.1).

    A cycle is one prefill phase admitting ``k`` requests - ``ceil(k mu_L / budget)``
    prefill steps when the step token budget chunks it - and the decode steps until
    ``k`` of the ``n`` slots free: ``-mu_d ln(1 - k/n)`` for memoryless departures,
    the same as Little's law ``k mu_d / (n - k/2)`` to second order in ``k/n`` for
    any length distribution. ``mu_d = mu_O - 1`` decode steps a request: its first
    token comes with its prefill step (vLLM, and the simulator). Without ``budget``
    (and with ``mu_O`` for ``mu_d``) this is the paper's formula. ``cycle_s``: seconds a
    cycle costs beyond its steps (a phase-switch cost the controller measured).
    """
    # one threshold of tp_eb_many, its checks in the same order and its arithmetic written out, without the
    # lists (a plan prices a threshold alone a few times)
    n = int_at_least("n", n, 2)
    k = int_at_least("k", k, 1)
    if k >= n:
        raise ValueError(f"k must be in [1, n-1] = [1, {n - 1}], got {k}")
    alpha_p, alpha_d, beta_p, beta_d, mu_l, mu_o = _eb_inputs(alpha_p, alpha_d, beta_p, beta_d, mu_l, mu_o)
    if budget is None:
        mu_d, prefill = mu_o, alpha_p + cycle_s
    else:
        mu_d, tokens = max(mu_o - 1.0, 1e-9), k * mu_l
        prefill = alpha_p + cycle_s if tokens <= budget else math.ceil(tokens / budget) * alpha_p + cycle_s
    fixed = prefill - alpha_d * mu_d * math.log1p(-k / n)
    return 1.0 / (fixed / k + beta_p * mu_l + beta_d * mu_d)


def tp_eb_many(
    ks: Sequence[int],
    n: int,
    alpha_p: float,
    alpha_d: float,
    beta_p: float,
    beta_d: float,
    mu_l: float,
    mu_o: float,
    budgets: Sequence[float | None],
    cycle_s: float = 0.0,
) -> list[float]:
    """:func:`tp_eb` at each threshold of ``ks`` (with its step budget of ``budgets``), the arguments they
    share checked once: the latency rule (:func:`ebplus.controller.latency.choose_k`) prices ~50 thresholds
    a plan, and checking the same eight arguments for each was most of a replica's re-plan. The same
    arithmetic, in the same order, as one :func:`tp_eb` call per threshold: the same floats."""
    n = int_at_least("n", n, 2)
    if ks and set(map(type, ks)) == {int} and min(ks) >= 1 and max(ks) < min(n, _EXACT_INT + 1):
        checked = list(ks)  # what the loop below makes of them, at the cost of three passes in C
    else:
        checked = []
        for k in ks:
            k = int_at_least("k", k, 1)
            if k >= n:
                raise ValueError(f"k must be in [1, n-1] = [1, {n - 1}], got {k}")
            checked.append(k)
    alpha_p, alpha_d, beta_p, beta_d, mu_l, mu_o = _eb_inputs(alpha_p, alpha_d, beta_p, beta_d, mu_l, mu_o)
    # Per threshold: mu_d = mu_o unchunked (budget None), else mu_o - 1 (at least 1e-9); steps = 1 when the k
    # prompts fit the budget, else ceil(k mu_L / budget); then
    #   fixed = steps * alpha_p + cycle_s - alpha_d * mu_d * log1p(-k/n)
    #   tp    = 1 / (fixed / k + beta_p * mu_l + beta_d * mu_d)
    # The products of shared operands are hoisted: each is the first operation of its (left-to-right)
    # expression, so every float is the one tp_eb's own evaluation gives. 1 * alpha_p is alpha_p exactly.
    log1p, ceil = math.log1p, math.ceil
    one_step = alpha_p + cycle_s
    per_token = beta_p * mu_l
    mu_d_chunked = max(mu_o - 1.0, 1e-9)
    ad_whole, bd_whole = alpha_d * mu_o, beta_d * mu_o
    ad_chunked, bd_chunked = alpha_d * mu_d_chunked, beta_d * mu_d_chunked
    out = []
    for k, budget in zip(checked, budgets, strict=True):
        if budget is None:
            fixed = one_step - ad_whole * log1p(-k / n)
            out.append(1.0 / (fixed / k + per_token + bd_whole))
            continue
        tokens = k * mu_l
        if tokens <= budget:
            fixed = one_step - ad_chunked * log1p(-k / n)
        else:
            fixed = ceil(tokens / budget) * alpha_p + cycle_s - ad_chunked * log1p(-k / n)
        out.append(1.0 / (fixed / k + per_token + bd_chunked))
    return out


@dataclass(frozen=True)
class MixedSteps:
    """How MB's steps divide at a given concurrency (see :func:`mb_steps`)."""

    tp: float  # requests/s
    share: float  # fraction of steps that carry prompt tokens (mixed steps)
    r: float  # decode share of a mixed step's tokens
    prefill_steps: float = 1.0  # steps a prompt is chunked over
    mixed_s: float = 0.0  # seconds of a mixed step
    decode_s: float = 0.0  # seconds of a decode-only step


def mb_steps(
    n: int,
    alpha_mb: float,
    beta_mb_coeffs: Sequence[float],
    alpha_d: float,
    beta_d: float,
    mu_l: float,
    mu_o: float,
    budget: float | None = None,
) -> MixedSteps:
    """MB's steady state with ``n`` running requests, priced with the mix of step kinds it runs.

    A request holds its slot for ``s_p`` prefill steps (its prompt chunked into what the
    decodes leave of the budget) and ``mu_O - 1`` decode steps, so ``X = n / (s_p + mu_O - 1)``
    requests start and finish per step. Every step decodes ``D = X (mu_O - 1)`` tokens; a
    step carries prompt tokens only while some admission is prefilling: a share
    ``f = 1 - exp(-X s_p)`` of the steps (Poisson admissions). Those are mixed steps
    (``alpha_mb + beta_mb(r) (D + X mu_L / f)``); the rest are decode-only
    (``alpha_d + beta_d D``). When ``n < 1 + mu_O`` most steps admit nothing: pricing every
    step as mixed (the paper's steady state, the ``f -> 1`` limit) overstated MB by up to
    3x at low concurrency (H200, paper workload, c = 8..128).
    """
    n = int_at_least("n", n, 1)
    alpha_mb = _positive("alpha_mb", alpha_mb)
    alpha_d = _positive("alpha_d", alpha_d)
    beta_d = _non_negative("beta_d", beta_d)
    mu_l = _positive("mu_l", mu_l)
    mu_o = _positive("mu_o", mu_o)
    decode_steps = max(mu_o - 1.0, 0.0)
    s_p = 1.0
    for _ in range(8):  # the prefill's share of the budget depends on the decodes, which depend on s_p
        x = n / (s_p + decode_steps)
        room = (budget or math.inf) - x * decode_steps
        previous, s_p = s_p, max(1.0, mu_l / room) if room > 1.0 else max(1.0, mu_l)
        if s_p == previous:  # a fixed point: every later pass computes the same s_p
            break
    x = n / (s_p + decode_steps)
    decodes, prompts = x * decode_steps, x * mu_l
    share = -math.expm1(-x * s_p)
    mixed_tokens = decodes + prompts / share
    r = decodes / mixed_tokens
    b = beta_mb(r, beta_mb_coeffs)
    if b < 0:
        raise ValueError(f"beta_mb(r={r:.3f}) must be >= 0, got {b:g}")
    mixed_s, decode_s = alpha_mb + b * mixed_tokens, alpha_d + beta_d * decodes
    step = share * mixed_s + (1.0 - share) * decode_s
    return MixedSteps(tp=x / step, share=share, r=r, prefill_steps=s_p, mixed_s=mixed_s, decode_s=decode_s)


@dataclass(frozen=True)
class Crossover:
    """Both modes' predicted cost, so every decision can be explained.

    ``t_eb``, ``t_mb``: predicted seconds per token (prompt + output) of each mode;
    ``margin = t_eb - t_mb`` (s/token): positive favours MB. ``mb_mixed_share`` is the
    share of MB's steps that carry prompt tokens, ``mb_r`` their decode share.
    """

    t_eb: float
    t_mb: float
    margin: float
    winner: Winner
    tp_eb: float
    tp_mb: float
    mb_mixed_share: float
    mb_r: float


def crossover(
    k: int,
    n: int,
    alpha_p: float,
    alpha_d: float,
    beta_p: float,
    beta_d: float,
    beta_mb_coeffs: Sequence[float],
    mu_l: float,
    mu_o: float,
    alpha_mb: float | None = None,
    budget: float | None = None,
) -> Crossover:
    """Compare EB(k) with MB at ``n`` running requests.

    ``alpha_mb`` defaults to ``alpha_p`` (the authors' choice when unknown). Both modes
    are priced by their own steps: EB by :func:`tp_eb`, MB by the step mix of
    :func:`mb_steps`.
    """
    alpha_mb = alpha_p if alpha_mb is None else alpha_mb
    te = tp_eb(k, n, alpha_p, alpha_d, beta_p, beta_d, mu_l, mu_o, budget)
    mb = mb_steps(n, alpha_mb, beta_mb_coeffs, alpha_d, beta_d, mu_l, mu_o, budget)
    return crossover_of(te, mb, mu_l, mu_o)


def crossover_of(te: float, mb: MixedSteps, mu_l: float, mu_o: float) -> Crossover:
    """:func:`crossover` from its two prices: EB's throughput ``te`` (:func:`tp_eb`) and MB's steps ``mb``
    (:func:`mb_steps`), for a caller that has them already."""
    tokens = mu_l + mu_o
    t_eb, t_mb = 1.0 / (te * tokens), 1.0 / (mb.tp * tokens)
    return Crossover(
        t_eb=t_eb,
        t_mb=t_mb,
        margin=t_eb - t_mb,
        winner=Winner.MB if t_mb < t_eb else Winner.EB,
        tp_eb=te,
        tp_mb=mb.tp,
        mb_mixed_share=mb.share,
        mb_r=mb.r,
    )
