"""``ebplus profile --quick`` on the tiny model: a real engine, a profile the simulator can load."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from ebplus.controller.cost_model import load_profile
from ebplus.controller.messages import StepRecord

pytestmark = pytest.mark.engine


def test_profile_quick_on_tiny_model(tiny_model: Path, tmp_path: Path) -> None:
    config = tmp_path / "tiny.yaml"
    config.write_text(
        f"model: {{id: tiny, source: {tiny_model}}}\n"
        "engine: {dtype: float32, max_model_len: 2048, max_num_seqs: 16, max_num_batched_tokens: 256,\n"
        "         enforce_eager: true, cpu_kv_cache_gib: 1}\n"
        "replicas: {accelerator: cpu}\n"
    )
    out, rows = tmp_path / "cpu-tiny.yaml", tmp_path / "steps.jsonl"
    cmd = [sys.executable, "-m", "ebplus.cli", "profile", "--config", str(config), "--quick"]
    cmd += ["--name", "cpu-tiny", "--out", str(out), "--steps-out", str(rows)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    profile = load_profile(out)
    assert profile.name == "cpu-tiny"
    assert profile.kv_capacity_tokens > 0
    assert min(profile.alpha_p, profile.alpha_d, profile.alpha_mixed) > 0
    assert "ebplus profile" in profile.description
    steps = [msgspec.json.decode(line, type=StepRecord) for line in rows.read_text().splitlines()]
    assert {s.kind for s in steps} == {"prefill", "decode", "mixed"}
    assert all(s.seconds > 0 for s in steps)
