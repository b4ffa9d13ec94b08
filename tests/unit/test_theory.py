"""Closed forms of controller.theory: accuracy, shape, validation."""

from __future__ import annotations

import itertools
import math

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ebplus.controller import theory
from ebplus.controller.cost_model import CostModel

H200 = dict(alpha_p=1.2786e-3, beta_p=2.4853e-5, alpha_d=8.921e-3, beta_d=4.586e-5)
RTX = dict(alpha_p=4.691e-3, beta_p=5.008e-5, alpha_d=1.0376e-2, beta_d=1.0388e-4)
C_GRID = [10.0**e for e in range(-9, 4)] + [3e-9, 2.5e-5, 0.37, 7.0, 123.0, 999.0]


def exact_theta0(c: float) -> float:
    """Reference root with 50-digit arithmetic."""
    mpmath.mp.dps = 50
    f = lambda v: v - mpmath.log1p(v) - mpmath.mpf(c)  # noqa: E731
    v = mpmath.findroot(f, (mpmath.mpf(0), mpmath.mpf(2 * c + 1)), solver="anderson")
    return float(v / (1 + v))


@pytest.mark.parametrize("c", C_GRID)
def test_theta0_matches_high_precision_root(c: float) -> None:
    assert theory.solve_theta0(c) == pytest.approx(exact_theta0(c), rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("c", C_GRID)
def test_theta0_residual_of_eq3(c: float) -> None:
    th = theory.solve_theta0(c)
    assert 0 < th < 1
    # the left side is evaluated in floating point, so the residual scales with c
    assert abs(theory.theta0_residual(th, c)) < 1e-12 * max(1.0, c)


def test_theta0_is_monotone_in_c() -> None:
    values = [theory.solve_theta0(10.0**e) for e in [x / 4 for x in range(-36, 13)]]
    assert all(a < b for a, b in itertools.pairwise(values))


@pytest.mark.parametrize("c", [1e-9, 1e-8, 1e-7])
def test_theta0_small_c_asymptotics(c: float) -> None:
    # theta^2/2 + 2 theta^3/3 = c  =>  theta = sqrt(2c) (1 - (2/3) sqrt(2c) + ...)
    th = theory.solve_theta0(c)
    assert th == pytest.approx(math.sqrt(2 * c), rel=2 * math.sqrt(2 * c))


@pytest.mark.parametrize("c", [0.0, -1.0, math.nan, math.inf, -math.inf, "x"])
def test_theta0_rejects_bad_c(c: float) -> None:
    with pytest.raises(ValueError, match="c \\(= p0"):
        theory.solve_theta0(c)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        (dict(p0=0.0, alpha_p=1.0, alpha_d=1.0), "p0"),
        (dict(p0=math.nan, alpha_p=1.0, alpha_d=1.0), "p0"),
        (dict(p0=0.1, alpha_p=-1.0, alpha_d=1.0), "alpha_p"),
        (dict(p0=0.1, alpha_p=1.0, alpha_d=math.inf), "alpha_d"),
    ],
)
def test_theta0_error_names_parameter(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=f"^{name} must be in"):
        theory.theta0(**kwargs)


def test_delta_theta_zero_for_cfr_positive_for_ifr() -> None:
    t0 = theory.theta0(1 / 256, H200["alpha_p"], H200["alpha_d"])
    assert theory.delta_theta(t0, 1 / 256, 0.0, H200["alpha_d"], H200["beta_d"], 1024) == 0.0
    assert theory.delta_theta(t0, 1 / 256, 1e-6, H200["alpha_d"], H200["beta_d"], 1024) > 0


@settings(max_examples=300, deadline=None)
@given(
    p0=st.floats(1e-5, 0.5),
    eta=st.floats(1e-12, 1e-2),
    alpha_p=st.floats(1e-5, 1.0),
    alpha_d=st.floats(1e-5, 1.0),
    beta_d=st.floats(0.0, 1e-2),
    n=st.integers(1, 100_000),
)
def test_delta_theta_positive_property(p0, eta, alpha_p, alpha_d, beta_d, n) -> None:
    c = p0 * alpha_p / alpha_d
    if not 1e-15 <= c <= 1e6:
        return
    t0 = theory.solve_theta0(c)
    if not 0 < t0 < 1:
        return
    dt = theory.delta_theta(t0, p0, eta, alpha_d, beta_d, n)
    assert math.isfinite(dt) and dt > 0
    ts = theory.theta_star(p0, eta, alpha_p, alpha_d, beta_d, n)
    assert theory.THETA_MIN <= ts.theta_star <= theory.THETA_MAX
    assert 0 <= ts.delta_theta <= theory.DELTA_THETA_MAX_FACTOR * ts.theta0


