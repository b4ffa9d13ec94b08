"""Length distributions for synthetic workloads (all return int64 arrays of lengths >= 1).

Used by the simulator's workloads and by the estimator tests, so the samplers
that test the estimator are the ones that drive the benchmarks.
"""

from __future__ import annotations

import numpy as np


def fixed(rng: np.random.Generator, mean: float, size: int) -> np.ndarray:
    """Every length equal to ``round(mean)``."""
    del rng
    return np.full(size, max(1, round(mean)), dtype=np.int64)


def uniform_jitter(rng: np.random.Generator, mean: float, jitter: float, size: int) -> np.ndarray:
    """Uniform integers on ``[mean*(1-jitter), mean*(1+jitter)]`` (the paper's +-50% workloads)."""
    if not 0 <= jitter < 1:
        raise ValueError(f"jitter must be in [0, 1), got {jitter}")
    lo = max(1, round(mean * (1 - jitter)))
    hi = max(lo, round(mean * (1 + jitter)))
    return rng.integers(lo, hi + 1, size=size, dtype=np.int64)


def geometric(rng: np.random.Generator, mean: float, size: int) -> np.ndarray:
    """Constant hazard ``1/mean`` on ``t = 1, 2, ...``."""
    if mean < 1:
        raise ValueError(f"geometric mean must be >= 1, got {mean}")
    return rng.geometric(1.0 / mean, size=size).astype(np.int64)


def lognormal(rng: np.random.Generator, mean: float, sigma: float, size: int) -> np.ndarray:
    """Log-normal with the given mean and log-space ``sigma``, rounded up to integers."""
    mu = np.log(mean) - sigma * sigma / 2.0
    return np.maximum(1, np.ceil(rng.lognormal(mu, sigma, size=size))).astype(np.int64)


def linear_hazard(rng: np.random.Generator, p0: float, eta: float, size: int) -> np.ndarray:
    """Discrete lengths with hazard ``P(O = t | O >= t) = min(1, p0 + eta*t)``.

    Sampled exactly by inverting the CDF ``1 - prod_{s<=t} (1 - h(s))``.
    """
    if not (0 < p0 <= 1) or eta < 0:
        raise ValueError(f"need 0 < p0 <= 1 and eta >= 0, got p0={p0}, eta={eta}")
    # survival drops below 1e-12 by t_max: p0*t + eta*t^2/2 >= 28 (or h reaches 1)
    t_max = int(np.ceil(28.0 / p0)) if eta == 0 else int(np.ceil((-p0 + np.sqrt(p0 * p0 + 56.0 * eta)) / eta))
    if eta > 0:
        t_max = min(t_max, int(np.ceil((1 - p0) / eta)) + 1)
    t = np.arange(1, t_max + 1)
    h = np.minimum(1.0, p0 + eta * t)
    survival = np.cumprod(1.0 - h)
    cdf = 1.0 - survival
    cdf[-1] = 1.0
    return (np.searchsorted(cdf, rng.random(size), side="right") + 1).astype(np.int64)


def mean_linear_hazard(p0: float, eta: float) -> float:
    """Exact mean of :func:`linear_hazard` (sum of the survival function)."""
    t_max = 1_000_000
    t = np.arange(1, t_max + 1)
    survival = np.cumprod(1.0 - np.minimum(1.0, p0 + eta * t))
    return float(1.0 + survival.sum())
