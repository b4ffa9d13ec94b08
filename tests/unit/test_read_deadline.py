"""deploy/read_deadline.py on a real uvicorn (httptools and h11) on loopback: stalled clients are cut, slow answers
and bodies that keep coming are not.

Every case of one server runs at once, in threads, with a 1 s deadline: the file takes a few seconds.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import pytest
import uvicorn

from ebplus.deploy import read_deadline

DEADLINE_S = 1.0
#: A cut comes within a check interval (a quarter of the deadline here) after the deadline; the rest is a loaded CI.
SLACK_S = 1.5


async def app(scope: dict, receive: Callable, send: Callable) -> None:
    """``/slow``: five chunks 0.4 s apart (2 s, longer than the deadline); ``/echo``: the body's length; else ``ok``."""
    if scope["type"] != "http":
        return
    if scope["path"] == "/slow":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        for i in range(5):
            await asyncio.sleep(0.4)
            await send({"type": "http.response.body", "body": f"chunk{i}\n".encode(), "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return
    body = b""
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return  # the client is gone
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    answer = str(len(body)).encode() if scope["path"] == "/echo" else b"ok"
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(answer))]})
    await send({"type": "http.response.body", "body": answer})


@contextmanager
def serving(http: str) -> Iterator[int]:
    """uvicorn in a thread with the guard installed; yields the port."""
    read_deadline.install(DEADLINE_S)
    config = uvicorn.Config(app, host="127.0.0.1", port=0, http=http, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(500):
        if server.started:
            break
        time.sleep(0.01)
    try:
        yield server.servers[0].sockets[0].getsockname()[1]
    finally:
        read_deadline.disable()
        server.should_exit = True
        thread.join(10)


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.settimeout(0.1)
    return sock


def read_until_closed(sock: socket.socket, t0: float, limit_s: float) -> tuple[bytes, float | None]:
    """Everything the server sends until it closes (and when, from ``t0``), or ``None`` if still open at ``limit_s``."""
    data = b""
    while time.monotonic() - t0 < limit_s:
        try:
            chunk = sock.recv(4096)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return data, time.monotonic() - t0
        if not chunk:
            return data, time.monotonic() - t0
        data += chunk
    return data, None


def dribble_head(port: int) -> tuple[bytes, float | None]:
    """A request head a byte every 0.2 s, never finished."""
    t0 = time.monotonic()
    with connect(port) as sock:
        for byte in b"GET /ok HTTP/1.1\r\nHost: x\r\nX-Long-Header: " + b"a" * 100:
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                return b"", time.monotonic() - t0
            data, closed = read_until_closed(sock, time.monotonic(), 0.2)
            if closed is not None:
                return data, time.monotonic() - t0
            if time.monotonic() - t0 > DEADLINE_S + SLACK_S:
                return data, None
    return b"", None


def head_without_body(port: int, sent: bytes = b"") -> tuple[bytes, float | None]:
    """A POST head announcing 10 bytes, then ``sent`` of them and nothing more."""
    t0 = time.monotonic()
    with connect(port) as sock:
        sock.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n" + sent)
        return read_until_closed(sock, t0, DEADLINE_S + SLACK_S)


def silent(port: int) -> tuple[bytes, float | None]:
    t0 = time.monotonic()
    with connect(port) as sock:
        return read_until_closed(sock, t0, DEADLINE_S + SLACK_S)


def slow_answer(port: int) -> tuple[bytes, float]:
    """A complete request whose answer streams for 2 s."""
    t0 = time.monotonic()
    with connect(port) as sock:
        sock.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        data = read_until(sock, lambda d: b"0\r\n\r\n" in d, 5)
        return data, time.monotonic() - t0


def slow_body(port: int) -> bytes:
    """A body of 5 bytes, one every 0.5 s (2 s in all, never a gap of the deadline)."""
    with connect(port) as sock:
        sock.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n")
        for byte in b"abcde":
            time.sleep(0.5)
            sock.sendall(bytes([byte]))
        return read_until(sock, lambda d: d.endswith(b"\r\n\r\n5"), 2)


def read_until(sock: socket.socket, done: Callable[[bytes], bool], limit_s: float) -> bytes:
    """What ``sock`` sends until ``done`` says it is all there, it closes, or ``limit_s`` passes."""
    data, t0 = b"", time.monotonic()
    while not done(data) and time.monotonic() - t0 < limit_s:
        try:
            chunk = sock.recv(4096)
        except TimeoutError:
            continue
        if not chunk:
            break
        data += chunk
    return data


def keep_alive(port: int) -> list[bytes]:
    """Two requests on one connection, 1.5 s apart (idle longer than the deadline: keep-alive is uvicorn's)."""
    answers = []
    with connect(port) as sock:
        for pause in (0.0, 1.5):
            time.sleep(pause)
            sock.sendall(b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n")
            answers.append(read_until(sock, lambda d: d.endswith(b"ok"), 5))
    return answers


@pytest.mark.parametrize("http", ["httptools", "h11"])
def test_stalled_clients_are_cut_and_slow_answers_are_not(http: str) -> None:
    cut_before = read_deadline.cut_counts()
    with serving(http) as port, ThreadPoolExecutor(8) as pool:
        dribbled = pool.submit(dribble_head, port)
        no_body = pool.submit(head_without_body, port)
        part_body = pool.submit(head_without_body, port, b"abc")
        quiet = pool.submit(silent, port)
        streamed = pool.submit(slow_answer, port)
        trickled = pool.submit(slow_body, port)
        reused = pool.submit(keep_alive, port)

        for name, future in (("dribbled head", dribbled), ("silent", quiet)):
            data, closed = future.result()
            assert closed is not None, f"{name}: still open after {DEADLINE_S + SLACK_S} s"
            assert DEADLINE_S - 0.3 <= closed <= DEADLINE_S + SLACK_S, (name, closed)
            assert data == b"", (name, data)
        for name, future in (("head without body", no_body), ("body cut short", part_body)):
            data, closed = future.result()
            assert closed is not None, f"{name}: still open after {DEADLINE_S + SLACK_S} s"
            assert data.startswith(b"HTTP/1.1 408 "), (name, data)
            assert DEADLINE_S - 0.3 <= closed <= DEADLINE_S + SLACK_S, (name, closed)

        data, took = streamed.result()
        assert data.startswith(b"HTTP/1.1 200 ") and b"chunk4" in data and data.endswith(b"0\r\n\r\n"), data
        assert took >= 2.0
        assert trickled.result().startswith(b"HTTP/1.1 200 ") and trickled.result().endswith(b"5")
        assert [a.split(b"\r\n", 1)[0] for a in reused.result()] == [b"HTTP/1.1 200 OK"] * 2
    cut = read_deadline.cut_counts()
    assert {phase: cut[phase] - cut_before[phase] for phase in cut} == {"head": 2, "body": 2}  # ours, nothing else


def test_install_checks_the_deadline_and_is_idempotent() -> None:
    with pytest.raises(ValueError, match="> 0"):
        read_deadline.install(0)
    before = read_deadline.deadline_s()
    try:
        read_deadline.install(3)
        read_deadline.install(4)
        from uvicorn.protocols.http.h11_impl import H11Protocol

        wrapped = H11Protocol.data_received
        read_deadline.install(5)
        assert H11Protocol.data_received is wrapped  # wrapped once
        assert read_deadline.deadline_s() == 5.0
    finally:
        if before is None:
            read_deadline.disable()
        else:
            read_deadline.install(before)


def test_the_deadline_reaches_ray_serve_processes_through_the_environment() -> None:
    env: dict[str, str] = {}
    read_deadline.export(7.5, env)
    assert env == {read_deadline.RAY_CALLBACK_ENV: read_deadline.RAY_CALLBACK, read_deadline.ENV: "7.5"}
    assert read_deadline.from_env(env) == 7.5
    assert read_deadline.from_env({}) == read_deadline.DEFAULT_READ_DEADLINE_S
    for bad in ("0", "-1", "soon"):
        with pytest.raises(ValueError, match=read_deadline.ENV):
            read_deadline.from_env({read_deadline.ENV: bad})


def test_both_modes_take_the_deadline_from_their_config_and_refuse_a_non_positive_one() -> None:
    from pydantic import ValidationError

    from ebplus.deploy.config import HttpSection
    from ebplus.deploy.vllm_plugin import PluginSettings

    assert HttpSection().read_deadline_s == PluginSettings().read_deadline_s == read_deadline.DEFAULT_READ_DEADLINE_S
    assert (
        HttpSection(read_deadline_s=2.5).read_deadline_s == PluginSettings(read_deadline_s=2.5).read_deadline_s == 2.5
    )
    for model in (HttpSection, PluginSettings):
        with pytest.raises(ValidationError, match="greater than 0"):
            model(read_deadline_s=0)
