"""The GPU runbook's commands stay runnable: every step parses with its tool's own parser; the sim-vs-engine table.

The engine tier runs the same runbook end to end on the CPU (``tests/engine/test_gpu_runbook_engine.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import gpu_runbook, sim_vs_engine


@pytest.mark.parametrize("device_args", [[], ["--device", "cpu", "--quick"], ["--device", "gpu", "--quick"]])
def test_dry_run_checks_every_step(tmp_path: Path, device_args: list[str], capsys) -> None:
    steps = ",".join(gpu_runbook.STEPS)
    code = gpu_runbook.main(["--dry-run", "--out-dir", str(tmp_path), "--steps", steps, *device_args])
    out = capsys.readouterr().out
    assert code == 0
    assert "bash deploy/install.sh" in out
    for module in ("ebplus.cli profile", "benchmarks.engine_bench", "benchmarks.sim_vs_engine",
                   "benchmarks.e2e_bench", "ebplus.cli sim run"):  # fmt: skip
        assert module in out
    config = (tmp_path / "engine.yaml").read_text()
    assert "Qwen/Qwen2.5-0.5B-Instruct" in config if not device_args or "gpu" in device_args else "builtin:tiny" in config


def test_unknown_step_and_rejected_arguments_are_clear_errors(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        gpu_runbook.main(["--dry-run", "--out-dir", str(tmp_path), "--steps", "profile,train"])
    assert exc.value.code == 2
    assert "unknown step 'train'" in capsys.readouterr().err
    bad = gpu_runbook.Step("engine", ["python", "-m", "benchmarks.engine_bench", "--no-such-flag"])
    with pytest.raises(ValueError, match="engine_bench refuses its arguments"):
        gpu_runbook.check(bad)


def _engine_json(policies: list[str]) -> dict:
    inputs = [40 + 7 * (i % 9) for i in range(24)]
    outputs = [8 + 3 * (i % 9) for i in range(24)]
    meta = {"n": 16, "budget": 256, "concurrency": 12, "max_tokens": 32, "update_every": 8,
            "input_lens": inputs, "output_lens": outputs}  # fmt: skip
    rows = [{"policy": p, "total_tps": 1.0, "ttft_p50_s": 1.0, "tpot_p50_ms": 1.0} for p in policies]
    return {"meta": meta, "summary": rows}


def test_sim_vs_engine_replays_the_engine_request_set() -> None:
    engine = _engine_json(["stock", "mb", "eb-k4", "eb-theory-k2", "auto"])
    cells = sim_vs_engine.compare(engine, "cpu-smollm2")
    by = {c.policy: c.predicted for c in cells}
    assert by["stock"] == by["mb"]  # the same policy (MB) on the same requests
    assert by["eb-k4"] != by["mb"] and by["eb-k4"] != by["eb-theory-k2"]
    # measured = predicted: zero error, nothing marked; 10x off: marked
    for row in engine["summary"]:
        row.update(by[row["policy"]])
    engine["summary"][0]["total_tps"] *= 10
    text = sim_vs_engine.table(sim_vs_engine.compare(engine, "cpu-smollm2"))
    assert text.count("⚠") == 1 + 1  # the one bad cell and the legend
    assert "| mb | " in text and "+0.0%" in text


def test_sim_vs_engine_refuses_an_old_engine_json(tmp_path: Path, capsys) -> None:
    old = _engine_json(["mb"])
    del old["meta"]["input_lens"]
    path = tmp_path / "engine.json"
    path.write_text(json.dumps(old))
    with pytest.raises(SystemExit):
        sim_vs_engine.main(["--engine", str(path), "--profile", "cpu-smollm2"])
    assert "no request lengths" in capsys.readouterr().err
    with pytest.raises(ValueError, match="no simulator counterpart"):
        sim_vs_engine.sim_policy("v1")


def test_report_puts_measured_and_simulated_side_by_side(tmp_path: Path) -> None:
    book = gpu_runbook.Runbook("builtin:tiny", "cpu", True, tmp_path)
    (tmp_path / "paper-c8.json").write_text(
        json.dumps([{"mode": "mb", "total_tok_per_s": 100.0}, {"mode": "eb", "total_tok_per_s": 90.0}])
    )
    for policy, tps in (("mb", 110.0), ("eb", 88.0), ("ebplus", 109.0)):
        (tmp_path / f"sim-paper-c8-{policy}.json").write_text(json.dumps({"tok_per_s": tps}))
    (tmp_path / "sim-vs-engine.md").write_text("| policy |\n")
    text = gpu_runbook.report(book)
    assert "| 8 | 100 / 110 | 90 / 88 | – / 109 | 0.900 / 0.800 |" in text
    assert "Simulator vs engine" in text
