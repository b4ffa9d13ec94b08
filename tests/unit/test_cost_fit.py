"""The online cost-model fit: recovery under outliers, priors, bounds, bad steps."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from ebplus.controller import cost_fit
from ebplus.controller.cost_fit import CostModelFitter, robust_linear_fit
from ebplus.controller.cost_model import CostModel

TRUE = CostModel(alpha_p=2e-3, beta_p=3e-5, alpha_d=9e-3, beta_d=5e-5, beta_mb=(3e-5, 4e-5, 2e-5), alpha_mb=2.5e-3)


def synthetic_steps(rng: np.random.Generator, n: int, outlier_every: int = 0):
    for i in range(n):
        kind = i % 3
        if kind == 0:
            p, d = int(rng.integers(16, 4096)), 0
        elif kind == 1:
            p, d = 0, int(rng.integers(1, 512))
        else:
            d = int(rng.integers(1, 512))
            p = int(rng.integers(16, 4096))
        t = TRUE.step_seconds(p, d) * (1 + rng.normal(0, 0.01))
        if outlier_every and i % outlier_every == 0:
            t *= 8  # a GC pause
        yield p, d, t


def test_cost_fit_recovers_parameters_despite_outliers() -> None:
    rng = np.random.default_rng(11)
    prior = CostModel(alpha_p=1.0, beta_p=1.0, alpha_d=1.0, beta_d=1.0, beta_mb=(1.0, 0.0, 0.0))
    fitter = CostModelFitter(prior, window=4096)
    for p, d, t in synthetic_steps(rng, 3000, outlier_every=25):
        fitter.observe_step(p, d, t)
    fit = fitter.fit()
    m = fit.model
    assert fit.fitted == ("prefill", "decode", "mixed")
    assert m.alpha_p == pytest.approx(TRUE.alpha_p, rel=0.05)
    assert m.beta_p == pytest.approx(TRUE.beta_p, rel=0.02)
    assert m.alpha_d == pytest.approx(TRUE.alpha_d, rel=0.05)
    assert m.beta_d == pytest.approx(TRUE.beta_d, rel=0.05)
    assert m.alpha_mixed == pytest.approx(TRUE.alpha_mixed, rel=0.10)
    for r in (0.1, 0.5, 0.9):
        assert m.beta_mixed(r) == pytest.approx(TRUE.beta_mixed(r), rel=0.05)


def test_cost_fit_keeps_prior_without_data() -> None:
    fitter = CostModelFitter(TRUE, min_steps=20)
    for _ in range(5):
        fitter.observe_step(100, 0, 0.005)
    fit = fitter.fit()
    assert fit.model == TRUE and fit.fitted == ()


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((0, 0, 0.1), "at least one token"),
        ((1, 0, 0.0), "seconds"),
        ((1, 0, float("nan")), "seconds"),
        ((-1, 2, 0.1), "n_prefill"),
    ],
)
def test_cost_fitter_rejects_bad_steps(args: tuple, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        CostModelFitter(TRUE).observe_step(*args)


def test_robust_fit_ignores_gross_outliers() -> None:
    x = np.arange(1.0, 101.0)
    y = 2.0 + 0.5 * x
    y[::10] += 100.0
    coef = robust_linear_fit(np.column_stack([np.ones_like(x), x]), y)
    assert coef == pytest.approx([2.0, 0.5], rel=1e-3)


def test_step_seconds_kinds() -> None:
    assert TRUE.step_seconds(0, 0) == 0
    assert TRUE.step_seconds(100, 0) == pytest.approx(2e-3 + 100 * 3e-5)
    assert TRUE.step_seconds(0, 10) == pytest.approx(9e-3 + 10 * 5e-5)
    mixed = TRUE.step_seconds(30, 10)
    assert mixed == pytest.approx(2.5e-3 + 40 * TRUE.beta_mixed(0.25))
    assert list(itertools.islice(synthetic_steps(np.random.default_rng(0), 3), 3))


def test_mixed_fit_that_dips_below_zero_keeps_the_prior() -> None:
    """Mixed steps priced by a curve that is >= 0 at r = 0, 0.5, 1 but negative near r = 0.25:
    the fit finds that curve, which no CostModel accepts, so the prior's curve is kept
    (the fitter must never hand back a model that fails validation: the controller's
    re-plan raised on exactly this)."""
    dip = (9e-6, -8e-5, 1.6e-4)
    fitter = CostModelFitter(TRUE, min_steps=20, prior_sd=1e3)  # a weak prior: the data decide
    rng = np.random.default_rng(3)
    for _ in range(400):
        n = int(rng.integers(64, 2048))
        r = float(rng.uniform(0.0, 1.0))
        d = max(1, min(n - 1, round(r * n)))
        share = d / n
        fitter.observe_step(n - d, d, 2.5e-3 + n * (dip[0] + dip[1] * share + dip[2] * share * share))
    fit = fitter.fit()
    assert "mixed" not in fit.fitted
    assert fit.model.beta_mb == TRUE.beta_mb and fit.model.alpha_mb == TRUE.alpha_mb


def test_cost_fit_from_a_prior_with_zero_coefficients() -> None:
    """A restored fit whose per-token costs were pinned at their bound 0 is a valid prior.

    Its relative sd is 0; the prior weight must stay finite (it overflowed to inf, the
    least-squares solve got NaN and raised, and the controller's re-plans failed).
    """
    prior = CostModel(alpha_p=0.02, beta_p=0.0, alpha_d=0.02, beta_d=0.0, beta_mb=(1e-3, 0.0, 0.0), alpha_mb=0.02)
    fitter = CostModelFitter(prior, min_steps=20)
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 32))
        fitter.observe_step(0, n, 0.02 + 1e-3 * n * (1 + 0.05 * rng.random()), kv_tokens=n * int(rng.integers(10, 200)))
        p = int(rng.integers(16, 512))
        fitter.observe_step(p, 0, 0.02 + 1e-4 * p * (1 + 0.05 * rng.random()))
    fit = fitter.fit()
    assert {"prefill", "decode"} <= set(fit.fitted)
    m = fit.model
    assert all(np.isfinite(x) for x in (m.alpha_p, m.beta_p, m.alpha_d, m.beta_d, m.beta_kv))


def test_a_fixed_cost_fitted_to_zero_stops_at_the_floor() -> None:
    """Steps whose time is all per-token (no intercept in the data) leave alpha at 1% of the median
    step, not at the solver's edge: the closed forms divide by it (theory.theta0's c)."""
    from ebplus.controller.cost_fit import ALPHA_FLOOR

    fitter = CostModelFitter(TRUE, window=512, min_steps=20)
    sizes = np.arange(1, 257)
    for n in sizes:
        fitter.observe_step(0, int(n), 4e-5 * float(n))
        fitter.observe_step(int(16 * n), 0, 3e-6 * 16 * float(n))
    m = fitter.fit().model
    assert m.alpha_d == pytest.approx(ALPHA_FLOOR * float(np.median(4e-5 * sizes)), rel=0.05)
    assert m.alpha_p == pytest.approx(ALPHA_FLOOR * float(np.median(3e-6 * 16 * sizes)), rel=0.05)
    assert m.alpha_p / m.alpha_d < 1e3


@pytest.mark.parametrize("n", [1, 2, 5, 6, 2047, 2048])
def test_the_fits_median_is_numpys_to_the_last_bit(n: int) -> None:
    rng = np.random.default_rng(n)
    for scale in (1e-6, 1.0, 1e6):
        x = rng.standard_normal(n) * scale
        assert cost_fit._median(x) == float(np.median(x))


@pytest.mark.parametrize("n", [1, 2, 3, 4, 64, 2048])
def test_the_fits_median_of_tied_values_is_numpys_to_the_last_bit(n: int) -> None:
    """Residuals of steps of a few sizes tie a lot: the middle order statistics are found as np.median finds them."""
    rng = np.random.default_rng(n)
    for values in ((-1.0, 0.0, 1.0), (2.5,), (1e-3, 2e-3, 2e-3, 5e-3), (0.0, 0.0, 7.0)):
        x = rng.choice(values, n)
        assert cost_fit._median(x) == float(np.median(x))


def test_a_robust_fit_is_the_same_whether_or_not_a_bound_pins_a_coefficient(monkeypatch: pytest.MonkeyPatch) -> None:
    """Passes that pin nothing reuse the arrays built once for them; a pass that pins builds its own: a fit whose
    intercept falls below its bound (pinned) and one that stays above it both match a fit made without the reuse."""
    rng = np.random.default_rng(3)
    n = rng.integers(1, 1000, 500).astype(float)
    design = np.column_stack([np.ones_like(n), n])
    fit = {"prior": (2e-3, 2e-5), "prior_sd": (1e-3, 1e-5)}
    cases = [(intercept, lower, (intercept + 2e-5 * n) * rng.lognormal(0, 0.05, n.size))
             for intercept, lower in ((1e-3, 5e-3), (1e-3, 0.0), (5e-3, 1e-3))]  # fmt: skip
    got = [robust_linear_fit(design, y, lower=(lower, 0.0), **fit) for _, lower, y in cases]
    weighted_fit, reused = cost_fit._weighted_fit, []

    def without_reuse(xs, y, w, lb, pinned, unpinned=None):  # type: ignore[no-untyped-def]
        reused.append(unpinned is not None)
        return weighted_fit(xs, y, w, lb, pinned)

    monkeypatch.setattr(cost_fit, "_weighted_fit", without_reuse)
    plain = [robust_linear_fit(design, y, lower=(lower, 0.0), **fit) for _, lower, y in cases]
    assert [g.tolist() for g in got] == [p.tolist() for p in plain] and all(reused)
    assert [bool(g[0] == lower) for g, (_, lower, _) in zip(got, cases, strict=True)] == [True, False, False]


def test_the_convergence_test_answers_as_its_numpy_form() -> None:
    rng = np.random.default_rng(9)
    specials = [0.0, -0.0, 1e-300, 1.0, np.inf, -np.inf, np.nan]
    for _ in range(3000):
        p = int(rng.integers(1, 5))
        coef, previous = rng.standard_normal(p) * 10.0 ** rng.integers(-8, 3), rng.standard_normal(p)
        if rng.random() < 0.5:
            previous = coef + rng.standard_normal(p) * 10.0 ** rng.integers(-14, -4) * np.abs(coef)
        if rng.random() < 0.2:
            (coef if rng.random() < 0.5 else previous)[int(rng.integers(0, p))] = rng.choice(specials)
        with np.errstate(invalid="ignore"):
            expected = bool(np.max(np.abs(coef - previous)) <= 1e-6 * max(float(np.max(np.abs(coef))), 1e-300))
        assert cost_fit._settled(coef, previous) is expected
