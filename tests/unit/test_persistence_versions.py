"""Persisted controller state across releases: the previous release's state resumes, a newer one is refused.

``tests/data/controller-state-b0f895d.json`` is what the previous release's controller
persisted (written by that code: ``tests/data/make_controller_state.py``). Its layout
differs from today's in the workload window and in the plans' crossover, under the
same schema number 1; today's code must resume from it without a cold start.
``controller-state-1d4a85c.json`` is schema 2 as the last controller that wrote its
snapshot as hand-built JSON text wrote it; today's models must read it and write it back
the same.
"""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path

import pytest
from factories import batch, completions, registration

from ebplus.controller import persistence
from ebplus.controller.actor import ControllerActor
from ebplus.controller.config import ControllerConfig
from ebplus.controller.fleet import FleetController
from ebplus.controller.messages import Mode, StepRecord

DATA = Path(__file__).resolve().parents[1] / "data"
PREVIOUS = json.loads((DATA / "controller-state-b0f895d.json").read_text())
HAND_WRITTEN = json.loads((DATA / "controller-state-1d4a85c.json").read_text())


def resumed(raw: dict) -> FleetController:
    fleet = FleetController(ControllerConfig(update_every=40, min_samples=20, planner={"min_concurrency": 2}))
    fleet.restore(persistence.parse(raw))
    return fleet


@pytest.mark.parametrize("label", ["1 (as written)", "0 (no number)"])
def test_the_previous_release_state_resumes_without_a_cold_start(label: str) -> None:
    raw = copy.deepcopy(PREVIOUS)
    if label.startswith("0"):
        del raw["schema_version"]
    fleet = resumed(raw)
    assert fleet.version == PREVIOUS["version"] and fleet.updates == PREVIOUS["updates"]
    assert fleet.workload.estimate is not None  # the window and the estimate survived
    saved = PREVIOUS["replicas"]["rep-a"]["last_plan"]
    update = fleet.register(registration("rep-a", kv_capacity_tokens=20000, max_num_seqs=16))
    # its own plan again, at the persisted version: not the cold theta x max_num_seqs of version 0
    assert (update.k, update.n, update.active.value, update.version) == (saved["k"], saved["n_cap"], saved["active"], 10)
    snap = fleet.snapshot()
    assert snap.replicas["rep-a"].theta is not None and snap.replicas["rep-a"].crossover is None  # old terms dropped


def test_a_resumed_previous_state_keeps_planning() -> None:
    fleet = resumed(PREVIOUS)
    for rid in ("rep-a", "rep-b"):
        fleet.register(registration(rid, kv_capacity_tokens=20000, max_num_seqs=16))
    steps = [StepRecord(32, 4, 4, 0, 0.012), StepRecord(0, 6, 6, 1, 0.011)] * 10
    version = fleet.version
    for i in range(6):
        for rid in ("rep-a", "rep-b"):
            fleet.ingest(batch(rid, completions(10, start=10 * i), steps, applied_version=fleet.version))
    assert fleet.version > version and fleet.plan_errors == 0
    assert fleet.snapshot().replicas["rep-b"].crossover is not None  # a new plan, in today's terms


def test_the_history_reads_back_as_it_was_decided() -> None:
    fleet = resumed(PREVIOUS)
    for rid in ("rep-a", "rep-b"):
        fleet.register(registration(rid, kv_capacity_tokens=20000, max_num_seqs=16))
    steps = [StepRecord(32, 4, 4, 0, 0.012), StepRecord(0, 6, 6, 1, 0.011)] * 10
    for i in range(6):  # decisions made here, not read back from a saved state
        for rid in ("rep-a", "rep-b"):
            fleet.ingest(batch(rid, completions(10, start=10 * i), steps, applied_version=fleet.version))
    decided = [d.model_dump(mode="json") for d in fleet.history_view()]
    again = resumed(json.loads(fleet.state().model_dump_json()))
    assert max(d["version"] for d in decided) > PREVIOUS["version"]
    assert [d.model_dump(mode="json") for d in again.history_view()] == decided


