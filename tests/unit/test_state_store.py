"""The controller's state on disk: durable writes, a full disk reported once, a corrupt file set aside."""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
from pathlib import Path

import pytest
from factories import registration

from ebplus.controller import state_store
from ebplus.controller.actor import ControllerActor
from ebplus.controller.config import ControllerConfig
from ebplus.controller.messages import encode
from ebplus.controller.state_store import StateStore, StoreError


def actor_in(tmp_path: Path) -> ControllerActor:
    actor = ControllerActor(ControllerConfig(state_dir=str(tmp_path)), housekeeping=False)
    asyncio.run(actor.register(encode(registration("r0"))))
    assert actor.persist(force=True)
    return actor


def test_a_write_is_fsynced_file_and_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append("dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "file")
        real_fsync(fd)

    monkeypatch.setattr(state_store.os, "fsync", fsync)
    actor = actor_in(tmp_path)
    synced.clear()
    assert actor.persist(force=True)
    assert synced == ["file", "dir"]  # the data before the rename, the rename after it
    assert json.loads((tmp_path / "controller-state.json").read_text())["version"] == actor.fleet.version


def no_space(fd: int) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_full_disk_is_reported_once_leaves_no_temporary_file_and_recovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    actor = actor_in(tmp_path)
    before = (tmp_path / "controller-state.json").read_bytes()
    monkeypatch.setattr(state_store.os, "fsync", no_space)
    caplog.set_level(logging.WARNING, logger="ebplus.controller")
    for _ in range(5):  # housekeeping tries every persist_every_s
        assert not actor.persist(force=True)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "No space left on device" in errors[0].getMessage()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["controller-state.json"]  # no .controller-state.* left
    assert (tmp_path / "controller-state.json").read_bytes() == before  # the last good state is intact
    snapshot = json.loads(asyncio.run(actor.snapshot()))
    assert "No space left" in snapshot["controller"]["persist_error"]

    # an operator's change is applied and says it is not persisted
    result = json.loads(asyncio.run(actor.set_override("r0", mode="eb")))
    assert result["version"] > 0 and result["persisted"] is False and "not persisted" in result["message"]
    assert actor.fleet.overrides.items["r0"].mode is not None  # applied
    cleared = json.loads(asyncio.run(actor.clear_override("r0")))
    assert cleared["removed"] and cleared["persisted"] is False

    monkeypatch.undo()
    caplog.clear()
    assert actor.persist(force=True)
    assert any("persisted again" in r.getMessage() for r in caplog.records)
    result = json.loads(asyncio.run(actor.set_override("r0", mode="mb")))
    assert result["persisted"] is True and result["message"] is None
    assert json.loads((tmp_path / "controller-state.json").read_text())["version"] == result["version"]


def test_the_store_raises_store_error_naming_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = StateStore(str(tmp_path / "store"))
    actor = actor_in(tmp_path / "actor")
    monkeypatch.setattr(state_store.os, "fsync", no_space)
    with pytest.raises(StoreError, match=r"controller-state\.json: No space left on device"):
        store.save(actor.fleet.state())
    assert list((tmp_path / "store").iterdir()) == []


def test_a_corrupt_state_file_is_set_aside_and_the_controller_starts_cold(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    actor_in(tmp_path)
    good = (tmp_path / "controller-state.json").read_bytes()
    (tmp_path / "controller-state.json").write_bytes(good[: len(good) // 2])  # cut short
    caplog.set_level(logging.WARNING, logger="ebplus.controller")
    cold = ControllerActor(ControllerConfig(state_dir=str(tmp_path)), housekeeping=False)
    assert not cold.restored and cold.fleet.replicas == {}
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert "corrupt" in line and "starting cold" in line
    (aside,) = tmp_path.glob("controller-state.corrupt-*.json")
    assert aside.read_bytes() == good[: len(good) // 2] and aside.name in line
    assert cold.persist(force=True)  # the cold controller's state is written beside what was set aside
    assert aside.exists() and json.loads((tmp_path / "controller-state.json").read_text())["replicas"] == {}
