"""Inter-token latency, stalls, SLO attainment and goodput of the simulator, on runs small enough to check by hand."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from ebplus.cli import main
from ebplus.controller.cost_model import HardwareProfile
from ebplus.simulator import workloads as wl
from ebplus.simulator.latency import N_BINS, SloTargets, histogram_percentile
from ebplus.simulator.result import SimResult
from ebplus.simulator.sim import Policy, SimConfig, simulate
from ebplus.simulator.truth import SimProfile, TrueCosts

# prefill steps cost 1 ms, decode steps 10 ms, whatever their size: every token time is a round number
FLAT = dict(name="flat", kv_capacity_tokens=10**6, alpha_p=1e-3, beta_p=0.0, alpha_d=1e-2, beta_d=0.0,
            beta_mb=(0.0, 0.0, 0.0))  # fmt: skip
BIN = 10 ** (1 / 200)  # a histogram percentile is within one bin of the truth


def two_requests(tmp_path: Path, switch: float = 0.0) -> SimResult:
    """A (5 output tokens) at t = 0; B (3 tokens) at 15 ms, admitted in a prefill step that pauses A (v0)."""
    path = tmp_path / "t.jsonl"
    path.write_text('{"input_len": 10, "output_len": 5, "arrival_s": 0}\n'
                    '{"input_len": 10, "output_len": 3, "arrival_s": 0.015}\n')  # fmt: skip
    prof = SimProfile(**FLAT, truth=TrueCosts(phase_switch_s=switch) if switch else None)
    slo = SloTargets(ttft_s=0.02, itl_s=0.02, tpot_s=0.013)
    return simulate(prof, wl.build_requests(wl.load_trace(path), seed=0), SimConfig(policy=Policy.V0, n=4, slo=slo))


def test_gaps_by_hand(tmp_path: Path) -> None:
    # A: first token 1 ms (prefill), then 11, 21 ms; B's prefill 21-22 ms; then 32, 42 ms for both
    res = two_requests(tmp_path)
    np.testing.assert_allclose(res.first_token_s, [0.001, 0.022])
    np.testing.assert_allclose(res.finish_s, [0.042, 0.042])
    np.testing.assert_allclose(res.stall_s, [0.011, 0.010])  # A waited through B's prefill step
    assert res.itl_hist.sum() == (5 - 1) + (3 - 1)
    assert res.itl_p50_s == pytest.approx(0.010, rel=BIN - 1)
    assert res.itl_p99_s == pytest.approx(0.011, rel=BIN - 1)
    assert res.stall_max_s == pytest.approx(0.011)
    assert res.stall_p99_s == pytest.approx(np.percentile([0.010, 0.011], 99))


def test_switch_cost_shows_as_a_stall_and_slo_by_hand(tmp_path: Path) -> None:
    # 5 ms per phase switch. A: prefill 0-1 ms, decode 1-16 ms (a switch); B arrived: its prefill 16-22 ms,
    # then decodes 22-37 ms (a switch), 37-47 ms (B done), 47-57 ms (A done)
    res = two_requests(tmp_path, switch=0.005)
    np.testing.assert_allclose(res.first_token_s, [0.001, 0.022])
    np.testing.assert_allclose(res.finish_s, [0.057, 0.047])
    np.testing.assert_allclose(res.stall_s, [0.021, 0.015])
    np.testing.assert_allclose(res.tpot_s, [(0.057 - 0.001) / 4, (0.047 - 0.022) / 2])
    data = res.as_json()
    # TTFT A 1 ms, B 7 ms: both meet 20 ms; stall A 21 ms misses 20 ms; TPOT A 14 ms misses 13 ms, B 12.5 ms meets
    assert data["slo"] == {"ttft_s": 0.02, "itl_s": 0.02, "tpot_s": 0.013}
    assert (data["ttft_attainment"], data["itl_attainment"], data["tpot_attainment"]) == (1.0, 0.5, 0.5)
    assert data["goodput_req_per_s"] == pytest.approx(1 / 0.057)  # B only, over the 57 ms run
    none = res.slo_report(None)
    assert none["ttft_attainment"] is None and none["goodput_req_per_s"] == pytest.approx(2 / 0.057)


def test_histogram_percentile_edges() -> None:
    hist = np.zeros(N_BINS, np.int64)
    assert np.isnan(histogram_percentile(hist, 50))
    hist[1000] = 3  # 1000 bins = 5 decades above 1 us: [0.1 s, 0.1 s * BIN)
    for q in (0, 50, 100):
        assert 0.1 <= histogram_percentile(hist, q) <= 0.1 * BIN


@pytest.mark.parametrize("policy", [Policy.MB, Policy.EB, Policy.EBPLUS])
def test_jumped_decode_runs_are_counted_exactly(policy: Policy) -> None:
    """Advancing identical decode steps at once gives the same gaps, stalls and percentiles as step by step."""
    work = wl.Workload(name="w", input=wl.LengthSpec(dist="uniform", mean=300, jitter=0.5),
                       output=wl.LengthSpec(dist="geometric", mean=120))  # fmt: skip
    prof = HardwareProfile(name="t", kv_capacity_tokens=60_000, alpha_p=1e-3, beta_p=2e-5, alpha_d=6e-3,
                           beta_d=3e-5, beta_mb=(2e-5, 2e-5, 1e-5), beta_kv=1e-8)  # fmt: skip
    reqs = wl.build_requests(work, seed=4, requests=800, rate=40.0, burst_cv=2.0)
    k = 8 if policy is Policy.EB else None
    runs = [simulate(prof, reqs, SimConfig(policy=policy, k=k, n=128, budget=2048, jump=j)) for j in (True, False)]
    jumped, stepped = runs
    assert sum(jumped.steps.values()) == sum(stepped.steps.values())
    assert jumped.itl_hist.sum() == stepped.itl_hist.sum() == int((reqs.output_len - 1).sum())
    assert np.abs(jumped.itl_hist - stepped.itl_hist).sum() <= 2  # a gap on a bin edge may round either way
    np.testing.assert_allclose(jumped.stall_s, stepped.stall_s, rtol=1e-9)
    for key in ("itl_p50_s", "itl_p99_s", "stall_p99_s", "stall_max_s", "ttft_p99_s"):
        assert getattr(jumped, key) == pytest.approx(getattr(stepped, key), rel=BIN - 1), key


def test_preempted_request_gap_spans_its_recompute() -> None:
    """A request preempted mid-decode resumes after recomputing its context: one long gap, no lost token."""
    work = wl.Workload(name="w", input=wl.LengthSpec(dist="fixed", mean=400),
                       output=wl.LengthSpec(dist="fixed", mean=300))  # fmt: skip
    reqs = wl.build_requests(work, seed=0, requests=60)
    prof = HardwareProfile(**{**FLAT, "kv_capacity_tokens": 8_000})
    res = simulate(prof, reqs, SimConfig(policy=Policy.MB, n=32, budget=2048))
    assert res.preemptions > 0
    assert res.itl_hist.sum() == int((reqs.output_len - 1).sum())
    assert res.stall_max_s > 10 * 0.010  # waited through many steps in the queue


def test_simulate_json_has_latency_keys(capsys) -> None:
    argv = ["sim", "run", "--profile", "h200", "--workload", "paper", "--policy", "mb", "--rate", "20",
            "--burst-cv", "3", "--requests", "200", "--slo-ttft", "0.5", "--slo-itl", "0.2", "--json"]  # fmt: skip
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert tuple(data) == SimResult.JSON_KEYS
    assert data["slo"] == {"ttft_s": 0.5, "itl_s": 0.2, "tpot_s": None} and data["tpot_attainment"] is None
    assert 0 < data["itl_p50_s"] <= data["itl_p99_s"] <= data["stall_max_s"]
    assert 0 <= data["ttft_attainment"] <= 1 and 0 < data["goodput_req_per_s"] <= data["req_per_s"]


def test_latency_flags_bad_input(capsys) -> None:
    base = ["sim", "run", "--profile", "h200", "--workload", "paper", "--policy", "mb", "--requests", "10"]
    assert main([*base, "--burst-cv", "3"]) == 2
    assert "--burst-cv needs --rate" in capsys.readouterr().err
    for flag in ("--burst-cv", "--slo-ttft", "--slo-itl", "--slo-tpot"):  # argparse rejects them before any run
        with pytest.raises(SystemExit) as exc:
            main([*base, "--rate", "5", flag, "0"])
        assert exc.value.code == 2 and f"argument {flag}: must be a number > 0" in capsys.readouterr().err


def test_mode_switches_after_warmup_ignore_the_cold_start(tmp_path: Path) -> None:
    """Only changes of the active mode after the n-th completion count; a k or N change is not a switch."""
    res = two_requests(tmp_path)  # completions at 42 ms
    after_first = float(np.sort(res.finish_s)[0])
    tl = [(0.0, 1, 4, "mb"), (0.001, 1, 4, "eb"), (after_first + 1, 2, 4, "eb"), (after_first + 2, 2, 4, "mb")]
    arrivals = np.array([0.0, after_first + 3])  # the last request arrives after both switches
    res = dataclasses.replace(res, timeline=tl, arrival_s=arrivals)
    assert res.switches_after(0) == 2
    assert res.switches_after(1) == 1
    assert res.switches_after(2) == 0  # the run has no more completions than that
    # once the last request has arrived the load drains: a switch then is not oscillation
    drained = dataclasses.replace(res, arrival_s=np.array([0.0, after_first + 1.5]))
    assert drained.switches_after(1) == 0
