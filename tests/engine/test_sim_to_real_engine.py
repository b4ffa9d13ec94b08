"""``python -m benchmarks.sim_to_real --quick``: the benchmark's whole path on the real engine, small.

Timings are never asserted (a shared machine); what must hold is the plumbing:
every cell and policy has measured and predicted figures, and every simulated run
served exactly the tokens its engine run served (the trace conversion, live).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine


def test_quick_run_compares_every_cell_on_the_engines_own_requests(smollm2_model: Path, tmp_path: Path) -> None:
    config = tmp_path / "local.yaml"
    config.write_text(
        f"model: {{id: smollm2-135m-instruct, source: {smollm2_model}}}\n"
        "engine: {dtype: float32, max_model_len: 2048, max_num_seqs: 64, max_num_batched_tokens: 2048,\n"
        "         enforce_eager: true, cpu_kv_cache_gib: 1}\n"
        "replicas: {accelerator: cpu}\n"
    )
    out = tmp_path / "sim-to-real.md"
    cmd = [sys.executable, "-m", "benchmarks.sim_to_real", "--quick", "--config", str(config), "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[sim-to-real] cell 1/2 chat" in proc.stdout  # progress output

    data = json.loads(out.with_suffix(".json").read_text())
    cells = {(c["cell"], c["policy"]): c for c in data["cells"]}
    assert set(cells) == {(cell, policy) for cell in ("chat", "fixed-length") for policy in ("mb", "eb-k2")}
    for cell in cells.values():
        assert len(cell["real"]) == len(cell["sim"]) == 2  # two rounds, each simulated
        for real, sim in zip(cell["real"], cell["sim"], strict=True):
            assert real["tokens"] == sim["tokens"] > 0
            assert real["total_tps"] > 0 and sim["total_tps"] > 0
        assert set(cell["errors"]) == {"total_tps", "ttft_p50_s", "tpot_p50_s"}
    # the fixed-length cell runs every request to its cap; chat stops on its own
    traces = sorted((tmp_path / "sim-to-real").glob("fixed-length-mb-*.jsonl"))
    assert traces
    lines = [json.loads(line) for line in traces[0].read_text().splitlines()]
    assert all(line["output_len"] == line["max_tokens"] + 1 for line in lines)

    table = out.read_text()
    for row in ("| chat | mb |", "| chat | eb-k2 |", "| fixed-length | mb |", "| fixed-length | eb-k2 |"):
        assert row in table
