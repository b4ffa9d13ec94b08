"""The phase boards' channel: every replica publishes its engine's batching, every router reads them all.

Ray Serve's own routing statistics reach routers through Serve's controller, every 10 s by default; an
EB replica opens and closes a prefill window every 0.1-3 s. So the boards travel on a channel of their
own, one named actor per cluster (:class:`BoardActor`, around a plain :class:`BoardStore`):

* each replica that a board-reading router serves publishes its scheduler's
  :class:`~ebplus.controller.messages.PhaseReport` every ``board_interval_s`` (:func:`publish_forever`);
* the actor fetches the controller's :class:`~ebplus.controller.messages.RoutingHints` (the departure chance
  and each replica's cost model, which move only when the controller re-estimates) about once a second;
* each router long-polls the reports newer than the ones it holds (:meth:`BoardActor.watch`), in the
  background: a routing decision reads what the router holds and never waits on this channel.

A report that does not decode is refused and counted, never stored. The actor is restartable and holds
nothing that is not republished within one interval: replicas keep publishing to its name and routers keep
watching it, so the boards are whole again one interval after it returns; meanwhile routers see their
boards age and fall back to Ray's power of two choices.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from ebplus.controller.client import ControllerClient
from ebplus.controller.messages import PhaseReport, RoutingHints, WireError, decode, encode

logger = logging.getLogger("ray.serve.ebplus")

BOARD_NAME = "ebplus-board"
#: Seconds between two fetches of the controller's hints.
HINTS_INTERVAL_S = 1.0
#: A replica not heard from for this long is dropped from the board (it left, or its node did).
FORGET_AFTER_S = 30.0
#: Seconds a watch waits for a newer report before answering with none.
WATCH_TIMEOUT_S = 1.0


class BoardStore:
    """The latest report of every replica, each with the store version at which it arrived.

    Args:
        clock: wall-clock seconds (what reports are stamped with).
        forget_after_s: a replica silent this long is dropped.
    """

    def __init__(self, clock: Callable[[], float] = time.time, forget_after_s: float = FORGET_AFTER_S) -> None:
        self.clock = clock
        self.forget_after_s = forget_after_s
        self.version = 0
        self.hints = RoutingHints()
        self.refused: Counter[str] = Counter()
        self._reports: dict[str, tuple[int, float, bytes]] = {}  # replica id -> (version, received, payload)

    def publish(self, replica_id: str, payload: bytes) -> bool:
        """Store ``replica_id``'s report; ``False`` (counted by reason) when it does not decode."""
        try:
            decode(payload, PhaseReport)
        except WireError as exc:
            self.refused[exc.reason] += 1
            return False
        self.version += 1
        self._reports[replica_id] = (self.version, self.clock(), bytes(payload))
        return True

    def leave(self, replica_id: str) -> None:
        """A replica going away: its board goes with it."""
        if self._reports.pop(replica_id, None) is not None:
            self.version += 1

    def set_hints(self, hints: RoutingHints) -> None:
        if hints != self.hints:
            self.hints = hints
            self.version += 1

    def since(self, version: int) -> tuple[int, dict[str, bytes], list[str], bytes]:
        """What changed after ``version``: ``(now's version, reports newer than it, every replica on the board,
        the hints)``; the replica list lets a router drop the boards of replicas that left."""
        now = self.clock()
        for rid in [rid for rid, (_, received, _) in self._reports.items() if now - received > self.forget_after_s]:
            self.leave(rid)
        newer = {rid: payload for rid, (v, _, payload) in self._reports.items() if v > version}
        return self.version, newer, list(self._reports), encode(self.hints)


