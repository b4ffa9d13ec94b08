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


async def with_heartbeats(stream: AsyncIterator[T], every_s: float) -> AsyncIterator[T | str]:
    """``stream``'s items, with :data:`HEARTBEAT` first and whenever ``every_s`` pass without an item.

    The first heartbeat says the replica took the request. Closing this generator
    (the caller went away) cancels the pending read and closes ``stream``, so the
    engine aborts the request as it would without heartbeats.
    """
    yield HEARTBEAT
    pending: asyncio.Future | None = None
    try:
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


async def without_heartbeats(stream: AsyncIterator[T | str], stall_s: float) -> AsyncIterator[T]:
    """``stream``'s items without heartbeats; :class:`ReplicaStalled` after ``stall_s`` of silence.

    The deadline starts with the replica's first heartbeat (it took the request):
    before that the request may wait in Serve's queue for a free replica, which is
    back-pressure, bounded by ``max_queued_requests``, not a lost replica. On a stall
    the pending read is cancelled (Serve then cancels the request, if the replica is
    still there to hear it) and ``stream`` is closed.
    """
    deadline: float | None = None  # none until the replica took the request
    try:
        while True:
            try:
                item = await asyncio.wait_for(anext(stream), deadline)
            except StopAsyncIteration:
                return
            except TimeoutError:
                raise ReplicaStalled(f"no answer and no heartbeat from the replica for {stall_s:g} s") from None
            deadline = stall_s
            if isinstance(item, str) and item == HEARTBEAT:
                continue
            yield item
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(Exception):
                await aclose()
