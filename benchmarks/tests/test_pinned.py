"""The pinned research profiles (benchmarks/profiles): each reproduces the fact it was pinned to."""

from __future__ import annotations

import pytest

from benchmarks.pinned import MIXCURVE_PROFILE, SWITCH_PROFILE, mixcurve_check, sim_profile, switch_check
from ebplus.controller import theory
from ebplus.controller.cost_model import resolve_profile


def test_pinned_switch_profile_reproduces_the_papers_mb_lead() -> None:
    """h200-switch: MB / EB(k0*) at c = 32 in the pinned 1.22-1.26 (h200 itself: about 1.07)."""
    row = switch_check(requests=1000, seeds=(3,), sweep=False)
    assert row["k0"] == 1 and row["model_winner"] == "MB"
    assert 1.22 <= row["mb_over_eb"] <= 1.26


def test_pinned_mixcurve_profile_model_and_truth_disagree() -> None:
    """rtx-pro-6000-mixcurve at c = 512: the closed forms pick MB, the simulated truth EB."""
    row = mixcurve_check(requests=2000, seeds=(3,), ks=(11,))
    assert row["model_winner"] == "MB" and row["model_mb_over_eb"] > 1.05
    assert row["truth_winner"] == "eb" and row["truth_mb_over_eb"] < 0.95
    prof = sim_profile(MIXCURVE_PROFILE)
    for r in (1 / 9, 1 / 2, 8 / 9):  # the prior is the quadratic through the curve at the authors' three points
        assert theory.beta_mb(r, prof.beta_mb) == pytest.approx(prof.truth.mixed_beta(r), rel=1e-3)


def test_pinned_profiles_keep_the_calibrated_priors() -> None:
    h200, switch = resolve_profile("h200"), sim_profile(SWITCH_PROFILE)
    assert switch.cost_model() == h200.cost_model() and switch.kv_capacity_tokens == h200.kv_capacity_tokens
    rtx, mix = resolve_profile("rtx-pro-6000"), sim_profile(MIXCURVE_PROFILE)
    same = ("alpha_p", "beta_p", "alpha_d", "beta_d", "alpha_mb", "beta_kv", "kv_capacity_tokens")
    assert all(getattr(mix, f) == getattr(rtx, f) for f in same)
