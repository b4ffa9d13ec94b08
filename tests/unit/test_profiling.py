"""``ebplus profile`` without an engine: config loading, the fit over recorded steps, the CLI wiring."""

from __future__ import annotations

import random
from pathlib import Path

import msgspec
import pytest

from ebplus.cli import main
from ebplus.controller.cost_model import CostModel
from ebplus.controller.messages import StepRecord
from ebplus.profiler import profiling
from ebplus.profiler.cli import _load_config
from ebplus.profiler.profiling import ProfilePlan

TRUE = CostModel(alpha_p=0.02, beta_p=3e-3, alpha_d=0.03, beta_d=1.8e-3, beta_mb=(3e-3, -1.5e-3, 4e-4), alpha_mb=0.025)


def synthetic_rows(model: CostModel, noise: float = 0.01, stalled: float = 0.3, seed: int = 0) -> list[StepRecord]:
    """Three repeats of every profiling shape; a fraction ``stalled`` slowed 3-30x (a shared machine)."""
    rng = random.Random(seed)
    shapes = [(p, 0) for p in ProfilePlan().prefill_lengths] + [(c * n, 0) for c, n in ProfilePlan().prefill_packs]
    shapes += [(0, d) for d in range(1, 65)]
    shapes += [(p, m) for m in (4, 16, 48) for p in (8, 32, 128, 512)]
    rows = []
    for p, d in shapes * 3:
        t = model.step_seconds(p, d) * (1 + abs(rng.gauss(0, noise)))
        if rng.random() < stalled:
            t *= rng.uniform(3, 30)
        rows.append(StepRecord(p, d, d + (p > 0), 0, t))
    return rows


def test_fit_recovers_the_cost_model_from_contaminated_rows() -> None:
    rows = synthetic_rows(TRUE)
    fit = profiling.fit_profile(rows)
    m = fit.model
    assert set(fit.fitted) == {"prefill", "decode", "mixed"}
    assert m.alpha_p == pytest.approx(TRUE.alpha_p, rel=0.25)
    assert m.beta_p == pytest.approx(TRUE.beta_p, rel=0.05)
    assert m.alpha_d == pytest.approx(TRUE.alpha_d, rel=0.1)
    assert m.beta_d == pytest.approx(TRUE.beta_d, rel=0.05)
    for r in (0.05, 0.5, 0.85):
        assert m.beta_mixed(r) == pytest.approx(TRUE.beta_mixed(r), rel=0.15)
    assert max(profiling.residuals(m, rows).values()) < 0.05


TRUE_KV = TRUE.model_copy(update={"beta_kv": 2e-6})


