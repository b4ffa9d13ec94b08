"""Clients that leave leave no work behind: two windows where a cancelled request kept the engine busy.

1. vLLM's ``AsyncLLM.generate`` aborts a request when its caller is cancelled (the
client went away: Serve or the API server cancels the handler), but only once
``add_request`` has returned the request's output queue. ``add_request`` awaits
the engine core once per sequence (``n`` times for ``n > 1``, after an awaited
tokenisation); a cancellation that lands in one of those awaits leaves the queue
unknown to ``generate``, so it aborts nothing, and every sequence already handed
to the engine core is generated in full for nobody (vLLM 0.29 and 0.32:
``tests/engine/test_cancellation_asyncllm.py`` shows it). :func:`guard_add_request` wraps
one ``AsyncLLM``'s ``add_request``: the adding runs to its end in a task of its
own, shielded from the caller's cancellation, and if the caller was cancelled
meanwhile the request is aborted as soon as it is in (the abort ``generate``
makes: the parent id aborts every child sequence). The caller still gets its
``CancelledError`` at once.

2. Ray Serve LLM batches a streamed answer's chunks with a ``Batcher`` whose reading
task starts when it is made, before anyone reads the batched stream. A request
cancelled between the two (Serve drops a stream it has not started) left that task
reading the engine's stream to the end. :func:`read_when_read` makes the batched
stream only when it is first read, and closes it with its reader.

Pure asyncio; the engine is only called through ``add_request`` and ``abort``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

T = TypeVar("T")
U = TypeVar("U")

logger = logging.getLogger(__name__)

#: Set on the wrapper, so a second guard on the same engine is a no-op.
_GUARDED = "_ebplus_cancel_guard"


def guard_add_request(engine: Any) -> None:
    """Make ``engine.add_request`` (an ``AsyncLLM``) abort what it added for a caller cancelled meanwhile."""
    original = engine.add_request
    if getattr(original, _GUARDED, False):
        return
    aborts: set[asyncio.Task] = set()  # held until done: the event loop keeps only weak references

    def abort_once_added(adding: asyncio.Future) -> None:
        if adding.cancelled() or adding.exception() is not None:
            return  # nothing was left in the engine that generate would not clean up itself
        task = asyncio.ensure_future(_abort(engine, adding.result().request_id))
        aborts.add(task)
        task.add_done_callback(aborts.discard)

    async def add_request(*args: Any, **kwargs: Any) -> Any:
        adding = asyncio.ensure_future(original(*args, **kwargs))
        try:
            return await asyncio.shield(adding)
        except asyncio.CancelledError:
            adding.add_done_callback(abort_once_added)
            raise

    setattr(add_request, _GUARDED, True)
    add_request.__wrapped__ = original  # type: ignore[attr-defined]
    engine.add_request = add_request


async def _abort(engine: Any, request_id: str) -> None:
    try:
        await engine.abort(request_id, internal=True)
    except Exception as exc:  # an engine shutting down: nothing left to free
        logger.warning("could not abort request %s its client left while it was added: %s", request_id, exc)


def read_when_read(make: Callable[[T], AsyncIterator[U]], source: T) -> AsyncIterator[U]:
    """``make(source)``'s items, with ``make`` called when the first one is asked for, and the stream it
    made closed when this one is: a stream never read never starts ``source``."""

    async def stream() -> AsyncIterator[U]:
        made = make(source)
        try:
            async for item in made:
                yield item
        finally:
            aclose = getattr(made, "aclose", None)
            if aclose is not None:
                await aclose()

    return stream()
