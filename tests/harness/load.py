"""Client load: OpenAI requests (the official async client) from concurrent workers, and what they saw."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from harness.deployment import Deployment
from harness.waiting import HarnessError

#: Request header carrying the load's request index (the client's retries keep it), to count answers per request.
_INDEX_HEADER = "x-ebplus-load-index"

TOPICS = ("rivers", "bread", "chess", "rain", "trains", "music", "glass", "bees", "maps", "salt")


@dataclass
class Outcome:
    """One client request: what was asked, when, and how it ended."""

    index: int
    kind: str  # completion | chat, + "-stream"
    started: float
    ended: float = 0.0
    first: float = 0.0  # a stream's first chunk with text (its time to first token); 0: none, or not a stream
    ok: bool = False
    error: str = ""
    chunks: int = 0
    statuses: list[int] = field(default_factory=list)  # every HTTP answer, client retries included


@dataclass
class LoadResult:
    """What a load run saw, client side. ``attempts`` counts every HTTP answer, retries included."""

    outcomes: list[Outcome] = field(default_factory=list)
    attempts: Counter = field(default_factory=Counter)  # status -> count
    missing_retry_after: int = 0  # 429/503 answers without Retry-After
    wall_s: float = 0.0

    @property
    def sent(self) -> int:
        return len(self.outcomes)

    @property
    def ok(self) -> int:
        return sum(o.ok for o in self.outcomes)

    @property
    def failed(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.ok]

    @property
    def back_pressure(self) -> int:
        return self.attempts[429] + self.attempts[503]

    def latencies(self, since: float = 0.0, until: float = float("inf")) -> list[float]:
        return sorted(o.ended - o.started for o in self.outcomes if o.ok and since <= o.started < until)

    def in_flight_at(self, t: float) -> list[Outcome]:
        return [o for o in self.outcomes if o.started < t < (o.ended or float("inf"))]

    def longest_s(self) -> float | None:
        """The longest request, failed ones included (a hang shows here, not in the latencies)."""
        ended = [o.ended - o.started for o in self.outcomes if o.ended]
        return round(max(ended), 2) if ended else None

    def merged(self, other: LoadResult) -> LoadResult:
        """Two loads that ran side by side, as one (their wall time: the longer one's)."""
        return LoadResult(
            outcomes=self.outcomes + other.outcomes,
            attempts=self.attempts + other.attempts,
            missing_retry_after=self.missing_retry_after + other.missing_retry_after,
            wall_s=max(self.wall_s, other.wall_s),
        )

    def summary(self) -> dict:
        lat = self.latencies()
        return {
            "sent": self.sent,
            "ok": self.ok,
            "failed": len(self.failed),
            "errors": dict(Counter(o.error.split(":")[0] for o in self.failed)),
            "http_attempts": {str(k): v for k, v in sorted(self.attempts.items())},
            "back_pressure_answers": self.back_pressure,
            "back_pressure_without_retry_after": self.missing_retry_after,
            "wall_s": round(self.wall_s, 1),
            "req_per_s": round(self.ok / self.wall_s, 1) if self.wall_s else None,
            "latency_p50_s": percentile(lat, 50),
            "latency_p95_s": percentile(lat, 95),
            "latency_max_s": round(lat[-1], 3) if lat else None,
            "longest_request_s": self.longest_s(),
        }


def _text(choice: Any) -> str:
    """The text a stream's chunk carries (a completion's ``text``, a chat's ``delta.content``)."""
    delta = getattr(choice, "delta", None)
    return (getattr(delta, "content", None) if delta is not None else getattr(choice, "text", None)) or ""


def percentile(values: list[float], q: float) -> float | None:
    """The ``q``-th percentile of sorted ``values`` (nearest rank, rounded to ms); None when empty."""
    if not values:
        return None
    return round(values[min(len(values) - 1, int(q / 100 * len(values)))], 3)


async def run_load(
    dep: Deployment,
    *,
    requests: int | None = None,
    duration_s: float | None = None,
    concurrency: int = 8,
    max_tokens: int = 8,
    stream_every: int = 2,
    chat_every: int = 2,
    max_retries: int = 0,
    timeout_s: float = 120.0,
    ignore_eos: bool = False,
    rate_per_s: float | Callable[[], float] | None = None,
    arrivals_s: Sequence[float] | None = None,
    seed: int = 0,
    stop: threading.Event | None = None,
    on_start: Callable[[], Any] | None = None,
    into: LoadResult | None = None,
) -> LoadResult:
    """Send OpenAI requests (the official async client), closed- or open-loop.

    Closed loop (``rate_per_s`` None): ``concurrency`` workers, each sending its next
    request when the last one ended. Open loop: requests arrive as a Poisson process
    of ``rate_per_s`` whatever the server does (the load a fault does not slow down);
    a callable rate is read before each arrival (a ramp; 0 pauses arrivals), and
    ``concurrency`` only sizes the connection pool. ``arrivals_s`` (offsets from the
    start, ascending) is an open loop on a fixed trace instead: the same arrivals on
    every run, whatever the clock did between them. Either stops after ``requests``
    requests, ``duration_s`` seconds or ``stop`` being set, whichever comes first. ``max_retries`` is the
    client's own retry budget (it retries connection errors, 429 and 5xx, honouring
    ``Retry-After``); every HTTP answer is counted, per request too. A stream counts as
    ok only if it ends with a finish reason: a stream that stops early without an
    error would be a silent truncation.
    """
    from openai import AsyncOpenAI

    if arrivals_s is not None:
        requests = len(arrivals_s) if requests is None else min(requests, len(arrivals_s))
    if requests is None and duration_s is None:
        raise ValueError("give requests, duration_s or arrivals_s")
    result = LoadResult() if into is None else into  # ``into``: readable while the load runs

    by_index: dict[str, Outcome] = {}

    async def count(response: httpx.Response) -> None:
        result.attempts[response.status_code] += 1
        out = by_index.get(response.request.headers.get(_INDEX_HEADER, ""))
        if out is not None:
            out.statuses.append(response.status_code)
        if response.status_code in (429, 503) and "retry-after" not in response.headers:
            result.missing_retry_after += 1

    http = httpx.AsyncClient(
        event_hooks={"response": [count]},
        limits=httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4),
        timeout=timeout_s,
    )
    client = AsyncOpenAI(
        base_url=f"{dep.base_url}/v1",
        api_key=dep.api_key or "unused",
        max_retries=max_retries,
        timeout=timeout_s,
        http_client=http,
    )
    started = time.monotonic()
    deadline = None if duration_s is None else started + duration_s
    counter = iter(range(requests if requests is not None else 1 << 62))
    extra = {"ignore_eos": True} if ignore_eos else None

    async def one(i: int) -> None:
        stream = stream_every > 0 and i % stream_every == stream_every - 1
        chat = chat_every > 0 and i % chat_every == 0
        out = Outcome(i, ("chat" if chat else "completion") + ("-stream" if stream else ""), time.monotonic())
        result.outcomes.append(out)
        by_index[str(i)] = out
        topic = TOPICS[i % len(TOPICS)]
        try:
            if chat:
                kwargs = {
                    "model": dep.model,
                    "messages": [{"role": "user", "content": f"Tell me about {topic} ({i})."}],
                    "max_tokens": max_tokens,
                    "extra_body": extra,
                }
            else:
                kwargs = {
                    "model": dep.model,
                    "prompt": f"A note on {topic} ({i}):",
                    "max_tokens": max_tokens,
                    "extra_body": extra,
                }
            kwargs["extra_headers"] = {_INDEX_HEADER: str(i)}
            api = client.chat.completions if chat else client.completions
            if stream:
                finish = None
                async for chunk in await api.create(stream=True, **kwargs):
                    out.chunks += 1
                    if not out.first and chunk.choices and _text(chunk.choices[0]):
                        out.first = time.monotonic()
                    if chunk.choices and chunk.choices[0].finish_reason:
                        finish = chunk.choices[0].finish_reason
                out.ok = finish is not None
                out.error = "" if out.ok else "truncated: stream ended without a finish reason"
            else:
                response = await api.create(**kwargs)
                out.ok = bool(response.choices) and response.choices[0].finish_reason is not None
                out.error = "" if out.ok else "empty: no choices"
        except Exception as exc:  # what the client saw
            status = getattr(exc, "status_code", None)
            out.error = f"{type(exc).__name__}{'' if status is None else f' {status}'}: {str(exc)[:200]}"
        out.ended = time.monotonic()

    def over() -> bool:
        return (deadline is not None and time.monotonic() >= deadline) or (stop is not None and stop.is_set())

    async def reached(due: float) -> bool:
        """Sleep until ``due`` (monotonic); whether the load is still on then."""
        while time.monotonic() < due and not over():
            await asyncio.sleep(min(0.2, due - time.monotonic()))
        return not over()

    async def worker() -> None:
        while not over():
            i = next(counter, None)
            if i is None:
                return
            await one(i)

    async def scheduled() -> None:
        assert arrivals_s is not None
        tasks = []
        for i in counter:
            if not await reached(started + arrivals_s[i]):
                break
            tasks.append(asyncio.create_task(one(i)))
        await asyncio.gather(*tasks)

    async def arrivals() -> None:
        assert rate_per_s is not None
        rng = random.Random(seed)
        due, tasks = started, []
        for i in counter:
            rate = rate_per_s() if callable(rate_per_s) else rate_per_s
            while rate <= 0 and not over():  # paused
                await asyncio.sleep(0.2)
                due = time.monotonic()
                rate = rate_per_s() if callable(rate_per_s) else rate_per_s
            due += rng.expovariate(rate) if rate > 0 else 0.0
            if not await reached(due):
                break
            tasks.append(asyncio.create_task(one(i)))
        await asyncio.gather(*tasks)

    if on_start is not None:
        on_start()
    try:
        if arrivals_s is not None:
            await scheduled()
        elif rate_per_s is None:
            await asyncio.gather(*(worker() for _ in range(concurrency)))
        else:
            await arrivals()
    finally:
        await client.close()
        await http.aclose()
    result.wall_s = time.monotonic() - started
    return result


class BackgroundLoad:
    """:func:`run_load` on its own thread and event loop, so a test can inject faults meanwhile."""

    def __init__(self, dep: Deployment, **kwargs: Any) -> None:
        self.stop = threading.Event()
        kwargs.setdefault("stop", self.stop)
        self.result: LoadResult | None = None
        self.live = LoadResult()  # the outcomes so far (appended to from the load's thread)
        kwargs.setdefault("into", self.live)
        self.error: BaseException | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(dep, kwargs), daemon=True)

    def _run(self, dep: Deployment, kwargs: dict) -> None:
        try:
            self.result = asyncio.run(run_load(dep, on_start=self._started.set, **kwargs))
        except BaseException as exc:
            self.error = exc
            self._started.set()

    def __enter__(self) -> BackgroundLoad:
        self._thread.start()
        self._started.wait(30)
        self.t0 = time.monotonic()
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is not None:  # the scenario failed: do not wait out the load's duration
            self.stop.set()
        self.join()

    def join(self, timeout_s: float = 600) -> LoadResult:
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise HarnessError(f"load did not finish within {timeout_s:.0f} s (a hung connection?)")
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result
