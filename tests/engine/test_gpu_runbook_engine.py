"""The GPU runbook end to end on this CPU (``--device cpu --quick``) on the tiny model: a real profile, a real
engine benchmark, the simulator on its request set and on the paper setting, and the report.

The ``paper`` step (three Ray Serve deployments per concurrency) is left to the runbook's users: its command
is checked against ``e2e_bench``'s parser by the unit tier, and the harness it drives by the e2e tier.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]


def test_runbook_quick_on_cpu(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "runbook"
    cmd = [sys.executable, "-m", "benchmarks.gpu_runbook", "--device", "cpu", "--quick", "--model", str(tiny_model)]
    cmd += ["--steps", "profile,engine,compare,paper-sim", "--out-dir", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=840)
    if proc.returncode != 0:  # both tails in full: an assertion's repr cuts the middle out of long text
        pytest.fail(f"runbook exit {proc.returncode}\n--- stdout ---\n{proc.stdout[-3000:]}\n--- stderr ---\n{proc.stderr[-5000:]}")
    report = (out / "report.md").read_text()
    assert "## Simulator vs engine" in report and "## The paper's setting" in report
    rows = [line for line in (out / "sim-vs-engine.md").read_text().splitlines() if line.startswith("| ")][1:]
    assert [r.split(" | ")[0].removeprefix("| ") for r in rows] == ["mb", "eb-k2", "eb-k8", "auto"]
    for row in rows:  # every cell a number: measured, predicted, error
        assert all(cell.strip() for cell in row.split("|")[1:-1])
    assert (out / "profile.yaml").exists() and (out / "engine.json").exists()