class BoardActor:
    """The Ray actor around a :class:`BoardStore` (async: many routers watch it at once).

    Args:
        hints: fetches the controller's :class:`RoutingHints` (``None`` while it does not answer).
    """

    def __init__(self, hints: Callable[[], Awaitable[RoutingHints]] | None = None) -> None:
        if hints is None:
            from ebplus.controller.actor import RayTransport

            hints = ControllerClient(RayTransport(), timeout_s=2 * HINTS_INTERVAL_S).routing_hints
        self.store = BoardStore()
        self._changed = asyncio.Event()
        self._hints = hints
        self._task: asyncio.Task | None = None

    def _ensure_hints_task(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._refresh_hints())

    async def _refresh_hints(self) -> None:
        missing = False
        while True:
            try:
                self.store.set_hints(await self._hints())
                self._notify()
                missing = False
            except Exception as exc:  # the boards go on with the last hints (said once an outage)
                if not missing:
                    logger.warning("board: no routing hints from the controller: %s", exc)
                missing = True
            await asyncio.sleep(HINTS_INTERVAL_S)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def publish(self, replica_id: str, payload: bytes) -> bool:
        self._ensure_hints_task()
        stored = self.store.publish(replica_id, payload)
        if stored:
            self._notify()
        return stored

    async def leave(self, replica_id: str) -> None:
        self.store.leave(replica_id)
        self._notify()

    async def watch(self, after: int, timeout_s: float = WATCH_TIMEOUT_S) -> tuple[int, dict[str, bytes], list[str], bytes]:
        """What changed after version ``after``, as soon as something did (or after ``timeout_s``)."""
        self._ensure_hints_task()
        if self.store.version <= after:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):  # not wait_for: see publish_forever
                    await self._changed.wait()
        return self.store.since(after)

    async def refused(self) -> dict[str, int]:
        """Reports refused since the actor started, by reason."""
        return dict(self.store.refused)


def board_options() -> dict[str, Any]:
    """Ray actor options of the board: named, detached (it serves every application's routers), restartable."""
    from ebplus.controller.actor import NAMESPACE

    return {
        "name": BOARD_NAME,
        "namespace": NAMESPACE,
        "lifetime": "detached",
        "get_if_exists": True,
        "max_restarts": -1,
        "max_task_retries": 0,  # the next publish or watch is the retry
        "num_cpus": 0,
        "max_concurrency": 1000,
    }


def ensure_board() -> Any:
    """The board actor: started, or the running one."""
    import ray

    return ray.remote(BoardActor).options(**board_options()).remote()


def get_board() -> Any:
    """Handle to the running board actor, or ``None`` (also outside a Ray cluster: this never starts one)."""
    import ray

    from ebplus.controller.actor import NAMESPACE

    if not ray.is_initialized():
        return None
    try:
        return ray.get_actor(BOARD_NAME, namespace=NAMESPACE)
    except ValueError:
        return None


async def leave(replica_id: str, timeout_s: float = 2.0) -> None:
    """Take ``replica_id``'s board down now (a replica leaving on purpose); a board that does not answer drops
    it after :data:`FORGET_AFTER_S` of silence anyway."""
    try:
        handle = await asyncio.to_thread(get_board)
        if handle is not None:
            async with asyncio.timeout(timeout_s):  # not wait_for: see publish_forever
                await handle.leave.remote(replica_id)
    except Exception as exc:  # never let the goodbye block the shutdown
        logger.info("replica %s: could not take its phase board down: %s", replica_id, exc)


async def publish_forever(replica_id: str, read: Callable[[], Awaitable[bytes]], interval_s: float) -> None:
    """A replica's board task: its engine's report to the board actor every ``interval_s`` until cancelled.

    Serving never waits on it and nothing it meets ends it: while the actor is away (restarting, not
    created yet) each try fails fast and the replica says so once, then once again when it is back.
    """
    handle: Any = None
    down = False
    while True:
        try:
            payload = await read()
            if handle is None:
                handle = await asyncio.to_thread(get_board)  # a GCS round trip, off the serving loop
            if handle is not None:
                # asyncio.timeout, not wait_for: Python 3.11's wait_for drops a cancellation that lands as the call
                # completes, and the task then publishes for ever
                async with asyncio.timeout(max(1.0, 10 * interval_s)):
                    await handle.publish.remote(replica_id, payload)
                if down:
                    logger.info("replica %s: the phase board answers again", replica_id)
                down = False
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # never let the board take the replica down
            handle = None
            if not down:
                logger.warning("replica %s: cannot publish its phase board (%s); routers fall back", replica_id, exc)
            down = True
        await asyncio.sleep(interval_s)
