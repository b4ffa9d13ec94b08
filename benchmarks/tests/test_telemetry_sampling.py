"""Telemetry sampled at the replica: a known share, chosen so the controller's estimates and evidence stay right."""

from __future__ import annotations

import statistics

import numpy as np
import pytest
from factories import batch, registration

from benchmarks.telemetry_sampling import outcome
from ebplus.controller.config import ControllerConfig
from ebplus.controller.evidence import ModeEvidence
from ebplus.controller.fleet import FleetController
from ebplus.controller.messages import CompletionRecord, FinishReason, Mode, RunningRequest, StepRecord
from ebplus.replicas.sampling import CYCLE_STEPS, Sampling, TelemetrySampler, kept


def test_the_share_of_requests_kept_is_the_share_asked_for_in_any_stretch_of_admissions() -> None:
    for share in (0.5, 0.25, 0.1, 0.013):
        for start in (0, 12_345, 10**9):
            got = sum(kept(i, share) for i in range(start, start + 10_000))
            assert abs(got / 10_000 - share) < 0.002, (share, start)


def test_a_request_is_reported_running_and_finished_alike_with_its_weight_kept() -> None:
    sampler = TelemetrySampler(Sampling(requests=0.25))
    running = [RunningRequest(seq=i, input_len=10, age=3) for i in range(0, 4000, 8)]  # an evenly spaced 500
    chosen, total = sampler.running(running, 4000)
    assert abs(len(chosen) / len(running) - 0.25) < 0.05
    assert total / len(chosen) == pytest.approx(4000 / len(running), rel=0.01)  # each stands for as many as before
    done = sampler.completions([CompletionRecord(10, 5, FinishReason.STOP, r.seq) for r in running])
    assert [c.seq for c in done] == [r.seq for r in chosen]


def _phases(cycles: int, decode: int, prefill: int, rng: np.random.Generator, mixed: bool) -> list[StepRecord]:
    """Prefill phases between runs of decode steps, or of mixed steps (MB with a rare prefill-only step)."""
    run = StepRecord(300, 64, 64, 0, 0.03) if mixed else StepRecord(0, 64, 64, 0, 0.02)
    out = []
    for _ in range(cycles):
        out += [StepRecord(int(rng.integers(100, 4000)), 0, 0, 0, 0.01)] * int(rng.integers(1, prefill))
        out += [run] * int(rng.integers(1, decode))
    return out


@pytest.mark.parametrize(
    ("decode", "prefill", "mixed"), [(30, 3, False), (200, 3, False), (200, 3, True), (30, 150, False)]
)  # short EB cycles; decode runs, and MB's mixed runs, cut into several cycles; chunked prefills longer than a cycle
def test_sampled_steps_keep_whole_cycles_and_every_phase_start_they_had(decode: int, prefill: int, mixed: bool) -> None:
    rng = np.random.default_rng(decode + prefill)
    steps = _phases(400, decode, prefill, rng, mixed)
    sampler = TelemetrySampler(Sampling(steps=0.25))
    kept_steps = []
    for lo in range(0, len(steps), 97):  # across drains of any size
        kept_steps += sampler.steps(steps[lo : lo + 97])
    full, part = ModeEvidence(window=10**6), ModeEvidence(window=10**6)
    full.observe(Mode.EB, steps, 0)
    part.observe(Mode.EB, kept_steps, 0)
    (n_full, phases_full), (n_part, phases_part) = full.mark(Mode.EB), part.mark(Mode.EB)
    assert 0.18 < n_part / n_full < 0.32
    # a phase start is counted in the sampled stream exactly when the cycle it begins was kept
    starts = [i for i, s in enumerate(steps) if s.decode_tokens == 0 and (i == 0 or steps[i - 1].decode_tokens > 0)]
    assert phases_part == sum(1 for i in starts if _cycle_kept(steps, i, 0.25))
    assert phases_full == len(starts)


def _cycle_kept(steps: list[StepRecord], index: int, share: float) -> bool:
    """Whether the cycle starting at phase start ``index`` was kept, by replaying the sampler's numbering."""
    sampler = TelemetrySampler(Sampling(steps=share))
    sampler.steps(steps[:index])
    return bool(sampler.steps(steps[index : index + 1]))


def test_a_mixed_batching_stream_is_cut_into_cycles_between_two_decoding_steps() -> None:
    steps = [StepRecord(500, 60, 60, 0, 0.03)] * (CYCLE_STEPS * 20)
    sampler = TelemetrySampler(Sampling(steps=0.5))
    got = sampler.steps(steps)
    assert 0.3 < len(got) / len(steps) < 0.7 and len(got) % CYCLE_STEPS == 0


def test_the_controller_relates_preemptions_to_all_completions_not_the_reported_ones() -> None:
    fc = FleetController(ControllerConfig(update_every=10**6, first_update=10**6))
    fc.register(registration("r0"))
    comps = [CompletionRecord(10, 5, FinishReason.STOP, i) for i in range(40)]
    fc.ingest(batch("r0", comps, request_rate=0.25, step_rate=0.5))
    replica = fc.replicas["r0"]
    assert replica.completed_since_plan == 160 and replica.sampling == (0.25, 0.5)
    fc.ingest(batch("r0", comps, request_rate=0.0))  # not a share: read as 1 and counted
    assert fc.rejected["bad_batch"] == 1 and replica.completed_since_plan == 200


def test_sampled_telemetry_estimates_the_workload_as_well_as_all_of_it() -> None:
    """The estimate's error against the truth with a quarter of the telemetry, next to the full path's,
    on the same streams (eight seeds). Both rest on a window of ~500 finished requests, whose
    statistical error is a few percent: sampling leaves it there. The load (records absorbed)
    falls to a quarter; the EB evidence the closed loop corrects by, and the phases it counts per
    step, do not move."""
    full = [outcome(Sampling(), seed, pushes=40) for seed in range(8)]
    part = [outcome(Sampling(requests=0.25, steps=0.25), seed, pushes=40) for seed in range(8)]
    full_err = statistics.median(abs(o.mu_o_error) for o in full)
    part_err = statistics.median(abs(o.mu_o_error) for o in part)
    assert full_err < 0.08 and part_err < 0.08, (full_err, part_err)
    assert abs(part_err - full_err) < 0.04, (full_err, part_err)
    assert max(abs(o.mu_o_error) for o in full + part) < 0.2
    for f, p in zip(full, part, strict=True):
        assert p.completions == pytest.approx(0.25 * f.completions, rel=0.05)
        assert p.steps == pytest.approx(0.25 * f.steps, rel=0.15)
        assert p.eb_bias == pytest.approx(f.eb_bias, rel=0.01) and f.eb_bias > 1.02  # the stall is seen, alike
        assert p.phases_per_step == pytest.approx(f.phases_per_step, rel=0.05)
