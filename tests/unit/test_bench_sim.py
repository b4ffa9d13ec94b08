"""``ebplus bench-sim --quick``: the grid runs end to end and writes its table, JSON and plots."""

from __future__ import annotations

import json
from pathlib import Path

from bench.bench_sim import POLICY_COLUMNS, SETTINGS
from ebplus.cli import main


def test_quick_grid_smoke(tmp_path: Path, capsys) -> None:
    out = tmp_path / "results"
    assert main(["bench-sim", "--quick", "--profiles", "h200", "--workers", "1", "--out", str(out)]) == 0
    capsys.readouterr()
    data = json.loads((out / "bench_sim.json").read_text())
    per = data["results"]["h200"]
    assert set(per) == {s.key for s in SETTINGS}
    for key, r in per.items():
        for col in POLICY_COLUMNS:
            assert r[col]["value"] > 0, (key, col)
        # the sweep includes k = 1, i.e. v0's threshold, at the same N
        assert r["eb-best"]["value"] >= 0.999 * min(r["v0"]["value"], max(r["sweep"][str(r["v0"]["n"])].values()))
    md = (out / "bench_sim.md").read_text()
    assert "| paper c=2048 |" in md and "Fluid limit" in md
    assert (out / "throughput_h200.png").stat().st_size > 10_000
    assert (out / "timeline_h200.png").stat().st_size > 10_000
    for row in data["fluid"]:
        assert abs(row["sim_req_s"] / row["theory_req_s"] - 1) < 0.02


def test_bench_sim_rejects_unknown_profile(capsys) -> None:
    assert main(["bench-sim", "--quick", "--profiles", "nope", "--out", "/tmp/unused"]) == 2
    assert "unknown profile 'nope'" in capsys.readouterr().err
