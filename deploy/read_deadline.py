"""A read deadline on uvicorn's HTTP connections: a client that stalls while sending its request is cut.

Both serving modes answer HTTP with uvicorn: in ``ebplus serve`` Ray Serve's proxy and
its ingress replica build their ``uvicorn.Config`` themselves (only the keep-alive
timeout is exposed), and in the plugin mode vLLM's API server does. uvicorn 0.55 has
no header-read or body-read timeout: its keep-alive timer runs between requests only,
so a connection that dribbles its request head a byte a second, sends a head and never
the body, or connects and says nothing holds a socket, a protocol object and (with a
head) an ASGI task for as long as the client likes. The hostile campaign held 13 such
connections open for 20 s in both modes. ASGI middleware cannot help: it sees a
request only once its head is complete.

:func:`install` therefore wraps the HTTP protocol classes themselves (``HttpToolsProtocol``
and ``H11Protocol``: ``http="auto"`` picks httptools when it is installed) in this
process. Each connection gets a watch, and one reaper per event loop (a ``call_later``
every :data:`TICK_S` at most, running only while connections are open) closes those
past their deadline ``T``:

* **head**: no complete request head ``T`` seconds after the connection was made (the
  first request) or after the first byte of the next one on a keep-alive connection.
  Closed without an answer: there is no request to answer. This covers the silent
  connection too.
* **body**: a head has arrived, the body has not, and no byte has come for ``T``
  seconds. Answered ``408 Request Timeout`` if the response has not started, then
  closed. The clock stands still while uvicorn itself stopped reading (flow control:
  the app has not consumed what it has) and while the client waits for our
  ``100 Continue`` (sent when the app first reads the body).

A request whose head and body have arrived is never cut, however long its answer
takes or streams: a long generation is legitimate, and Ray Serve LLM and the
heartbeats bound it. Idle keep-alive between requests stays uvicorn's business.

The state is read from uvicorn's own objects (the protocol's ``cycle``, its
``more_body``, ``response_complete``, ``response_started``, ``waiting_for_100_continue``
and ``flow.read_paused``) after each ``data_received``, rather than by hooking the
parsers' callbacks: the two implementations share those names, not their parser
hooks. ``tests/unit/test_read_deadline.py`` runs a real uvicorn with each of them.

Where it is installed: in the ingress replica's process (its constructor, with
``http.read_deadline_s``) and, through Ray Serve's one hook into the processes that
run its HTTP servers, ``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH`` =
:func:`ray_http_callback`, in Ray Serve's proxy (which serves ``http.port`` unless
HAProxy is on) and the ingress replica's own server; the deadline reaches those
processes in :data:`ENV`. The plain-vLLM plugin installs it in the API server when
it reads its settings.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import weakref
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger("ebplus.read_deadline")

#: The deadline used when none is configured (seconds).
DEFAULT_READ_DEADLINE_S = 10.0

#: The longest interval between two checks of a loop's connections (a deadline is kept within this).
TICK_S = 1.0

#: Where :func:`ray_http_callback` finds the deadline in a Ray Serve process (set by ``ebplus serve`` and the chart).
ENV = "EBPLUS_HTTP_READ_DEADLINE_S"

#: Ray Serve's hook into the processes that run its HTTP servers, and our function for it.
RAY_CALLBACK_ENV = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"
RAY_CALLBACK = "ebplus.deploy.read_deadline:ray_http_callback"

_TIMEOUT_BODY = b"the request body stalled\n"
RESPONSE_408 = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(_TIMEOUT_BODY), _TIMEOUT_BODY)
)

_MARK = "__ebplus_read_deadline__"


@dataclass
class _State:
    """This process's deadline and what the reapers have cut (for logs and tests)."""

    deadline_s: float | None = None
    cut: dict[str, int] = field(default_factory=lambda: {"head": 0, "body": 0})


_state = _State()


def deadline_s() -> float | None:
    """The deadline in force in this process (``None``: not installed)."""
    return _state.deadline_s


def cut_counts() -> dict[str, int]:
    """Connections this process cut, by the phase they stalled in (``head``, ``body``)."""
    return dict(_state.cut)


def install(seconds: float) -> None:
    """Cut stalled connections of every uvicorn server in this process after ``seconds``.

    Idempotent: the classes are wrapped once; a later call changes the deadline,
    which applies to open connections at the next check. Call it before the
    server serves: connections made before are not watched.

    Raises:
        ValueError: ``seconds`` is not positive.
    """
    if not seconds > 0:
        raise ValueError(f"the read deadline must be > 0 seconds, got {seconds!r}")
    for cls in _protocol_classes():
        _wrap(cls)
    _state.deadline_s = float(seconds)


def disable() -> None:
    """Watch no new connection and cut no open one; :func:`install` turns it back on."""
    _state.deadline_s = None


def from_env(environ: Mapping[str, str] | None = None) -> float:
    """The deadline :data:`ENV` names (the default when unset).

    Raises:
        ValueError: the variable is not a positive number.
    """
    environ = os.environ if environ is None else environ
    raw = environ.get(ENV)
    if raw is None or not raw.strip():
        return DEFAULT_READ_DEADLINE_S
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{ENV}={raw!r} is not a number of seconds") from None
    if not value > 0:
        raise ValueError(f"{ENV}={raw!r}: the read deadline must be > 0 seconds")
    return value


def export(seconds: float, environ: MutableMapping[str, str] | None = None) -> None:
    """Pass ``seconds`` to the Ray Serve processes started from ``environ`` (default ``os.environ``): the hook
    where not set, and the deadline (the config's value wins over an inherited one)."""
    environ = os.environ if environ is None else environ
    environ.setdefault(RAY_CALLBACK_ENV, RAY_CALLBACK)
    environ[ENV] = repr(float(seconds))


