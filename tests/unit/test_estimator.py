"""Online workload estimator and cost-model fitter."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from ebplus.bench import distributions as dist
from ebplus.controller.cost_model import CostModel
from ebplus.controller.estimator import CostModelFitter, WorkloadEstimator, fit_hazard, robust_linear_fit


def estimate_of(outputs: np.ndarray, censored: np.ndarray | None = None, inputs: np.ndarray | None = None):
    est = WorkloadEstimator(window=len(outputs), update_every=1, min_samples=1, clock=lambda: 42.0)
    inputs = np.full(len(outputs), 100) if inputs is None else inputs
    est.observe_many(inputs, outputs, censored)
    return est.update()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_linear_hazard_recovered_within_10_percent(seed: int) -> None:
    rng = np.random.default_rng(seed)
    outputs = dist.linear_hazard(rng, 0.004, 1e-5, 20_000)
    e = estimate_of(outputs)
    assert e.method == "wls"
    assert e.p0 == pytest.approx(0.004, rel=0.10)
    assert e.eta == pytest.approx(1e-5, rel=0.10)
    assert e.t_lo == 1 and e.t_hi == int(np.percentile(outputs, 95))
    assert e.timestamp == 42.0


@pytest.mark.parametrize("mean", [64, 256, 1024])
def test_geometric_gives_eta_near_zero(mean: int) -> None:
    rng = np.random.default_rng(7)
    e = estimate_of(dist.geometric(rng, mean, 20_000))
    assert e.p0 == pytest.approx(1 / mean, rel=0.05)
    # a hazard slope that would change the hazard by < 5% over the mean length
    assert e.eta * mean < 0.05 / mean


def test_censoring_at_cap_does_not_bias_p0() -> None:
    rng = np.random.default_rng(3)
    natural = dist.geometric(rng, 256, 20_000)
    cap = 300  # about 31% of requests hit the cap
    censored = natural > cap
    observed = np.minimum(natural, cap)
    assert censored.mean() > 0.25
    e = estimate_of(observed, censored)
    assert e.p0 == pytest.approx(1 / 256, rel=0.05)
    assert e.n_censored == int(censored.sum())
    assert e.mu_o == pytest.approx(observed.mean())
    # the naive estimate that treats capped requests as completions is biased
    naive = estimate_of(observed)
    assert abs(naive.p0 - 1 / 256) > abs(e.p0 - 1 / 256)


def test_fallback_when_everything_is_censored() -> None:
    p0, eta, _, _, method = fit_hazard(np.full(100, 50), np.ones(100, dtype=bool))
    assert method.startswith("fallback")
    assert eta == 0.0 and 0 < p0 <= 1


def test_fallback_when_too_few_points() -> None:
    p0, eta, *_, method = fit_hazard(np.array([5, 5, 5, 5]), np.zeros(4, dtype=bool))
    assert method.startswith("fallback") and p0 == pytest.approx(1 / 5) and eta == 0


def test_negative_slope_is_clipped_and_rate_pooled() -> None:
    # decreasing hazard: a mixture of short and long geometric lengths
    rng = np.random.default_rng(5)
    outputs = np.concatenate([dist.geometric(rng, 20, 5000), dist.geometric(rng, 2000, 5000)])
    e = estimate_of(outputs)
    assert e.eta == 0.0 and e.p0 > 0


def test_update_cadence_and_min_samples() -> None:
    est = WorkloadEstimator(window=500, update_every=100, min_samples=30)
    for i in range(29):
        est.observe(10, 10 + i)
    assert not est.update_due() and est.update() is None
    for i in range(70):
        est.observe(10, 10 + i)
    assert est.pending == 99 and not est.update_due()
    est.observe(10, 5)
    assert est.update_due()
    assert est.update() is not None and est.pending == 0 and est.updates == 1
    assert not est.update_due()


def test_window_slides() -> None:
    est = WorkloadEstimator(window=50, update_every=1, min_samples=1)
    for _ in range(100):
        est.observe(10, 1000)
    for _ in range(50):
        est.observe(20, 10)
    e = est.update()
    assert e.n_samples == 50 and e.mu_o == 10 and e.mu_l == 20


@pytest.mark.parametrize(
    ("args", "field"),
    [((0, 10), "input_len"), ((10, 0), "output_len"), ((10, 2.5), "output_len"), ((float("nan"), 3), "input_len")],
)
def test_observe_rejects_bad_lengths(args: tuple, field: str) -> None:
    est = WorkloadEstimator()
    with pytest.raises(ValueError, match=f"^{field}"):
        est.observe(*args)
    assert est.completions == 0


def test_state_round_trip() -> None:
    a = WorkloadEstimator(window=100, update_every=10, min_samples=5)
    for i in range(57):
        a.observe(5 + i, 1 + i % 13, censored=i % 7 == 0)
    a.update()
    b = WorkloadEstimator(window=100, update_every=10, min_samples=5)
    b.restore(a.state())
    assert b.state() == a.state()
    ea, eb = a.update(), b.update()
    assert (ea.p0, ea.eta, ea.mu_l, ea.mu_o) == (eb.p0, eb.eta, eb.mu_l, eb.mu_o)


# ---------------------------------------------------------------------------
# cost model

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
