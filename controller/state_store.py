"""Where the controller's state lives: a file in ``controller.state_dir``, else Ray's internal KV store.

On Kubernetes the state file is on a volume that outlives the head pod, so it has to
survive what a disk does: a crash between write and rename, a full volume, a file cut
short. So a write goes to a temporary file that is flushed and ``fsync``-ed, renamed
over the state, and the directory is ``fsync``-ed (the rename itself is durable); a
write that fails removes its temporary file and raises :class:`StoreError` with the
reason, for the actor to report once (not a traceback and a new temporary file every
round). A state file that does not parse is set aside with one error line and the
controller starts cold, instead of counting it as no state and overwriting it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

from ebplus.controller import persistence

#: The Ray internal KV key of the state (``state_dir`` unset).
STATE_KEY = b"ebplus-controller-state"
STATE_FILE = "controller-state.json"

logger = logging.getLogger("ebplus.controller")


class StoreError(OSError):
    """The state could not be written; the message says where and why (``No space left on device``)."""


def _ray_connected() -> bool:
    ray = sys.modules.get("ray")  # not imported: see ebplus.controller.actor._loaded_ray
    return ray is not None and ray.is_initialized()


class StateStore:
    """Where the controller's snapshot lives: a file in ``state_dir``, else Ray's internal KV.

    Outside a Ray cluster with no ``state_dir`` (a controller run in-process) there is
    nowhere to keep it: the state lives in memory only, and that is logged once.
    """

    def __init__(self, state_dir: str | None, key: bytes = STATE_KEY) -> None:
        self.path = None if state_dir is None else Path(state_dir) / STATE_FILE
        self.key = key
        self.memory_only = self.path is None and not _ray_connected()
        if self.memory_only:
            logger.warning("no controller.state_dir and no Ray cluster: the controller's state is not persisted")

    def load(self) -> dict | None:
        """The stored state as decoded JSON; ``None`` if there is none.

        A state that cannot be read is ``None`` too (logged); one that is not JSON (a
        file cut short) is first moved aside (:meth:`_set_aside_corrupt`), so the cold
        controller's first write does not destroy what an operator may want to inspect.
        """
        if self.memory_only:
            return None
        try:
            raw = self._read()
        except OSError as exc:
            logger.error("controller state unreadable, starting cold: %s", exc)
            return None
        if raw is None:
            return None
        try:
            return json.loads(raw)
        except ValueError as exc:
            where = self._set_aside_corrupt(raw)
            logger.error("controller state is corrupt (%s), starting cold; the damaged state is kept in %s", exc, where)
            return None

    def _read(self) -> bytes | None:
        if self.path is not None:
            return self.path.read_bytes() if self.path.exists() else None
        from ray.experimental.internal_kv import _internal_kv_get

        return _internal_kv_get(self.key)

    def _set_aside_corrupt(self, raw: bytes) -> str:
        """Move a state that does not parse out of the way; returns where it went."""
        try:
            if self.path is not None:
                aside = self.path.with_name(f"controller-state.corrupt-{time.strftime('%Y%m%dT%H%M%S')}.json")
                os.replace(self.path, aside)
                return str(aside)
            key = self.key + b".corrupt"
            self._write(None, key, raw)
            return f"Ray internal KV key {key.decode()}"
        except OSError as exc:
            return f"nowhere ({exc})"

    def save(self, state: persistence.ControllerState) -> None:
        """Store ``state``; :class:`StoreError` if it could not be written (nothing half-written is left)."""
        if not self.memory_only:
            self._write(self.path, self.key, state.model_dump_json().encode())

    def set_aside(self, raw: dict) -> str | None:
        """Keep a state this controller cannot resume from beside the live one; returns where.

        A state of a newer schema (a rollback after an upgrade) would otherwise be
        overwritten by the first snapshot of the controller that refused it.
        """
        if self.memory_only:
            return None
        path = None if self.path is None else self.path.with_name("controller-state.rejected.json")
        key = self.key + b".rejected"
        self._write(path, key, json.dumps(raw).encode())
        return str(path) if path is not None else f"Ray internal KV key {key.decode()}"

    @staticmethod
    def _write(path: Path | None, key: bytes, data: bytes) -> None:
        if path is None:
            from ray.experimental.internal_kv import _internal_kv_put

            try:
                _internal_kv_put(key, data, overwrite=True)
            except Exception as exc:  # the GCS is away: the same report as a full disk
                raise StoreError(f"Ray internal KV: {exc}") from exc
            return
        tmp: str | None = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".controller-state.")
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)  # write-then-rename: a crash mid-write never leaves a torn file
            tmp = None
            _fsync_dir(path.parent)
        except OSError as exc:
            raise StoreError(f"{path}: {exc.strerror or exc}") from exc
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)

    def clear(self) -> None:
        if self.memory_only:
            return
        if self.path is not None:
            self.path.unlink(missing_ok=True)
            return
        from ray.experimental.internal_kv import _internal_kv_del

        _internal_kv_del(self.key)


def _fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable (POSIX; a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
