"""The sim-to-real benchmark's pure parts: cells, policies, the diagnosis and the tables."""

from __future__ import annotations

import pytest

from benchmarks import sim_to_real_report as report
from benchmarks.sim_to_real import CELLS, Cell, PolicySpec, parse_args, scaled
from ebplus.controller.config import ControllerConfig
from ebplus.controller.cost_model import resolve_profile
from ebplus.controller.messages import Mode, StepRecord
from ebplus.simulator.sim import Policy
from ebplus.simulator.workloads import resolve_workload


def test_scaled_workload_keeps_its_shape() -> None:
    wl = scaled(resolve_workload("capped-all"), 1 / 4)
    assert (wl.input.dist, wl.input.mean, wl.input.jitter) == ("uniform", 128, 0.5)
    assert wl.max_tokens == 64 and wl.output.mean == 1024  # every request still runs to its cap
    assert scaled(resolve_workload("decode-heavy"), 1 / 8).output.mean == 128
    with pytest.raises(ValueError, match="cannot be scaled"):
        scaled(resolve_workload("ifr"), 0.5)


def test_every_cell_resolves_and_describes_itself() -> None:
    names = [c.name for c in CELLS]
    assert {"chat", "decode-heavy", "prefill-heavy", "fixed-length"} <= set(names) and len(set(names)) == len(names)
    for cell in CELLS:
        assert f"{cell.requests} requests, c = {cell.concurrency}" in cell.describe()
        if cell.source != "chat":
            cell.workload()
    assert "KV 5120 tokens" in Cell("x", "balanced", 8, 4, 0.25, kv_tokens=5120).describe()


def test_policies_map_to_the_simulators() -> None:
    ctl = ControllerConfig(update_every=16)
    mb, eb, auto = (PolicySpec.parse(p) for p in ("mb", "eb-k16", "auto"))
    assert (mb.mode, eb.mode, eb.k, auto.mode) == (Mode.MB, Mode.EB, 16, Mode.AUTO)
    cfg = eb.sim_config(n=64, budget=2048, telemetry_steps=4, controller=ctl)
    assert (cfg.policy, cfg.k, cfg.n, cfg.budget, cfg.controller) == (Policy.EB, 16, 64, 2048, None)
    cfg = auto.sim_config(n=64, budget=2048, telemetry_steps=4, controller=ctl)
    assert (cfg.policy, cfg.k, cfg.telemetry_steps, cfg.controller) == (Policy.EBPLUS, None, 4, ctl)
    for bad in ("eb", "eb-k0", "eb-kx", "v0"):
        with pytest.raises(ValueError, match="unknown policy"):
            PolicySpec.parse(bad)


def test_arguments_name_what_is_wrong(capsys: pytest.CaptureFixture) -> None:
    for argv, message in ((["--cells", "nope"], "unknown cell 'nope'"), (["--policies", "mb,x"], "unknown policy")):
        with pytest.raises(SystemExit):
            parse_args(argv)
        assert message in capsys.readouterr().err
    quick = parse_args(["--quick"])
    assert [c.name for c in quick.cell_list] == ["chat", "fixed-length"] and quick.repeats == 2
    assert [s.name for s in quick.specs] == ["mb", "eb-k2"]


def test_diagnosis_prices_the_engines_own_steps() -> None:
    cpu = resolve_profile("cpu-smollm2")
    steps = [StepRecord(512, 0, 4, 0, 0.7), StepRecord(0, 32, 32, 0, 0.1, 4096), StepRecord(100, 20, 21, 0, 0.2, 900)]
    d = report.diagnose(cpu, steps, [0.75, 0.11, 0.21, 0.03])
    model = sum(cpu.step_seconds(s.prefill_tokens, s.decode_tokens, s.kv_tokens) for s in steps)
    assert d.model_s == pytest.approx(model) and d.forward_s == pytest.approx(1.0)
    assert d.model_error == pytest.approx(model - 1.0)
    assert d.host_ms_per_step == pytest.approx(1e3 * 0.1 / 4)  # the empty fourth step counts
    assert d.kind_error("prefill") == pytest.approx(cpu.step_seconds(512, 0) / 0.7 - 1)


def figures(tps: float, ttft: float = 1.0, tpot: float = 0.1) -> report.Figures:
    return report.Figures(1000, tps, ttft, tpot, 10, {"decode": 10}, 100, 0)


def result(policy: str, real: list[float], sim: float, ttft_sim: float = 1.0) -> report.CellResult:
    d = report.Diagnosis(1.0, 1.0, 1.1, 10, {"decode": (1.0, 1.0)})
    return report.CellResult(
        "chat", "chat prompts", policy, [figures(t) for t in real], [figures(sim, ttft_sim)] * len(real),
        None, [d] * len(real), [1.0] * len(real), [None] * len(real), [{}] * len(real),
    )  # fmt: skip


def test_errors_are_against_the_median_and_flagged_past_the_tolerance() -> None:
    ok = result("mb", [100.0, 90.0, 120.0], 104.0)
    assert ok.measured("total_tps") == (100.0, 90.0, 120.0)
    assert ok.error("total_tps") == pytest.approx(0.04)
    off = result("eb-k4", [100.0, 99.0, 101.0], 90.0, ttft_sim=1.2)
    lines = report.main_table([ok, off])
    assert "| chat | mb | 104.0 | 100.0 (90.0–120.0) | +4.0% |" in lines[2]
    assert "**-10.0%**" in lines[3] and "**+20.0%**" in lines[3]
    versus = report.versus_table([ok, off])
    assert "| chat | 0.865 | 1.000 |" in versus[2]  # sim 90/104, real 100/100


def test_schedule_error_compares_the_simulated_time_with_the_profile_on_the_real_steps() -> None:
    # 1000 tokens simulated at 500 tok/s: 2 s; the profile prices the engine's own steps at 2.2 s,
    # so the simulator scheduled 10% less time than the engine's steps cost (whatever their measured time).
    d = report.Diagnosis(forward_s=5.0, model_s=2.2, wall_s=6.0, steps=10, by_kind={"decode": (5.0, 2.2)})
    r = report.CellResult(
        "chat", "chat prompts", "mb", [figures(150.0)], [figures(500.0)], None, [d], [1.0], [None], [{}]
    )
    assert r.schedule_error() == pytest.approx(0.1)
    assert r.as_json()["schedule_error"] == pytest.approx(0.1)
    assert "+10.0%" in report.why_table([r])[2]