def ray_http_callback() -> list:
    """Ray Serve's ``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH``: called in its proxy and in a direct-ingress
    replica before their uvicorn server starts. Installs the guard (an installed deadline, the ingress
    replica's config, is kept) and adds no middleware."""
    if _state.deadline_s is None:
        install(from_env())
    return []


def _protocol_classes() -> list[type]:
    """uvicorn's HTTP/1.1 protocol classes that can be imported here (httptools is optional)."""
    classes = []
    from uvicorn.protocols.http.h11_impl import H11Protocol

    classes.append(H11Protocol)
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # no httptools: "auto" picks h11
        pass
    else:
        classes.append(HttpToolsProtocol)
    return classes


def _wrap(cls: type) -> None:
    """Wrap ``cls``'s connection callbacks to keep a watch per connection (once per class)."""
    if getattr(cls, _MARK, False):
        return
    made, received, lost = cls.connection_made, cls.data_received, cls.connection_lost

    @functools.wraps(made)
    def connection_made(self: Any, transport: asyncio.BaseTransport) -> None:
        made(self, transport)
        if _state.deadline_s is not None:
            _reaper().watch(self)

    @functools.wraps(received)
    def data_received(self: Any, data: bytes) -> None:
        before = self.cycle
        received(self, data)
        reaper = _reapers.get(asyncio.get_running_loop())
        watch = None if reaper is None else reaper.watches.get(self)
        if watch is not None:
            watch.received(self, before)

    @functools.wraps(lost)
    def connection_lost(self: Any, exc: Exception | None) -> None:
        reaper = _reapers.get(asyncio.get_running_loop())
        if reaper is not None:
            reaper.forget(self)
        lost(self, exc)

    cls.connection_made = connection_made
    cls.data_received = data_received
    cls.connection_lost = connection_lost
    setattr(cls, _MARK, True)


def _in_progress(cycle: Any) -> bool:
    """Whether a request is being served on the connection (its head has arrived, its response is not done)."""
    return cycle is not None and not cycle.response_complete


class _Watch:
    """One connection's clocks (event-loop time).

    ``head_since``: when the request head now expected began (``None``: none is
    expected, a request is in progress or the connection idles between requests).
    ``last_byte``: the last time the client sent something or was not expected to.
    """

    __slots__ = ("closed_at", "head_since", "last_byte", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        now = loop.time()
        self.head_since: float | None = now
        self.last_byte = now
        self.closed_at: float | None = None

    def received(self, protocol: Any, before: Any) -> None:
        now = self.loop.time()
        self.last_byte = now
        cycle = protocol.cycle
        if cycle is not before and cycle is not None:  # a head completed in this chunk
            self.head_since = None
        elif not _in_progress(cycle) and self.head_since is None:  # the first bytes of the next request
            self.head_since = now

    def overdue(self, protocol: Any, now: float, limit: float) -> str | None:
        """``"head"`` or ``"body"`` when the client is past its deadline, else ``None``."""
        cycle = protocol.cycle
        if _in_progress(cycle):
            owed = cycle.more_body and not protocol.flow.read_paused
            if not owed or getattr(cycle, "waiting_for_100_continue", False):
                self.last_byte = now  # nothing is owed by the client now: its clock restarts when something is
                return None
            return "body" if now - self.last_byte >= limit else None
        if self.head_since is not None and now - self.head_since >= limit:
            return "head"
        return None


class _Reaper:
    """The watched connections of one event loop, checked every :data:`TICK_S` at most while any is open."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.watches: dict[Any, _Watch] = {}
        self.timer: asyncio.TimerHandle | None = None

    def watch(self, protocol: Any) -> None:
        self.watches[protocol] = _Watch(self.loop)
        if self.timer is None:
            self._schedule()

    def forget(self, protocol: Any) -> None:
        self.watches.pop(protocol, None)

    def _schedule(self) -> None:
        limit = _state.deadline_s or DEFAULT_READ_DEADLINE_S
        self.timer = self.loop.call_later(min(TICK_S, limit / 4), self._tick)

    def _tick(self) -> None:
        self.timer = None
        limit = _state.deadline_s
        now = self.loop.time()
        for protocol, watch in list(self.watches.items()):
            transport = protocol.transport
            if transport.get_protocol() is not protocol:  # upgraded (websocket): no longer an HTTP request
                self.forget(protocol)
            elif transport.is_closing():
                if watch.closed_at is not None and limit is not None and now - watch.closed_at >= limit:
                    transport.abort()  # our 408 was never read: drop the buffer
                    self.forget(protocol)
            elif limit is not None and (phase := watch.overdue(protocol, now, limit)) is not None:
                self._cut(protocol, watch, phase, now)
        if self.watches:
            self._schedule()

    def _cut(self, protocol: Any, watch: _Watch, phase: str, now: float) -> None:
        transport = protocol.transport
        if phase == "body" and not protocol.cycle.response_started:
            transport.write(RESPONSE_408)
        transport.close()
        watch.closed_at = now
        _state.cut[phase] += 1
        logger.debug("closed a connection from %s stalled in its request %s", getattr(protocol, "client", None), phase)


#: The reaper of each event loop; a connection's callbacks run on its loop, so they find its watch there.
_reapers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Reaper] = weakref.WeakKeyDictionary()


def _reaper() -> _Reaper:
    loop = asyncio.get_running_loop()
    reaper = _reapers.get(loop)
    if reaper is None:
        reaper = _reapers[loop] = _Reaper(loop)
    return reaper
