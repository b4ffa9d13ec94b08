"""What keeps a push short while a large fleet is re-planned, checked for structure and sameness, not speed.

The pieces a re-plan is cut into must compute what the uncut code computed (the departure fit,
the latency rule's throughput curve, the snapshot), and the actor's pauses between pieces must
let a push through before the next piece runs. How long each piece takes is measured by the
controller benchmark (``docs/benchmarks/controller.md``), not here.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import numpy as np
import pytest
from factories import batch, drive, registration

from ebplus.controller import actor as actor_module
from ebplus.controller import departures, persistence, pieces, theory
from ebplus.controller.actor import ControllerActor
from ebplus.controller.config import ControllerConfig
from ebplus.controller.fleet import FleetController
from ebplus.controller.messages import CompletionRecord, FinishReason, StepRecord

H200 = (1.2786e-3, 8.921e-3, 2.4853e-5, 4.586e-5)


def test_the_throughput_curve_is_tp_eb_at_each_threshold_to_the_last_bit() -> None:
    n = 1024
    ks = [1, 2, 7, 40, 100, 511, 1000, 1023]
    for budget in (None, 8192, 512.0):
        for mu_l, mu_o, cycle in ((512.0, 256.0, 0.0), (3000, 2, 2e-3), (1.5, 1.0, 0.0)):
            budgets = [budget if k % 2 else (budget or 4096) for k in ks]  # per-threshold budgets differ
            curve = theory.tp_eb_many(ks, n, *H200, mu_l, mu_o, budgets, cycle)
            assert curve == [theory.tp_eb(k, n, *H200, mu_l, mu_o, b, cycle) for k, b in zip(ks, budgets, strict=True)]


def test_the_throughput_curve_refuses_bad_input_by_name_as_tp_eb_does() -> None:
    with pytest.raises(ValueError, match=r"k must be in \[1, n-1\]"):
        theory.tp_eb_many([5, 10], 10, *H200, 512, 256, [None, None])
    with pytest.raises(ValueError, match="k must be an integer"):
        theory.tp_eb_many([0], 10, *H200, 512, 256, [None])
    with pytest.raises(ValueError, match="alpha_p"):
        theory.tp_eb_many([1], 10, 0.0, *H200[1:], 512, 256, [None])
    with pytest.raises(ValueError, match="mu_o"):
        theory.tp_eb(1, 10, *H200, 512, float("nan"))
    with pytest.raises(ValueError):  # one budget per threshold
        theory.tp_eb_many([1, 2], 10, *H200, 512, 256, [None])


@pytest.mark.parametrize("shift", [0, 40])
def test_a_departure_fit_in_pieces_is_the_fit(shift: int) -> None:
    rng = np.random.default_rng(shift)
    n = 3000
    lengths = shift + rng.geometric(1 / 200, n)
    running = rng.random(n) < 0.3
    ages = np.where(running, (rng.random(n) * lengths).astype(np.int64), lengths)
    sample = departures.Sample.of(ages, ~running, weights=np.where(running, 2.0, 1.0), running=running)
    value, count = drive(departures.fit_pieces(sample))
    assert value == departures.fit(sample)
    assert count >= 3  # each hazard fit, the realized moments and the goodness of fit: a piece each


def test_a_departure_fit_with_no_natural_stop_is_the_caps_in_pieces_too() -> None:
    sample = departures.Sample.of(np.array([64, 64, 32]), np.zeros(3, bool), capped=np.ones(3, bool),
                                  caps=np.array([64, 64, 32]))  # fmt: skip
    assert pieces.run(departures.fit_pieces(sample)) == departures.fit(sample)
    assert departures.fit(sample).model == "caps"


def test_a_snapshot_drops_the_decisions_it_no_longer_needs_a_few_at_a_time() -> None:
    """Dropping a cached decision often frees it and its plan: a re-plan's worth at once held the loop ~1 ms."""
    replicas = 96
    fc = FleetController(ControllerConfig(update_every=10**9, first_update=10**9, history=100))
    rng = np.random.default_rng(3)
    for r in range(replicas):
        fc.register(registration(f"r{r}", kv_capacity_tokens=2_000_000, max_num_seqs=1024))
    writer = persistence.SnapshotWriter()
    cut = False
    for _ in range(3):
        for r in range(replicas):
            comps = [CompletionRecord(100, int(o), FinishReason.STOP) for o in rng.geometric(1 / 50, 8)]
            steps = [StepRecord(0, 300, 300, 10, 0.01 + 1e-5 * i) for i in range(8)]
            fc.ingest(batch(f"r{r}", comps, steps))
        fc.recompute("periodic")
        held: list[int] = []
        built, _ = drive(writer.pieces(fc), lambda held=held: held.append(len(writer._decisions)))
        assert persistence.parse(json.loads(built)) == persistence.parse(json.loads(fc.state().model_dump_json()))
        assert {id(d) for d in fc.history} == set(writer._decisions)  # what history dropped, the cache did too
        after_peak = held[held.index(max(held)) :]
        cut |= any(len(fc.history) < n < max(held) for n in after_peak)  # seen between two pieces, part dropped
    assert cut


def test_a_push_that_is_a_chain_of_three_callbacks_runs_before_the_next_piece() -> None:
    """A timer wakes the task that starts the push, whose first step runs it: three turns of the loop."""
    actor = ControllerActor(ControllerConfig(), housekeeping=False)
    order: list[str] = []

    async def push() -> None:
        order.append("push")

    def work():  # type: ignore[no-untyped-def]
        loop = asyncio.get_running_loop()
        for piece in range(3):
            order.append(f"piece {piece}")
            if piece == 0:  # the chain starts while the first piece runs
                loop.call_soon(lambda: loop.call_soon(lambda: loop.create_task(push())))
            time.sleep(2 * actor_module.SLICE_S)  # a piece longer than a slice: the driver pauses after it
            yield
        return "done"

    assert asyncio.run(actor._drive(work())) == "done"
    assert order == ["piece 0", "push", "piece 1", "piece 2"]


def test_an_in_process_controller_does_not_import_ray() -> None:
    """Ray's modules are ~30k long-lived objects that every full collection of the controller's process walks."""
    code = (
        "import sys; from ebplus.controller.actor import ControllerActor; ControllerActor(housekeeping=False); "
        "assert 'ray' not in sys.modules, 'ray imported'"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
