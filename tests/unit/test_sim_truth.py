"""Costs only the simulator knows: the phase-switch cost and the mixed-step curve."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import yaml

from ebplus.controller import theory
from ebplus.controller.cost_model import HardwareProfile, ProfileError, load_profile, resolve_profile
from ebplus.simulator.sim import Policy, SimConfig, simulate
from ebplus.simulator.truth import SimProfile, TrueCosts
from ebplus.simulator.workloads import LengthSpec, Workload, build_requests

BASE = dict(name="t", kv_capacity_tokens=10**9, alpha_p=1e-3, beta_p=2e-5, alpha_d=6e-3, beta_d=3e-5,
            beta_mb=(2e-5, 2e-5, 1e-5), beta_kv=1e-8)  # fmt: skip
CURVE = ((0.0, 1e-5), (0.25, 2e-5), (1.0, 8e-5))


def test_curve_interpolates_linearly_between_points() -> None:
    tc = TrueCosts(mixed_curve=CURVE)
    assert tc.mixed_beta(0.0) == 1e-5 and tc.mixed_beta(1.0) == 8e-5
    assert tc.mixed_beta(0.125) == pytest.approx(1.5e-5)
    assert tc.mixed_beta(0.25) == pytest.approx(2e-5)
    assert tc.mixed_beta(0.625) == pytest.approx(5e-5)


def test_true_step_seconds_by_kind() -> None:
    plain = HardwareProfile(**BASE)
    prof = SimProfile(**BASE, truth=TrueCosts(phase_switch_s=0.004, mixed_curve=CURVE))
    # the controller's model leaves the truth out: identical to the plain profile's
    assert prof.cost_model() == plain.cost_model()
    assert prof.step_seconds(300, 100, 5000) == plain.step_seconds(300, 100, 5000)
    # exclusive steps: the model's price, plus the switch cost only when switching
    assert prof.true_step_seconds(500, 0) == plain.step_seconds(500, 0)
    assert prof.true_step_seconds(500, 0, switched=True) == pytest.approx(plain.step_seconds(500, 0) + 0.004)
    assert prof.true_step_seconds(0, 64, 9000, switched=True) == pytest.approx(plain.step_seconds(0, 64, 9000) + 0.004)
    # mixed steps: the curve instead of the quadratic, never a switch cost
    mixed = 1e-3 + (1e-5 + 1e-5 * 0.1 / 0.25) * 1000 + 1e-8 * 7000  # r = 100/1000
    assert prof.true_step_seconds(900, 100, 7000) == pytest.approx(mixed)
    assert prof.true_step_seconds(900, 100, 7000, switched=True) == pytest.approx(mixed)
    assert prof.true_step_seconds(0, 0, switched=True) == 0.0


@pytest.mark.parametrize(
    ("truth", "needle"),
    [
        ("  phase_switch_s: -0.001", "field 'truth.phase_switch_s'"),
        ("  mixed_curve: [[0.0, 1.0e-4]]", "at least 2 points"),
        ("  mixed_curve: [[0.1, 1.0e-4], [1.0, 2.0e-4]]", "must span r = 0 to r = 1"),
        ("  mixed_curve: [[0.0, 1.0e-4], [0.6, 2.0e-4], [0.5, 2.0e-4], [1.0, 3.0e-4]]", "point 2: r must increase"),
        ("  mixed_curve: [[0.0, 1.0e-4], [1.0, -2.0e-4]]", "point 1: cost must be >= 0"),
        ("  mixed_curve: [[0.0, .nan], [1.0, 2.0e-4]]", "point 0: r and cost must be finite"),
        ("  surprise: 1", "field 'truth.surprise'"),
    ],
)
def test_bad_truth_fields_name_file_line_and_field(tmp_path: Path, truth: str, needle: str) -> None:
    good = resolve_profile("h200")
    lines = [f"{k}: {v}" for k, v in good.model_dump(exclude_none=True).items() if k not in ("description", "beta_mb")]
    text = "\n".join([*lines, "beta_mb: [2.4e-05, 1.6e-05, 5.2e-06]", "truth:", truth]) + "\n"
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(ProfileError) as err:
        load_profile(path, SimProfile)
    msg = str(err.value)
    assert msg.startswith(f"{path}:") and needle in msg and "field 'truth" in msg


def _run(prof: HardwareProfile, policy: Policy, k: int | None = None) -> object:
    wl = Workload(name="w", input=LengthSpec(dist="uniform", mean=200, jitter=0.5),
                  output=LengthSpec(dist="uniform", mean=60, jitter=0.5))  # fmt: skip
    reqs = build_requests(wl, seed=2, requests=300, concurrency=24)
    return simulate(prof, reqs, SimConfig(policy=policy, k=k, n=32, budget=1024, record_steps=True))


@pytest.mark.parametrize("k", [1, 6])
def test_switch_cost_is_charged_once_per_phase_boundary(k: int) -> None:
    """Same steps with and without the cost (closed loop, fixed k): the run is longer by the cost per switch."""
    plain = _run(HardwareProfile(**BASE), Policy.EB, k)
    switch = _run(SimProfile(**BASE, truth=TrueCosts(phase_switch_s=0.002)), Policy.EB, k)
    phases = plain.step_log.phase
    assert switch.step_log.phase == phases and switch.steps == plain.steps
    boundaries = sum({a, b} == {"prefill", "decode"} for a, b in itertools.pairwise(phases))
    assert boundaries > 20
    assert switch.sim_seconds - plain.sim_seconds == pytest.approx(0.002 * boundaries, rel=1e-9)
    # each boundary step is longer by exactly the cost; no other step changes
    d = np.diff([0.0, *switch.step_log.t_end]) - np.diff([0.0, *plain.step_log.t_end])
    paid = np.flatnonzero(d > 1e-4)
    assert paid.size == boundaries
    assert all({phases[i - 1], phases[i]} == {"prefill", "decode"} for i in paid)


def test_mixed_curve_prices_mb_steps() -> None:
    plain = _run(HardwareProfile(**BASE), Policy.MB)
    prof = SimProfile(**BASE, truth=TrueCosts(mixed_curve=CURVE))
    curved = _run(prof, Policy.MB)
    log = plain.step_log
    assert curved.step_log.phase == log.phase
    pre, dec = np.array(log.prefill_tokens), np.array(log.decode_tokens)
    mixed = (pre > 0) & (dec > 0)
    assert mixed.sum() > 50
    n, r = pre + dec, dec / np.maximum(pre + dec, 1)
    extra = sum(
        (prof.truth.mixed_beta(ri) - theory.beta_mb(ri, prof.beta_mb)) * ni
        for ri, ni in zip(r[mixed], n[mixed], strict=True)
    )
    assert curved.sim_seconds - plain.sim_seconds == pytest.approx(extra, rel=1e-6)


def test_the_controllers_profile_type_refuses_truth(tmp_path: Path) -> None:
    """A serving deployment cannot load a simulator scenario: ``truth:`` is the simulator's alone."""
    good = resolve_profile("h200")
    data = good.model_dump(mode="json", exclude_none=True)
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump({**data, "truth": {"phase_switch_s": 0.01}}))
    with pytest.raises(ProfileError, match="field 'truth': Extra inputs are not permitted"):
        load_profile(path)
    assert load_profile(path, SimProfile).truth == TrueCosts(phase_switch_s=0.01)
