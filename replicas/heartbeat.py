"""Heartbeats on the answer stream between a replica and the ingress, so a lost replica is noticed in seconds.

A request's answer travels from the model replica to the ingress as a Ray
streaming generator. When the replica's node is lost, nothing ends that stream
until Ray declares the node dead (its health checks) and the actor failure
reaches the caller; an answer that is slow to start (a request queued behind a
prefill phase) looks the same from the ingress. So the replica interleaves
:data:`HEARTBEAT` items when it has had nothing to send for a while
(:func:`with_heartbeats`), and the ingress drops them and gives up on a stream
that has been silent longer than a stall deadline once the replica took the
request (:func:`without_heartbeats`): silence then means the replica is gone, not
busy.

Only callers that ask for heartbeats get them (the replica's ``*_with_heartbeats``
methods), so an ingress that does not know them never sees one. Pure asyncio.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TypeVar

T = TypeVar("T")

#: The heartbeat item. An SSE comment line: harmless to an OpenAI client if one ever got through.
HEARTBEAT = ": ebplus-heartbeat\n\n"


class ReplicaStalled(Exception):
    """The replica sent nothing, not even a heartbeat, for longer than the stall deadline."""


class NoProgress(Exception):
    """The replica is alive (heartbeats) but its answer has not moved for longer than the progress deadline."""


async def with_heartbeats(stream: AsyncIterator[T], every_s: float) -> AsyncIterator[T | str]:
    """``stream``'s items, with :data:`HEARTBEAT` first and whenever ``every_s`` pass without an item.

    The first heartbeat says the replica took the request. Closing this generator
    (the caller went away), at any of its items the first included, cancels the
    pending read and closes ``stream``, so the engine aborts the request as it
    would without heartbeats.
    """
    pending: asyncio.Future | None = None
    try:
        yield HEARTBEAT
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(stream))
            done, _ = await asyncio.wait({pending}, timeout=every_s)
            if not done:
                yield HEARTBEAT
                continue
            try:
                item = pending.result()
            except StopAsyncIteration:
                return
            finally:
                pending = None
            yield item
    finally:
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()


async def without_heartbeats(
    stream: AsyncIterator[T | str], stall_s: float, progress_s: float | None = None
) -> AsyncIterator[T]:
    """``stream``'s items without heartbeats; :class:`ReplicaStalled` after ``stall_s`` of silence,
    :class:`NoProgress` after ``progress_s`` of heartbeats only, once the first item came.

    The stall deadline starts with the replica's first heartbeat (it took the request):
    before that the request may wait in Serve's queue for a free replica, which is
    back-pressure, bounded by ``max_queued_requests``, not a lost replica. Heartbeats
    prove the replica is alive, not that its engine moves: an engine wedged under a
    stream keeps its heartbeats going, so the progress deadline counts from the last
    real item instead. It starts with the first one (time to first token is the
    scheduler's queue, which a prefill-heavy EB phase can make long on purpose). On
    either deadline the pending read is cancelled (Serve then cancels the request, if
    the replica is still there to hear it) and ``stream`` is closed.
    """
    loop = asyncio.get_running_loop()
    stall: float | None = None  # none until the replica took the request
    progress_by: float | None = None  # none until the first item
    try:
        while True:
            wait = stall
            if progress_by is not None:
                left = max(progress_by - loop.time(), 0.0)
                wait = left if wait is None else min(wait, left)
            try:
                # asyncio.timeout, not wait_for: Python 3.11's wait_for returns an item that lands as the
                # client's task is cancelled and drops the cancellation, so the read went on for nobody
                async with asyncio.timeout(wait):
                    item = await anext(stream)
            except StopAsyncIteration:
                return
            except TimeoutError:
                if progress_by is not None and loop.time() >= progress_by:
                    raise NoProgress(f"no token from the replica for {progress_s:g} s (heartbeats only)") from None
                raise ReplicaStalled(f"no answer and no heartbeat from the replica for {stall_s:g} s") from None
            stall = stall_s
            if isinstance(item, str) and item == HEARTBEAT:
                continue
            if progress_s is not None:
                progress_by = loop.time() + progress_s
            yield item
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(Exception):
                await aclose()
