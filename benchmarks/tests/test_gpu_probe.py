"""The step-cost probe on the CPU: its attention, its plan, its r* reading, and the whole run into a
profile the simulator loads (``make gpu-probe DEVICE=cpu``, the same script the GPU runs with
``--device cuda``)."""

from __future__ import annotations

import csv
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

torch = pytest.importorskip("torch")

from benchmarks import gpu_probe, gpu_probe_report  # noqa: E402
from benchmarks.gpu_probe_model import SHAPES, Decoder, ModelShape, Step, choose_backends  # noqa: E402
from benchmarks.gpu_probe_report import interference, knee, threshold_share  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SMALL = ModelShape("small", hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=96, vocab=128, layers=4)


def reference_attention(dec: Decoder, q, k, v, step: Step, per_seq: int):
    """Each head by itself; prompts attend causally to their own new K/V, each decode to its pages
    gathered one by one through its block table (blocks ``[i * per_seq, (i + 1) * per_seq)``)."""
    s, bs = dec.shape, dec.block_size
    group, scale = s.heads // s.kv_heads, 1.0 / math.sqrt(s.head_dim)
    out = torch.empty_like(q)
    offset = 0
    for n in step.prompts:
        mask = torch.triu(torch.ones(n, n, dtype=torch.bool), 1)
        for h in range(s.heads):
            scores = (q[offset : offset + n, h] @ k[offset : offset + n, h // group].T) * scale
            out[offset : offset + n, h] = (
                scores.masked_fill(mask, -math.inf).softmax(-1) @ v[offset : offset + n, h // group]
            )
        offset += n
    for b in range(step.batch):
        table = range(b * per_seq, (b + 1) * per_seq)
        slots = torch.tensor([blk * bs + t for blk in table for t in range(bs)][: step.context + 1])
        for h in range(s.heads):
            keys, values = dec.k_pool[0][slots, h // group], dec.v_pool[0][slots, h // group]
            out[offset + b, h] = ((q[offset + b, h] @ keys.T) * scale).softmax(-1) @ values
    return out


@pytest.mark.parametrize("step", [Step((20, 20, 7), 5, 37), Step((33,), 0, 0), Step((), 6, 16), Step((9,), 1, 0)])
def test_attention_reads_each_sequence_through_its_pages(step: Step) -> None:
    dec = Decoder(
        SMALL, 1, pool_blocks=step.blocks(8) + 4, block_size=8, device=torch.device("cpu"), dtype=torch.float32
    )
    choose_backends(dec)
    inp = dec.inputs(step, 64)
    g = torch.Generator().manual_seed(3)
    q = torch.randn(step.tokens, SMALL.heads, SMALL.head_dim, generator=g)
    k, v = (torch.randn(step.tokens, SMALL.kv_heads, SMALL.head_dim, generator=g) for _ in range(2))
    dec.k_pool[0].normal_(generator=g)  # the decodes' earlier context
    dec.v_pool[0].normal_(generator=g)
    dec.k_pool[0].index_copy_(0, inp.slots, k)  # what a layer writes before attention
    dec.v_pool[0].index_copy_(0, inp.slots, v)
    got = dec.attention(0, q, k, v, inp)
    want = reference_attention(dec, q, k, v, step, inp.per_seq)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    # each decode's new token lands at position `context` of its own pages; the prompts' tokens in
    # blocks of their own, past the decodes' (no write over a context that is read)
    bs, p = dec.block_size, step.prefill_tokens
    decode_slots = [(b * inp.per_seq + step.context // bs) * bs + step.context % bs for b in range(step.batch)]
    assert inp.slots[p:].tolist() == decode_slots
    prompt_slots = inp.slots[:p].tolist()
    assert len(set(prompt_slots)) == p and min(prompt_slots, default=math.inf) >= step.batch * inp.per_seq * bs


def test_a_step_scales_the_layer_stack_to_the_full_depth() -> None:
    dec = Decoder(SMALL, 2, pool_blocks=16, block_size=8, device=torch.device("cpu"), dtype=torch.float32)
    full, measured, stack = dec.step(dec.inputs(Step((12,), 3, 10), 32))
    assert 0 < stack < measured
    assert full == pytest.approx(measured + (SMALL.layers / 2 - 1) * stack)


def test_points_interleave_the_sweeps_and_hit_each_share() -> None:
    plan = gpu_probe.CPU_PLAN
    pts = gpu_probe.points_of(plan)
    assert [p.sweep for p in pts[:3]] == ["prefill", "decode", "mixed"]
    mixed = [p for p in pts if p.sweep == "mixed"]
    assert len(mixed) == len(plan.mixed_tokens) * len(plan.mixed_shares)
    for p in mixed:
        assert p.tokens in plan.mixed_tokens
        assert min(abs(p.share - r) for r in plan.mixed_shares) <= 0.5 / p.tokens
        assert all(n <= plan.prompt_len for n in p.prompts)
    assert {p.kind for p in mixed} == {"prefill", "decode", "mixed"}  # the curve's two ends are pure steps
    assert sorted(p.tokens for p in pts if p.sweep == "prefill") == sorted(plan.prefill_tokens)


def test_the_gpu_plan_fits_the_lent_machine() -> None:
    """The ``--device cuda`` plan by its own estimate: two runs of it (both shapes) within the 8
    minutes the issue allows even at the time budget, the H200's memory (141 GB), the paper's setting."""
    plan = gpu_probe.CUDA_PLAN
    shape = SHAPES[plan.model]
    pts = gpu_probe.points_of(plan)
    from benchmarks.gpu_probe_model import pool_blocks_for

    blocks = pool_blocks_for([Step(p.prompts, p.batch, p.context) for p in pts], plan.block_size)
    summary = gpu_probe.plan_summary(plan, shape, "cuda", 2, blocks)
    assert summary["estimated_s"] < plan.budget_s
    assert 2 * (plan.budget_s + gpu_probe.ROOFLINES["cuda"].startup) <= 480
    assert summary["memory_gib"] < 100
    assert plan.figure_tokens == 1024 and plan.prompt_len == 512 and shape.name == "llama-3.1-8b"
    assert 0.8 in plan.mixed_shares and plan.mixed_context == 512


def test_r_star_is_the_knee_of_a_hockey_stick() -> None:
    r = np.array([0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 1.0])
    t = 10 + 0.5 * r + 40 * np.maximum(0.0, r - 0.8)
    brk, below, above = knee(r, t)
    assert brk == pytest.approx(0.8, abs=0.01) and below == pytest.approx(0.5, abs=0.05) and above > 30
    assert interference(r, t)["r_star_knee"] == pytest.approx(0.8, abs=0.01)
    assert threshold_share(r, t) == pytest.approx(0.8 + (1.1 * 10 - 10 - 0.5 * 0.8) / 40.5, abs=0.01)
    straight = 10 + 5 * r  # rises all along, no bend: no knee, but it crosses 10% at r = 0.2
    assert interference(r, straight)["r_star_knee"] is None
    assert interference(r, straight)["r_star_10pct"] == pytest.approx(0.2)
    assert threshold_share(r, 10 - r) is None


@pytest.fixture(scope="module")
def probe_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One CPU probe run, as ``make gpu-probe DEVICE=cpu`` runs it (a subprocess), shortened to 3 repeats."""
    out = tmp_path_factory.mktemp("probe")
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.gpu_probe",
        "--device",
        "cpu",
        "--out",
        str(out),
        "--repeats",
        "3",
        "--warmup",
        "1",
    ]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return out, done.stdout


def test_cpu_probe_writes_a_profile_the_simulator_runs(
    probe_run: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """The whole pipeline: measure, fit with the project's fitter, load with its loader, simulate."""
    from ebplus.cli import main
    from ebplus.controller.cost_model import load_profile

    out, stdout = probe_run
    assert "plan (cpu, tiny" in stdout and "measured 47 points" in stdout
    rows = list(csv.DictReader((out / "points.csv").open()))
    assert len(rows) == 47 and {r["sweep"] for r in rows} == {"prefill", "decode", "mixed"}
    assert all(len(r["samples_s"].split()) == 3 for r in rows)
    run = yaml.safe_load((out / "run.yaml").read_text())
    assert run["plan"]["repeats"] == 3 and run["points_measured"] == 47 and not run["points_skipped"]

    profile = load_profile(out / "profile.yaml")
    assert profile.name == "gpu-probe-cpu-tiny" and profile.kv_capacity_tokens == run["kv_capacity_tokens"]
    for name in ("alpha_p", "beta_p", "alpha_d", "alpha_mb"):
        assert getattr(profile, name) > 0, name
    assert "fit_profile" in profile.description and "no CUDA graphs" in profile.description
    assert (out / "interference.png").stat().st_size > 10_000
    report = (out / "report.md").read_text()
    assert "## Interference threshold r*" in report and "## Fitted profile" in report

    capsys.readouterr()
    argv = ["sim", "run", "--profile", str(out / "profile.yaml"), "--workload", "paper", "--policy", "eb",
            "--concurrency", "32", "--requests", "300", "--json"]  # fmt: skip
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["policy"] == "eb" and result["requests"] == 300
    assert result["tok_per_s"] > 0 and result["ttft_p50_s"] > 0 and "estimate" in result


def test_without_the_project_the_report_keeps_the_points_and_plot(
    probe_run: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The GPU machine has PyTorch but not the project: the run still ends with its points, the
    plot and r*, and says how to fit later."""
    out, _ = probe_run
    for name in ("points.csv", "run.yaml"):
        shutil.copy(out / name, tmp_path / name)
    monkeypatch.setitem(sys.modules, "ebplus.controller.cost_model", None)  # import fails
    found = gpu_probe_report.make(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["interference.png", "points.csv", "run.yaml"]
    assert "profile" not in found and set(found["r_star"]) == set(gpu_probe.CPU_PLAN.mixed_tokens)
    assert "--report DIR" in capsys.readouterr().out