def test_k_star_floor_and_bounds() -> None:
    assert theory.k_star(0.5, 10) == 5
    assert theory.k_star(0.001, 10) == 1
    assert theory.k_star(1.0, 10) == 10
    with pytest.raises(ValueError, match="theta"):
        theory.k_star(0.0, 10)
    with pytest.raises(ValueError, match="^n must be an integer"):
        theory.k_star(0.5, 0)


@pytest.mark.parametrize("method", [theory.n_star_paper, theory.n_star_clt])
def test_n_star_decreases_with_input_length(method) -> None:
    t0 = theory.theta0(1 / 256, H200["alpha_p"], H200["alpha_d"])
    values = [method(2_000_000, 0.01, 1 / 256, mu_l, t0, 100_000) for mu_l in (64, 128, 512, 1024, 4096)]
    assert all(a > b for a, b in itertools.pairwise(values)), values


@settings(max_examples=300, deadline=None)
@given(
    cap=st.floats(1e3, 1e8),
    eps=st.floats(1e-6, 0.5),
    p0=st.floats(1e-4, 0.2),
    mu_l=st.floats(1.0, 8192.0),
    c=st.floats(1e-6, 10.0),
    grow=st.floats(1.01, 4.0),
    max_num_seqs=st.integers(1, 10_000),
)
def test_n_star_properties(cap, eps, p0, mu_l, c, grow, max_num_seqs) -> None:
    t0 = theory.solve_theta0(c)
    for method in (theory.n_star_paper, theory.n_star_clt):
        n = method(cap, eps, p0, mu_l, t0, max_num_seqs)
        assert 1 <= n <= max_num_seqs
        assert method(cap * grow, eps, p0, mu_l, t0, max_num_seqs) >= n
    # NOTE: only the CLT form is monotone in mu_l everywhere. Eq. (6) subtracts
    # ln(1/eps)/(p0^2 mu_l), which shrinks as mu_l grows, so for tiny caches and
    # short prompts the paper's N* can rise with mu_l (e.g. C=1000, mu_l 1 -> 2).
    n = theory.n_star_clt(cap, eps, p0, mu_l, t0, max_num_seqs)
    assert theory.n_star_clt(cap, eps, p0, mu_l * grow, t0, max_num_seqs) <= n


def test_n_star_clt_satisfies_its_constraint() -> None:
    p0, mu_l, cap, eps = 1 / 256, 512.0, 2_000_000.0, 0.01
    t0 = theory.theta0(p0, H200["alpha_p"], H200["alpha_d"])
    n = theory.n_star_clt(cap, eps, p0, mu_l, t0, 10**9)
    z = -math.log1p(-t0)
    d = mu_l + (1 - t0) / (t0 * p0) * z
    sigma = math.sqrt(2 * z * (1 + (p0 * mu_l + z / t0) ** 2)) / p0

    def lhs(m: int) -> float:
        return m * d + sigma * math.sqrt(m * math.log(1 / eps))

    assert lhs(n) <= cap < lhs(n + 1)


def test_n_star_paper_closed_form_value() -> None:
    p0, mu_l, cap, eps = 1 / 256, 512.0, 2_000_000.0, 0.01
    t0 = theory.theta0(p0, H200["alpha_p"], H200["alpha_d"])
    expected = (cap - math.log(1 / eps) / (p0**2 * mu_l)) / (mu_l + (1 - t0) / (t0 * p0) * math.log(1 / (1 - t0)))
    assert theory.n_star_paper(cap, eps, p0, mu_l, t0, 10**9) == math.floor(expected)