def sweep_rows_with_kv(model: CostModel, stalled: float = 0.3, seed: int = 0) -> list[StepRecord]:
    """Steps as the profiler records them, the decodes' KV reads included.

    Decode sweeps at two prompt lengths (the batch shrinks while the context grows, the
    confound the KV column resolves), mixed steps over long-lived decodes, prefill steps.
    """
    rng = random.Random(seed)
    plan = ProfilePlan()
    shapes: list[tuple[int, int, int]] = [(p, 0, 0) for p in plan.prefill_lengths]
    for prompt in plan.decode_prompts:
        ends = [2 + (plan.decode_steps - 2) * (i + 1) // 64 for i in range(64)]
        for age in range(plan.decode_steps):
            alive = sum(1 for e in ends if e > age)
            shapes.append((0, alive, alive * (prompt + age)))
    for m in plan.mixed_decodes:
        for age, length in enumerate(list(plan.mixed_prompts) * plan.mixed_repeats):
            shapes.append((length, m, m * (16 + 8 + age)))
    rows = []
    for p, d, kv in shapes * 3:
        t = model.step_seconds(p, d, kv) * (1 + abs(rng.gauss(0, 0.01)))
        if rng.random() < stalled:
            t *= rng.uniform(3, 30)
        rows.append(StepRecord(p, d, d + (p > 0), 0, t, kv))
    return rows


def test_fit_separates_kv_reads_from_the_batch_size() -> None:
    rows = sweep_rows_with_kv(TRUE_KV)
    m = profiling.fit_profile(rows).model
    assert m.beta_kv == pytest.approx(TRUE_KV.beta_kv, rel=0.15)
    assert m.alpha_d == pytest.approx(TRUE_KV.alpha_d, rel=0.1)
    assert m.beta_d == pytest.approx(TRUE_KV.beta_d, rel=0.15)
    assert max(profiling.residuals(m, rows).values()) < 0.05
    # the same steps from an engine that does not report KV reads: absorbed, and beta_kv stays 0
    blind = [msgspec.structs.replace(r, kv_tokens=0) for r in rows]
    assert profiling.fit_profile(blind).model.beta_kv == 0.0


def test_lower_envelope_keeps_the_fastest_repeat_of_each_shape() -> None:
    rows = [StepRecord(64, 0, 1, 0, 0.5), StepRecord(64, 0, 1, 0, 0.1), StepRecord(0, 8, 8, 0, 0.2)]
    assert profiling.lower_envelope(rows) == [StepRecord(64, 0, 1, 0, 0.1), StepRecord(0, 8, 8, 0, 0.2)]
    # the same batch reading another context is another shape
    kv_rows = [StepRecord(0, 8, 8, 0, 0.2, 800), StepRecord(0, 8, 8, 0, 0.3, 1600), StepRecord(0, 8, 8, 0, 0.25, 800)]
    assert profiling.lower_envelope(kv_rows) == kv_rows[:2]


def test_fit_refuses_missing_step_kinds() -> None:
    rows = [r for r in synthetic_rows(TRUE) if r.decode_tokens == 0]
    with pytest.raises(ValueError, match=r"could not fit \['decode', 'mixed'\]"):
        profiling.fit_profile(rows)


class Rounds:
    """Profiling rounds as the engine would record them: ``usable`` says which rounds leave a mixed
    step the fit can use (on a busy machine some do not)."""

    def __init__(self, usable: set[int]) -> None:
        self.usable, self.ran = usable, []

    def __call__(self, r: int, planned: int) -> list[StepRecord]:
        self.ran.append((r, planned))
        rows = synthetic_rows(TRUE, stalled=0.0, seed=r)
        return rows if r in self.usable else [row for row in rows if not (row.prefill_tokens and row.decode_tokens)]


def test_profiling_stops_at_the_planned_rounds_when_every_kind_fits() -> None:
    rounds = Rounds(usable={0, 1})
    steps = profiling.rounds_until_fitted(rounds, ProfilePlan(rounds=2, extra_rounds=2))
    assert rounds.ran == [(0, 2), (1, 2)]
    assert set(profiling.fit_profile(steps).fitted) == {"prefill", "decode", "mixed"}


def test_profiling_adds_rounds_until_the_mixed_steps_fit() -> None:
    rounds, said = Rounds(usable={3}), []
    steps = profiling.rounds_until_fitted(rounds, ProfilePlan(rounds=2, extra_rounds=3), said.append)
    assert rounds.ran == [(0, 2), (1, 2), (2, 3), (3, 4)]  # two extra rounds, the second one fits
    assert set(profiling.fit_profile(steps).fitted) == {"prefill", "decode", "mixed"}
    assert len(said) == 2 and "could not fit ['mixed']" in said[0] and "(1 of at most 3 extra)" in said[0]


def test_profiling_gives_up_after_its_extra_rounds() -> None:
    rounds = Rounds(usable=set())
    steps = profiling.rounds_until_fitted(rounds, ProfilePlan(rounds=1, extra_rounds=2))
    assert [r for r, _ in rounds.ran] == [0, 1, 2]
    with pytest.raises(ValueError, match=r"could not fit \['mixed'\]"):
        profiling.fit_profile(steps)


def test_load_config_drops_the_prior_profile_and_overrides_the_model(tmp_path: Path) -> None:
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(
        "model: {source: builtin:smollm2}\n"
        "engine: {max_num_seqs: 8, cpu_kv_cache_gib: 1}\n"
        "replicas: {accelerator: cpu, profile: not-made-yet, profiles: {X: y}}\n"
    )
    cfg = _load_config(cfg_file, "builtin:tiny")
    assert cfg.model.source == "builtin:tiny"
    assert cfg.engine.max_num_seqs == 8


def test_profile_is_registered(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["profile", "--help"])
    assert exc.value.code == 0
    assert "beta_mb(r)" in capsys.readouterr().out


def test_profile_bad_config_is_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("engine: {max_num_seqs: 1}\n")
    assert main(["profile", "--config", str(bad)]) == 2
    assert "engine.max_num_seqs" in capsys.readouterr().err
