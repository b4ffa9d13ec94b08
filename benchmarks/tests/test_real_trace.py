"""Engine-run lengths -> simulator trace: every request's lengths, cap and finish reach the simulator."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks.real_trace import ServedRequest, check_same, sim_requests, write_trace
from ebplus.controller.cost_model import resolve_profile
from ebplus.controller.messages import CompletionRecord, DrainReport, FinishReason
from ebplus.simulator.sim import Policy, SimConfig, Simulator

STOP, LENGTH = FinishReason.STOP, FinishReason.LENGTH


def served_run(n: int = 40, seed: int = 3) -> list[ServedRequest]:
    """A chat-like run: varied prompts, natural stops below the caps and capped answers, two caps."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        cap = 48 if i % 3 else 96
        if i % 4 == 0:
            out.append(ServedRequest(int(rng.integers(5, 300)), cap, LENGTH, cap))
        else:
            out.append(ServedRequest(int(rng.integers(5, 300)), int(rng.integers(1, cap + 1)), STOP, cap))
    return out


def test_trace_carries_every_length_cap_and_finish(tmp_path: Path) -> None:
    served = served_run()
    reqs = sim_requests(served, concurrency=8, path=tmp_path / "run.jsonl")
    assert reqs.input_len.tolist() == [r.input_len for r in served]
    assert reqs.output_len.tolist() == [r.output_len for r in served]
    assert reqs.caps().tolist() == [r.max_tokens for r in served]
    assert reqs.capped.tolist() == [r.finish is LENGTH for r in served]
    assert [ph.concurrency for ph in reqs.phases] == [8]
    check_same(served, reqs)  # the benchmark's own guard agrees


def test_trace_file_is_the_simulators_format(tmp_path: Path) -> None:
    served = [ServedRequest(10, 4, STOP, 16), ServedRequest(7, 16, LENGTH, 16)]
    path = write_trace(served, tmp_path / "t.jsonl")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    # a capped request would have gone on: its natural length is past the cap
    assert lines == [
        {"input_len": 10, "output_len": 4, "max_tokens": 16},
        {"input_len": 7, "output_len": 17, "max_tokens": 16},
    ]


class Tap(Simulator):
    """The simulator, keeping every completion record its control loop reported."""

    def __init__(self, *args: object) -> None:
        self.seen: list[CompletionRecord] = []
        super().__init__(*args)

    def drain(self) -> DrainReport:
        report = super().drain()
        self.seen.extend(report.completions)
        return report


def test_simulated_run_serves_exactly_the_engines_tokens(tmp_path: Path) -> None:
    served = served_run(60)
    reqs = sim_requests(served, concurrency=16, path=tmp_path / "run.jsonl")
    sim = Tap(resolve_profile("cpu-smollm2"), reqs, SimConfig(policy=Policy.EBPLUS, n=16, budget=2048))
    res = sim.run()
    assert int(res.input_len.sum()) == sum(r.input_len for r in served)
    assert int(res.output_len.sum()) == sum(r.output_len for r in served)
    # every output token was computed once: the first by its prompt's last step, the rest by decodes
    assert res.decode_tokens == sum(r.output_len - 1 for r in served)
    assert res.prefill_tokens - res.recompute_tokens == sum(r.input_len for r in served)
    # the controller heard what the engine's scheduler reported: lengths, finish reasons, caps
    heard = sorted((c.seq, c.input_len, c.output_len, c.finish, c.max_tokens) for c in sim.seen)
    assert heard == [(i, r.input_len, r.output_len, r.finish, r.max_tokens) for i, r in enumerate(served)]


def test_check_same_refuses_a_changed_request(tmp_path: Path) -> None:
    served = served_run(10)
    reqs = sim_requests(served, concurrency=4, path=tmp_path / "run.jsonl")
    changed = list(served)
    changed[5] = ServedRequest(served[5].input_len + 1, served[5].output_len, served[5].finish, served[5].max_tokens)
    with pytest.raises(AssertionError, match="differs"):
        check_same(changed, reqs)
    with pytest.raises(AssertionError, match="differs"):
        check_same(served[:-1], reqs)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ((10, 5, LENGTH, 8), "finish 'length' needs output_len == max_tokens"),
        ((10, 9, STOP, 8), "output_len 9 exceeds max_tokens 8"),
        ((0, 5, STOP, 8), "input_len must be >= 1"),
        ((10, 5, FinishReason.ABORT, 8), "finish must be 'stop' or 'length'"),
    ],
)
def test_served_request_rejects_what_an_engine_cannot_have_served(fields: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ServedRequest(*fields)