@pytest.mark.parametrize("profile", [H200, RTX], ids=["h200", "rtx"])
@pytest.mark.parametrize("n", [256, 512, 1024, 4096])
@pytest.mark.parametrize(("mu_l", "mu_o"), [(512, 256), (128, 1024), (1024, 128)])
def test_tp_eb_at_k0_is_near_grid_optimum(profile: dict, n: int, mu_l: int, mu_o: int) -> None:
    p0 = 1 / mu_o
    args = (profile["alpha_p"], profile["alpha_d"], profile["beta_p"], profile["beta_d"], mu_l, mu_o)
    k0 = theory.k_star(theory.theta0(p0, profile["alpha_p"], profile["alpha_d"]), n)
    best = max(theory.tp_eb(k, n, *args) for k in range(1, n))
    assert theory.tp_eb(k0, n, *args) >= 0.995 * best


def test_tp_eb_rejects_k_at_or_above_n() -> None:
    with pytest.raises(ValueError, match="^k must be in"):
        theory.tp_eb(10, 10, 1e-3, 1e-2, 1e-5, 1e-5, 512, 256)


def test_tp_mb_grows_with_concurrency() -> None:
    values = [theory.mb_steps(n, 1e-3, (3e-5, 0, 0), 9e-3, 5e-5, 512, 256).tp for n in (8, 64, 512, 4096)]
    assert all(a < b for a, b in itertools.pairwise(values))


def test_mb_steps_are_mostly_decode_only_at_low_concurrency() -> None:
    """With fewer running requests than a request lives steps, most MB steps admit nothing."""
    args = (H200["alpha_p"], (2.494e-5, 5.193e-5, 1.478e-5), H200["alpha_d"], H200["beta_d"], 512, 256)
    low, high = theory.mb_steps(32, *args, budget=8192), theory.mb_steps(4096, *args, budget=8192)
    assert low.share == pytest.approx(1 - math.exp(-32 / 256), rel=1e-3) and high.share > 0.99
    # the paper's steady state (every step mixed) is the limit of a busy engine
    paper = 1 / (H200["alpha_p"] * 257 / 4096 + theory.beta_mb(256 / 768, args[1]) * 768)
    assert high.tp == pytest.approx(paper, rel=0.02)


def test_beta_eb_weighted() -> None:
    assert theory.beta_eb_weighted(1.0, 3.0, 1.0, 1.0) == 2.0
    with pytest.raises(ValueError, match="mu_o"):
        theory.beta_eb_weighted(1.0, 3.0, 1.0, 0.0)


def test_crossover_sides_are_consistent_with_throughputs() -> None:
    coeffs = (2.494e-5, 5.193e-5, 1.478e-5)
    for n in (32, 512, 2048):
        k = theory.k_star(theory.theta0(1 / 256, H200["alpha_p"], H200["alpha_d"]), n)
        xo = theory.crossover(k, n, H200["alpha_p"], H200["alpha_d"], H200["beta_p"], H200["beta_d"], coeffs, 512, 256)
        assert xo.margin == pytest.approx(1 / (768 * xo.tp_eb) - 1 / (768 * xo.tp_mb))
        # MB wins exactly when it has the higher modelled throughput
        assert (xo.winner is theory.Winner.MB) == (xo.tp_mb > xo.tp_eb)


def test_crossover_prefers_mb_when_mixing_is_free() -> None:
    # beta_mb equal to the EB weighted cost: MB saves the phase-switch fixed costs
    b = theory.beta_eb_weighted(H200["beta_p"], H200["beta_d"], 512, 256)
    xo = theory.crossover(
        10, 512, H200["alpha_p"], H200["alpha_d"], H200["beta_p"], H200["beta_d"], (b, 0, 0), 512, 256
    )
    assert xo.winner is theory.Winner.MB and xo.margin > 0


def test_beta_mb_validates() -> None:
    assert theory.beta_mb(0.5, (1.0, 2.0, 4.0)) == 3.0
    with pytest.raises(ValueError, match="^r must be in"):
        theory.beta_mb(1.5, (1.0, 2.0, 4.0))
    with pytest.raises(ValueError, match="3 coefficients"):
        theory.beta_mb(0.5, (1.0, 2.0))


