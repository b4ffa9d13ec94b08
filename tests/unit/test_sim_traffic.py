"""What the simulator is fed and what it reports about requests: bursty arrivals, per-request caps, running requests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ebplus.controller.cost_model import HardwareProfile
from ebplus.controller.messages import RUNNING_SAMPLE, DrainReport, FinishReason
from ebplus.simulator import workloads as wl
from ebplus.simulator.arrivals import gamma_offsets, poisson_offsets
from ebplus.simulator.sim import Policy, SimConfig, Simulator

PROFILE = HardwareProfile(name="t", kv_capacity_tokens=10**7, alpha_p=1e-3, beta_p=2e-5, alpha_d=6e-3, beta_d=3e-5,
                          beta_mb=(2e-5, 2e-5, 1e-5), beta_kv=1e-8)  # fmt: skip


def gaps_stats(offsets: np.ndarray) -> tuple[float, float]:
    gaps = np.diff(np.concatenate([[0.0], offsets]))
    return 1.0 / gaps.mean(), gaps.std() / gaps.mean()


@pytest.mark.parametrize("cv", [0.5, 1.0, 3.0, 5.0])
def test_gamma_arrivals_have_the_asked_rate_and_cv(cv: float) -> None:
    """200,000 gaps: mean rate within 3%, sample CV within 5% (about 6 standard errors at cv = 5)."""
    offsets = gamma_offsets(np.random.default_rng(7), 25.0, cv, 200_000)
    rate, sample_cv = gaps_stats(offsets)
    assert rate == pytest.approx(25.0, rel=0.03)
    assert sample_cv == pytest.approx(cv, rel=0.05)
    assert np.all(np.diff(offsets) >= 0)


def test_poisson_arrivals_are_unchanged_and_have_cv_one() -> None:
    rng = np.random.default_rng(3)
    offsets = poisson_offsets(rng, 10.0, 100_000)
    np.testing.assert_array_equal(offsets, np.cumsum(np.random.default_rng(3).exponential(0.1, 100_000)))
    rate, cv = gaps_stats(offsets)
    assert rate == pytest.approx(10.0, rel=0.02) and cv == pytest.approx(1.0, rel=0.02)


def test_bursty_phase_in_a_schedule_and_from_the_command_line(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("phases:\n  - {workload: paper, rate: 40, burst_cv: 3, requests: 30000}\n"
                    "  - {workload: paper, rate: 40, requests: 30000}\n")  # fmt: skip
    reqs = wl.build_requests(wl.load_workload_file(path), seed=1)
    bursty, poisson = (gaps_stats(ph.offsets_s) for ph in reqs.phases)
    assert bursty[0] == pytest.approx(40, rel=0.05) and bursty[1] == pytest.approx(3, rel=0.08)
    assert poisson[1] == pytest.approx(1, rel=0.05)
    assert "cv=3" in reqs.phases[0].label and "cv" not in reqs.phases[1].label
    flags = wl.build_requests(wl.load_source("paper"), seed=1, requests=30000, rate=40, burst_cv=3)
    assert gaps_stats(flags.phases[0].offsets_s)[1] == pytest.approx(3, rel=0.08)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("phases:\n  - {workload: paper, concurrency: 8, burst_cv: 2}\n", "burst_cv shapes open-loop arrivals"),
        ("phases:\n  - {workload: paper, rate: 3, burst_cv: 0}\n", ":2: field 'phases.0.burst_cv'"),
        ("name: x\ninput: {dist: fixed, mean: 4}\noutput: {dist: fixed, mean: 4}\nmax_tokens: 0\n", ":4: field 'max_tokens'"),
        ("name: x\ninput: {dist: fixed, mean: 4}\noutput: {dist: fixed, mean: 4}\nmax_tokens: {dist: nope, mean: 3}\n",
         ":4: field 'max_tokens"),
    ],
)  # fmt: skip
def test_traffic_file_errors_name_the_field(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "w.yaml"
    path.write_text(text)
    with pytest.raises(ValueError) as err:
        wl.load_workload_file(path)
    assert str(err.value).startswith(str(path)) and needle in str(err.value)


def test_workload_caps_fixed_and_distributed() -> None:
    out = wl.LengthSpec(dist="uniform", mean=200, jitter=0.5)
    fixed = wl.Workload(name="f", input=out, output=out, max_tokens=150)
    reqs = wl.build_requests(fixed, seed=0, requests=2000)
    assert reqs.caps().tolist() == [150] * 2000
    assert reqs.output_len.max() == 150 and reqs.capped.any() and not reqs.capped.all()
    assert np.all(reqs.capped == (reqs.output_len == 150) & reqs.capped)
    spread = wl.Workload(name="u", input=out, output=wl.LengthSpec(dist="fixed", mean=10_000),
                         max_tokens=wl.LengthSpec(dist="uniform", mean=128, jitter=0.5))  # fmt: skip
    reqs = wl.build_requests(spread, seed=0, requests=5000)
    caps = reqs.caps()
    assert caps.min() == 64 and caps.max() == 192 and caps.mean() == pytest.approx(128, rel=0.02)
    assert np.all(reqs.output_len == caps) and reqs.capped.all()  # every natural output is longer
    plain = wl.build_requests(wl.Workload(name="p", input=out, output=out), seed=0, requests=10)
    assert plain.max_tokens is None and plain.caps().tolist() == [0] * 10


@pytest.mark.parametrize("name", ["capped-all", "capped-uniform", "capped-mix"])
def test_shipped_capped_workloads(name: str) -> None:
    reqs = wl.build_requests(wl.load_source(name), seed=0, requests=4000)
    share = reqs.capped.mean()
    assert reqs.max_tokens is not None and np.all(reqs.output_len <= reqs.caps())
    if name == "capped-mix":
        assert 0.1 < share < 0.5  # some stop on their own, some at their cap
    else:
        assert share == 1.0


def test_trace_caps(tmp_path: Path) -> None:
    rows = [{"input_len": 10, "output_len": 50, "max_tokens": 20}, {"input_len": 10, "output_len": 5},
            {"input_len": 10, "output_len": 7, "max_tokens": 7}]  # fmt: skip
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    reqs = wl.build_requests(wl.load_source(path), seed=0)
    assert reqs.output_len.tolist() == [20, 5, 7]
    assert reqs.capped.tolist() == [True, False, False]  # 7 of at most 7: it stopped on its own (EOS comes first)
    assert reqs.caps().tolist() == [20, 0, 7]
    path.write_text('{"input_len": 10, "output_len": 5, "max_tokens": 0}')
    with pytest.raises(ValueError, match=r":1: field 'max_tokens': must be an integer >= 1"):
        wl.load_trace(path)


class Recording(Simulator):
    """A simulator that keeps every telemetry report it hands the pump."""

    def __init__(self, *args, **kwargs) -> None:
        self.reports: list[DrainReport] = []
        super().__init__(*args, **kwargs)

    def drain(self) -> DrainReport:
        report = super().drain()
        self.reports.append(report)
        return report


def test_completion_records_carry_caps_and_arrival_order() -> None:
    work = wl.Workload(name="m", input=wl.LengthSpec(dist="uniform", mean=200, jitter=0.5),
                       output=wl.LengthSpec(dist="geometric", mean=100), max_tokens=120)  # fmt: skip
    reqs = wl.build_requests(work, seed=5, requests=400, concurrency=32)
    sim = Recording(PROFILE, reqs, SimConfig(policy=Policy.EB, n=64, budget=2048))
    sim.run()
    done = [c for r in sim.reports for c in r.completions]
    assert sorted(c.seq for c in done) == list(range(400))
    for c in done:
        assert c.max_tokens == 120 and c.output_len == reqs.output_len[c.seq] and c.input_len == reqs.input_len[c.seq]
        assert c.finish is (FinishReason.LENGTH if reqs.capped[c.seq] else FinishReason.STOP)
    assert {c.finish for c in done} == {FinishReason.LENGTH, FinishReason.STOP}


@pytest.mark.parametrize("n", [64, 1200])
def test_drain_reports_running_requests(n: int) -> None:
    work = wl.Workload(name="r", input=wl.LengthSpec(dist="uniform", mean=100, jitter=0.5),
                       output=wl.LengthSpec(dist="uniform", mean=200, jitter=0.5),
                       max_tokens=wl.LengthSpec(dist="uniform", mean=250, jitter=0.2))  # fmt: skip
    reqs = wl.build_requests(work, seed=2, requests=3 * n)
    sim = Recording(PROFILE, reqs, SimConfig(policy=Policy.EBPLUS, n=n, budget=8192))
    res = sim.run()
    assert res.preemptions == 0
    busy = [r for r in sim.reports if r.running_total]
    assert len(busy) > 10
    caps = reqs.caps()
    for rep in busy:
        total, sample = rep.running_total, rep.running
        step = -(-total // RUNNING_SAMPLE)
        assert len(sample) == -(-total // step) <= RUNNING_SAMPLE
        seqs = [r.seq for r in sample]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)  # admission order, no preemption
        for r in sample:
            assert r.input_len == reqs.input_len[r.seq] and r.max_tokens == caps[r.seq] and r.cached_tokens == 0
            assert 0 <= r.age < reqs.output_len[r.seq]  # still running: not every token produced yet
    if n > RUNNING_SAMPLE:
        assert max(r.running_total for r in busy) > RUNNING_SAMPLE
    assert any(r.age > 0 for rep in busy for r in rep.running)


def test_an_arrival_is_issued_at_the_time_next_time_names_it() -> None:
    """(t0 + offset) - t0 can round below the offset: the request next_time() names must still arrive then,
    or a simulator that advances to that time and polls finds nothing and polls again, for ever."""
    from ebplus.simulator.arrivals import Arrivals

    t0, offset = 13.436424411240122, 8.474337369372327
    assert (t0 + offset) - t0 < offset  # the rounding this guards against
    phases = (
        wl.ArrivalPhase(0, 1, None, np.array([t0]), "a"),
        wl.ArrivalPhase(1, 2, None, np.array([offset]), "b"),
    )
    reqs = wl.Requests(np.array([8, 8]), np.array([4, 4]), np.zeros(2, bool), phases, False, "x")
    arrivals = Arrivals(reqs)
    assert arrivals.poll(t0) == [0]
    at = arrivals.next_time()
    assert at == t0 + offset and arrivals.poll(at) == [1]
