"""Online workload estimator and cost-model fitter."""

from __future__ import annotations

import numpy as np
import pytest

from ebplus.bench import distributions as dist
from ebplus.controller.estimator import WorkloadEstimator, fit_hazard


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