@pytest.mark.parametrize("seed", range(5))
def test_beta_mb_min_is_the_minimum_on_the_interval(seed: int) -> None:
    rng = np.random.default_rng(seed)
    grid = np.linspace(0.0, 1.0, 2001)
    for _ in range(200):
        coeffs = tuple(float(x) for x in rng.normal(0.0, 1e-4, size=3))
        r, low = theory.beta_mb_min(coeffs)
        assert 0.0 <= r <= 1.0 and low == pytest.approx(theory.beta_mb(r, coeffs))
        assert low <= min(theory.beta_mb(float(x), coeffs) for x in grid) + 1e-15


def test_cost_model_rejects_a_curve_that_dips_below_zero_between_samples() -> None:
    # >= 0 at r = 0, 0.5 and 1, negative around its vertex r = 0.25
    dip = (9e-6, -8e-5, 1.6e-4)
    assert all(theory.beta_mb(r, dip) >= 0 for r in (0.0, 0.5, 1.0))
    with pytest.raises(ValueError, match=r"beta_mb\(r\) must be >= 0 on \[0, 1\]; -1e-06 at r=0.25"):
        CostModel(alpha_p=1e-3, beta_p=1e-5, alpha_d=1e-3, beta_d=1e-5, beta_mb=dip)


def test_theta0_of_a_decode_step_priced_near_zero_is_near_one_not_an_error() -> None:
    """A cost fit at its floor (alpha_d ~ 1e-9 s) must not make a re-plan raise: theta0 -> 1."""
    assert 0.999 < theory.theta0(0.02, 0.05, 7.5e-10) < 1.0


# -- the latency rule's throughput curve ---------------------------------------------------

H200_ARGS = (1.2786e-3, 8.921e-3, 2.4853e-5, 4.586e-5)  # alpha_p, alpha_d, beta_p, beta_d: tp_eb's order


def test_the_throughput_curve_is_tp_eb_at_each_threshold_to_the_last_bit() -> None:
    n = 1024
    ks = [1, 2, 7, 40, 100, 511, 1000, 1023]
    for budget in (None, 8192, 512.0):
        for mu_l, mu_o, cycle in ((512.0, 256.0, 0.0), (3000, 2, 2e-3), (1.5, 1.0, 0.0)):
            budgets = [budget if k % 2 else (budget or 4096) for k in ks]  # per-threshold budgets differ
            curve = theory.tp_eb_many(ks, n, *H200_ARGS, mu_l, mu_o, budgets, cycle)
            one_by_one = [theory.tp_eb(k, n, *H200_ARGS, mu_l, mu_o, b, cycle) for k, b in zip(ks, budgets, strict=True)]
            assert curve == one_by_one


def test_the_throughput_curve_refuses_bad_input_by_name_as_tp_eb_does() -> None:
    with pytest.raises(ValueError, match=r"k must be in \[1, n-1\]"):
        theory.tp_eb_many([5, 10], 10, *H200_ARGS, 512, 256, [None, None])
    with pytest.raises(ValueError, match="k must be an integer"):
        theory.tp_eb_many([0], 10, *H200_ARGS, 512, 256, [None])
    with pytest.raises(ValueError, match="alpha_p"):
        theory.tp_eb_many([1], 10, 0.0, *H200_ARGS[1:], 512, 256, [None])
    with pytest.raises(ValueError, match="mu_o"):
        theory.tp_eb(1, 10, *H200_ARGS, 512, float("nan"))
    with pytest.raises(ValueError):  # one budget per threshold
        theory.tp_eb_many([1, 2], 10, *H200_ARGS, 512, 256, [None])


@pytest.mark.parametrize("value", [1, 7, 2**53, 2**53 + 1, 10**18, 3.0, True, np.int64(5)])
def test_the_quick_integer_check_answers_as_the_full_one(value: object) -> None:
    x = float(value)  # type: ignore[arg-type]
    assert theory.int_at_least("k", value, 1) == int(x)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="k must be an integer >= 2"):
        theory.int_at_least("k", 1, 2)