def test_todays_state_round_trips_under_the_current_version() -> None:
    fleet = resumed(PREVIOUS)
    fleet.register(registration("rep-a", kv_capacity_tokens=20000, max_num_seqs=16))
    dumped = json.loads(fleet.state().model_dump_json())
    assert dumped["schema_version"] == persistence.SCHEMA_VERSION == 2
    again = resumed(dumped)
    assert again.version == fleet.version and again.workload.estimate == fleet.workload.estimate
    # the code between the layout change and the version bump wrote today's layout as version 1
    assert resumed({**dumped, "schema_version": 1}).workload.estimate == fleet.workload.estimate


def test_the_hand_written_snapshot_resumes_and_is_written_back_the_same() -> None:
    config = ControllerConfig(update_every=40, min_samples=20, history=24, planner={"min_concurrency": 2, "cooldown": 0})
    fleet = FleetController(config)
    fleet.restore(persistence.parse(HAND_WRITTEN))
    # every field, as the models write it, plus the fields added since, at their defaults
    written = json.loads(fleet.state().model_dump_json())
    assert written["workload"].pop("departed") == []  # the windows of replicas that left (none then)
    assert written.pop("stagger")["on"] is False  # the staggered-windows decision (none then)
    pins = [*written["overrides"].values(), *(d["override"] for d in written["history"] if d.get("override"))]
    assert pins and all(pin.pop("force") is False for pin in pins)  # overrides remember force (none then)
    updates = [d["update"] for d in written["history"]]  # decisions remember their stagger (none then)
    assert all((u.pop("stagger_period_s"), u.pop("stagger_phase")) == (0.0, 0.0) for u in updates)
    assert written == HAND_WRITTEN
    assert set(fleet.saved) == {"rep-a", "rep-b", "rep-c", "rep-d"} and "rep-b" in fleet.overrides.items
    saved = HAND_WRITTEN["replicas"]["rep-c"]["last_plan"]
    update = fleet.register(registration("rep-c", mode=Mode.EB, kv_capacity_tokens=28000, max_num_seqs=16))
    assert (update.k, update.n, update.version) == (saved["k"], saved["n_cap"], HAND_WRITTEN["version"])
    assert update.mode is Mode.EB and "rep-d" in fleet.saved  # rep-d was forgotten: still set aside
    override = fleet.register(registration("rep-b", kv_capacity_tokens=24000, max_num_seqs=16))
    assert override.k == 3  # the operator's pin survived


def test_a_newer_state_is_refused_naming_both_versions() -> None:
    with pytest.raises(persistence.StateError, match="schema version 3, newer than this controller's 2"):
        persistence.parse({**PREVIOUS, "schema_version": 3})


def test_the_controller_starts_cold_on_a_newer_state_and_keeps_it(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A rollback after an upgrade: the newer state is logged, set aside (not overwritten), and the
    controller serves cold rather than failing its constructor (which Ray would restart forever)."""
    newer = {**PREVIOUS, "schema_version": 3}
    (tmp_path / "controller-state.json").write_text(json.dumps(newer))
    with caplog.at_level(logging.ERROR, logger="ebplus.controller"):
        actor = ControllerActor(ControllerConfig(state_dir=str(tmp_path)), housekeeping=False)
    assert not actor.restored and actor.fleet.version == 0
    assert "schema version 3, newer than this controller's 2" in caplog.text
    assert json.loads((tmp_path / "controller-state.rejected.json").read_text()) == newer
    actor.persist(force=True)  # its own snapshot replaces the live one; the newer one stays aside
    assert json.loads((tmp_path / "controller-state.json").read_text())["schema_version"] == 2


def test_the_controller_logs_a_migration(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "controller-state.json").write_text(json.dumps(PREVIOUS))
    with caplog.at_level(logging.INFO, logger="ebplus.controller"):
        actor = ControllerActor(ControllerConfig(state_dir=str(tmp_path)), housekeeping=False)
    assert actor.restored and actor.fleet.version == 10
    assert "from a schema-1 state (migrated to schema 2)" in caplog.text
    assert Mode(actor.fleet.saved["rep-a"].planner.active) is Mode.EB
