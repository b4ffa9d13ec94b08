"""Simulator inputs: workload and schedule files, JSONL traces, profiles, and the CLI contract."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ebplus.cli import main
from ebplus.controller.cost_model import ProfileError, load_profile, profile_names, resolve_profile
from ebplus.simulator import workloads as wl
from ebplus.simulator.result import ESTIMATE_KEYS
from ebplus.simulator.sim import SimResult


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("lines", "needle"),
    [
        (['{"input_len": 10, "output_len": 5}', "{oops"], ":2: invalid JSON"),
        (['{"input_len": 10, "output_len": 5}', '{"input_len": 10}'], ":2: field 'output_len': missing"),
        (['{"input_len": 0, "output_len": 5}'], ":1: field 'input_len': must be an integer >= 1"),
        (['{"input_len": 3, "output_len": 2.5}'], ":1: field 'output_len': must be an integer"),
        (['{"input_len": 3, "output_len": 2, "tokens": 4}'], ":1: field 'tokens': unknown field"),
        (['{"input_len": 3, "output_len": 2, "arrival_s": -1}'], ":1: field 'arrival_s': must be a number"),
        (
            ['{"input_len": 3, "output_len": 2, "arrival_s": 1}', "", '{"input_len": 3, "output_len": 2}'],
            ":3: field 'arrival_s': given on some lines but not others",
        ),
        (
            ['{"input_len": 3, "output_len": 2, "arrival_s": 5}', '{"input_len": 3, "output_len": 2, "arrival_s": 1}'],
            ":2: field 'arrival_s'",
        ),
        (["[1, 2]"], ":1: expected an object"),
        ([], "no requests found"),
    ],
)
def test_trace_errors_name_file_line_and_field(tmp_path: Path, lines: list[str], needle: str) -> None:
    path = write(tmp_path / "t.jsonl", "\n".join(lines))
    with pytest.raises(ValueError) as err:
        wl.load_trace(path)
    assert str(err.value).startswith(str(path)) and needle in str(err.value)


def test_trace_replay_and_override(tmp_path: Path) -> None:
    rows = [{"input_len": 10 + i, "output_len": 3 + i, "arrival_s": 100.0 + 2 * i} for i in range(5)]
    path = write(tmp_path / "t.jsonl", "\n".join(json.dumps(r) for r in rows))
    reqs = wl.build_requests(wl.load_source(path), seed=0)
    assert reqs.input_len.tolist() == [10, 11, 12, 13, 14]
    np.testing.assert_allclose(reqs.phases[0].offsets_s, [0, 2, 4, 6, 8])
    closed = wl.build_requests(wl.load_source(path), seed=0, requests=3, concurrency=2)
    assert len(closed) == 3 and closed.phases[0].offsets_s is None and closed.phases[0].concurrency == 2


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (
            "name: x\ninput: {dist: fixed, mean: 4}\noutput: {dist: uniform, mean: 4, jitter: 2}\n",
            ":3: field 'output.jitter'",
        ),
        ("name: x\ninput: {dist: fixed, mean: 4}\noutput: {dist: gamma, mean: 4}\n", ":3: field 'output.dist'"),
        ("name: x\ninput: {dist: fixed}\noutput: {dist: fixed, mean: 4}\n", ":2: field 'input'"),
        (
            "phases:\n  - {workload: paper, concurrency: 3}\n  - {workload: paper, rate: 0}\n",
            ":3: field 'phases.1.rate'",
        ),
        ("name: x\n  bad: [\n", ":2: not valid YAML"),
    ],
)
def test_workload_file_errors_name_line_and_field(tmp_path: Path, text: str, needle: str) -> None:
    path = write(tmp_path / "w.yaml", text)
    with pytest.raises(ValueError) as err:
        wl.load_workload_file(path)
    assert str(err.value).startswith(str(path)) and needle in str(err.value)


def test_profile_file_errors_name_line_and_field(tmp_path: Path) -> None:
    good = resolve_profile("h200")
    text = "\n".join(f"{k}: {v}" for k, v in good.model_dump(exclude_none=True).items() if k != "description")
    bad = text.replace(f"alpha_d: {good.alpha_d}", "alpha_d: -1")
    path = write(tmp_path / "p.yaml", bad)
    lineno = bad.splitlines().index("alpha_d: -1") + 1
    with pytest.raises(ProfileError, match=rf"p\.yaml:{lineno}: field 'alpha_d'"):
        load_profile(path)


@pytest.mark.parametrize("name", wl.named_workloads())
def test_shipped_workloads_load_and_sample(name: str) -> None:
    reqs = wl.build_requests(wl.load_source(name), seed=1, requests=50)
    assert len(reqs) >= 50 and reqs.input_len.min() >= 1 and reqs.output_len.min() >= 1


def test_shipped_profiles() -> None:
    names = profile_names()
    assert {"h200", "rtx-pro-6000", "l40s", "b300"} <= set(names)
    for name in names:
        prof = resolve_profile(name)
        assert prof.name == name and prof.description
        # GPU profiles hold hundreds of thousands of KV tokens; the CPU one a few thousand
        assert prof.kv_capacity_tokens > (1_000 if name.startswith("cpu-") else 100_000)


def test_uniform_expected_mean_matches_samples() -> None:
    spec = wl.LengthSpec(dist="uniform", mean=256, jitter=0.5)
    assert spec.sample(np.random.default_rng(0), 200_000).mean() == pytest.approx(spec.expected_mean(), rel=2e-3)


def test_simulate_json_contract(capsys) -> None:
    argv = ["sim", "run", "--profile", "h200", "--workload", "paper", "--policy", "eb+", "--concurrency", "64",
            "--requests", "300", "--json"]  # fmt: skip
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert tuple(data) == (*SimResult.JSON_KEYS, "estimate", "first_estimate")  # an online policy's estimates
    for key in ("estimate", "first_estimate"):
        assert tuple(data[key]) == ESTIMATE_KEYS
        assert 200 < data[key]["mu_o"] < 500 and data[key]["theta_star"] > 0  # paper: mean output 256
    assert data["policy"] == "eb+" and data["requests"] == 300
    assert isinstance(data["preemptions"], int) and isinstance(data["n_final"], int)
    assert data["req_per_s"] == pytest.approx(300 / data["sim_seconds"])


def test_simulate_text_output(capsys) -> None:
    argv = ["sim", "run", "--profile", "rtx-pro-6000", "--workload", "concurrency-shift", "--policy", "eb",
            "--k", "8", "--requests", "50"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "throughput" in out and "phase 5" in out


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--policy", "mb", "--k", "3"], "--k applies to --policy eb"),
        (["--policy", "eb", "--profile", "nope"], "unknown profile 'nope'"),
        (["--policy", "eb", "--workload", "nope"], "unknown workload 'nope'"),
    ],
)
def test_simulate_bad_input_exit_2(capsys, extra: list[str], needle: str) -> None:
    argv = ["sim", "run", "--profile", "h200", "--workload", "paper", "--requests", "10", *extra]
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1 and needle in err