@pytest.mark.parametrize("value", [1e-300, 2.5, float("inf"), float("nan"), 0.0, -1.0, np.float64(2.0), 3])
def test_the_quick_positive_check_answers_as_the_full_one(value: float) -> None:
    try:
        expected = theory.check_range("x", value, 0.0, math.inf, lo_open=True, hi_open=True)
    except ValueError:
        with pytest.raises(ValueError, match="x must be in"):
            theory._positive("x", value)
    else:
        assert theory._positive("x", value) == expected


def test_theta0_newton_stops_at_the_rounding_floor(monkeypatch: pytest.MonkeyPatch) -> None:
    """A handful of steps everywhere, also where the left side cancels (c ~ 1e-6..1e-4: v just above the series)."""
    steps = []
    step = theory._newton_step

    def counted(v: float, c: float) -> float:
        steps[-1] += 1
        return step(v, c)

    monkeypatch.setattr(theory, "_newton_step", counted)
    exponents = [e / 4 for e in range(-60, 25)] + [-6.5 + 3 * i / 400 for i in range(400)]
    for e in exponents:
        steps.append(0)
        theory.solve_theta0(10.0**e)
    assert max(steps) <= 6, max(steps)


# -- the quick paths answer as the checked, step-by-step forms ------------------------------


def _tp_eb_reference(k: int, n: int, alpha_p: float, alpha_d: float, beta_p: float, beta_d: float, mu_l: float,
                     mu_o: float, budget: float | None, cycle_s: float) -> float:  # fmt: skip
    """tp_eb's arithmetic written out once per threshold, in its documented order."""
    mu_d = mu_o if budget is None else max(mu_o - 1.0, 1e-9)
    tokens = k * mu_l
    steps = 1 if budget is None or tokens <= budget else math.ceil(tokens / budget)
    fixed = steps * alpha_p + cycle_s - alpha_d * mu_d * math.log1p(-k / n)
    per_request = fixed / k + beta_p * mu_l + beta_d * mu_d
    return 1.0 / per_request


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(2, 4096),
    mu_l=st.floats(1.0, 20_000.0),
    mu_o=st.floats(1.0, 5_000.0),
    budget=st.one_of(st.none(), st.floats(16.0, 100_000.0)),
    cycle=st.floats(-5e-4, 5e-3),
)
def test_the_throughput_curve_is_the_written_out_formula_to_the_last_bit(
    n: int, mu_l: float, mu_o: float, budget: float | None, cycle: float
) -> None:
    ks = sorted({1, max(1, n // 3), n - 1, *range(1, min(n, 9))})
    budgets = [budget if k % 3 else None for k in ks]
    curve = theory.tp_eb_many(ks, n, *H200_ARGS, mu_l, mu_o, budgets, cycle)
    reference = [_tp_eb_reference(k, n, *H200_ARGS, mu_l, mu_o, b, cycle) for k, b in zip(ks, budgets, strict=True)]
    assert curve == reference
    assert [theory.tp_eb(k, n, *H200_ARGS, mu_l, mu_o, b, cycle) for k, b in zip(ks, budgets, strict=True)] == reference


def test_the_throughput_curve_takes_thresholds_of_any_integer_type_as_the_checked_loop_does() -> None:
    n, args = 64, (*H200_ARGS, 512.0, 256.0)
    plain = theory.tp_eb_many([1, 5, 63], n, *args, [None] * 3)
    assert theory.tp_eb_many([True, np.int64(5), 63.0], n, *args, [None] * 3) == plain  # type: ignore[list-item]
    with pytest.raises(ValueError, match=r"k must be in \[1, n-1\]"):
        theory.tp_eb_many([1, 64], n, *args, [None] * 2)
    with pytest.raises(ValueError, match="k must be an integer"):
        theory.tp_eb_many([1.5], n, *args, [None])  # type: ignore[list-item]


@pytest.mark.parametrize(
    ("value", "lo", "hi", "lo_open", "hi_open"),
    [(0.5, 0.0, 1.0, False, False), (0.0, 0.0, 1.0, True, False), (1.0, 0.0, 1.0, False, True),
     (0.0, 0.0, 1.0, False, False), (-3.0, -math.inf, math.inf, False, False), (math.inf, 0.0, math.inf, False, False),
     (math.nan, -math.inf, math.inf, False, False), (2.0, 0.0, 1.0, False, False), (np.float64(0.5), 0.0, 1.0, True, True),
     (1, 0.0, 2.0, False, False), (True, 0.0, 2.0, False, False)],
)  # fmt: skip
def test_the_quick_range_check_answers_as_the_full_one(value: float, lo: float, hi: float, lo_open: bool,
                                                       hi_open: bool) -> None:  # fmt: skip
    inside = lo < value < hi or (value == lo and not lo_open) or (value == hi and not hi_open)
    if inside and math.isfinite(value):
        got = theory.check_range("x", value, lo, hi, lo_open=lo_open, hi_open=hi_open)
        assert got == float(value) and type(got) is float
    else:
        with pytest.raises(ValueError, match="x must be in"):
            theory.check_range("x", value, lo, hi, lo_open=lo_open, hi_open=hi_open)


def test_the_quick_mixed_cost_answers_as_the_checked_one() -> None:
    for r in (0.0, 0.25, 1.0, np.float64(0.3), 1):
        for coeffs in ((1e-5, 2e-5, -1e-6), [1e-5, 2e-5, 3e-6], (np.float64(1e-5), 2e-5, 3e-6)):
            a, b, c = (float(x) for x in coeffs)
            assert theory.beta_mb(r, coeffs) == a + b * float(r) + c * float(r) * float(r)  # type: ignore[arg-type]
    for bad_r, bad_coeffs, match in ((1.5, (1.0, 2.0, 4.0), "r must be"), (0.5, (1.0, math.inf, 4.0), r"beta_mb\[1\]"),
                                     (0.5, (1.0, 2.0), "3 coefficients")):  # fmt: skip
        with pytest.raises(ValueError, match=match):
            theory.beta_mb(bad_r, bad_coeffs)


def _mb_s_p_reference(n: int, mu_l: float, mu_o: float, budget: float | None) -> float:
    """mb_steps's prefill steps a prompt, iterated the full eight times."""
    decode_steps, s_p = max(mu_o - 1.0, 0.0), 1.0
    for _ in range(8):
        x = n / (s_p + decode_steps)
        room = (budget or math.inf) - x * decode_steps
        s_p = max(1.0, mu_l / room) if room > 1.0 else max(1.0, mu_l)
    return s_p


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(1, 4096),
    mu_l=st.floats(1.0, 50_000.0),
    mu_o=st.floats(1.0, 5_000.0),
    budget=st.one_of(st.none(), st.floats(16.0, 100_000.0)),
)
def test_mixed_batching_stops_iterating_at_a_fixed_point_with_the_same_answer(
    n: int, mu_l: float, mu_o: float, budget: float | None
) -> None:
    got = theory.mb_steps(n, 1.2786e-3, (2.494e-5, 5.193e-5, 1.478e-5), 8.921e-3, 4.586e-5, mu_l, mu_o, budget)
    assert got.prefill_steps == _mb_s_p_reference(n, mu_l, mu_o, budget)


@settings(max_examples=200, deadline=None)
@given(
    kv=st.floats(1.0, 1e9),
    eps=st.floats(1e-6, 0.5),
    p0=st.floats(1e-5, 1.0),
    mu_l=st.floats(1.0, 1e5),
    t0=st.floats(1e-4, 0.999),
    cap=st.integers(1, 4096),
)
def test_both_memory_safe_sizes_at_once_are_each_ones_own(
    kv: float, eps: float, p0: float, mu_l: float, t0: float, cap: int
) -> None:
    args = (kv, eps, p0, mu_l, t0, cap)
    assert theory.n_stars(*args) == (theory.n_star_paper(*args), theory.n_star_clt(*args))


def test_both_memory_safe_sizes_at_once_refuse_what_each_refuses() -> None:
    for bad, match in (((0.0, 0.01, 0.1, 10.0, 0.5, 8), "kv_capacity"), ((1e4, 1.0, 0.1, 10.0, 0.5, 8), "eps"),
                       ((1e4, 0.01, 0.1, 10.0, 1.0, 8), "theta0"), ((1e4, 0.01, 0.1, 10.0, 0.5, 0), "max_num_seqs")):  # fmt: skip
        for form in (theory.n_stars, theory.n_star_paper, theory.n_star_clt):
            with pytest.raises(ValueError, match=match):
                form(*bad)
