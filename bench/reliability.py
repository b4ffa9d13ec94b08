"""The reliability harness: a live deployment, a Ray driver for real faults, an OpenAI load, hostile requests.

Used by ``tests/e2e/test_reliability.py`` (short runs with assertions) and by
``bench/reliability_bench.py`` (longer runs that write the Reliability table).
Every fault is real: the controller actor is killed with ``ray.kill`` (Ray
restarts it) or stopped with SIGSTOP; a model replica's process gets SIGKILL.
All traffic goes to loopback; every wait has a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from ebplus.deploy.config import ServeConfig, load_config

ROOT = Path(__file__).resolve().parents[1]
FAULTS_CONFIG = ROOT / "tests" / "e2e" / "faults.yaml"
START_TIMEOUT_S = 900


class HarnessError(RuntimeError):
    """The deployment or a fault did not behave within its deadline."""


def wait_until(what: str, check: Callable[[], Any], timeout_s: float, every_s: float = 0.25) -> Any:
    """Poll ``check`` until it returns something truthy; raise :class:`HarnessError` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last_exc: Exception | None = None
    while True:
        try:
            value = check()
            if value:
                return value
        except Exception as exc:  # the thing polled may be restarting
            last_exc = exc
        if time.monotonic() > deadline:
            raise HarnessError(f"timed out after {timeout_s:.0f} s waiting for {what} (last error: {last_exc!r})")
        time.sleep(every_s)


# --------------------------------------------------------------------------- the deployment


@dataclass
class Deployment:
    """A running ``ebplus serve`` subprocess (started as a user starts it) and how to reach it."""

    config: ServeConfig
    admin_token: str
    api_key: str | None
    process: subprocess.Popen | None  # None: attached to a deployment started elsewhere
    log_path: Path
    attached_pid: int | None = None

    @property
    def pid(self) -> int:
        """The ``ebplus serve`` process (the root of the deployment's process tree)."""
        if self.process is not None:
            return self.process.pid
        assert self.attached_pid is not None
        return self.attached_pid

    @property
    def base_url(self) -> str:
        return f"http://{self.config.http.host}:{self.config.http.port}"

    @property
    def model(self) -> str:
        return self.config.model.id

    @property
    def admin_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin_token}"}

    @property
    def api_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    @property
    def ray_address(self) -> str:
        """The GCS address from the start-up banner (``ebplus serve`` prints it)."""
        match = re.search(r"Ray cluster\s+(\S+)", self.log_text())
        if match is None:
            raise HarnessError("the deployment's banner names no Ray cluster")
        return match.group(1)

    def admin(self, path: str, timeout_s: float = 30) -> dict:
        r = httpx.get(f"{self.base_url}{path}", headers=self.admin_headers, timeout=timeout_s)
        r.raise_for_status()
        return r.json()

    def thresholds(self) -> dict:
        return self.admin("/admin/thresholds")


def start_deployment(
    config_path: Path,
    log_path: Path,
    admin_token: str,
    api_key: str | None = None,
    timeout_s: float = START_TIMEOUT_S,
) -> Deployment:
    """Start ``ebplus serve --config`` in its own session and wait until it serves and the controller answers."""
    config = load_config(config_path)
    env = {**os.environ, "EBPLUS_ADMIN_TOKEN": admin_token, "PYTHONUNBUFFERED": "1"}
    env.pop("EBPLUS_API_KEY", None)
    if api_key:
        env["EBPLUS_API_KEY"] = api_key
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ebplus.cli", "serve", "--config", str(config_path)],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    dep = Deployment(config, admin_token, api_key, proc, log_path)
    try:
        wait_ready(dep, timeout_s)
    except BaseException:
        stop_deployment(dep)
        raise
    return dep


def attach_deployment(config_path: Path, log_path: Path, admin_token: str, api_key: str | None, pid: int) -> Deployment:
    """A deployment already running (``ebplus serve`` with this config, its output in ``log_path``)."""
    dep = Deployment(load_config(config_path), admin_token, api_key, None, log_path, attached_pid=pid)
    wait_ready(dep, timeout_s=60)
    return dep


def _exited(dep: Deployment) -> bool:
    return dep.process is not None and dep.process.poll() is not None


def wait_ready(dep: Deployment, timeout_s: float = START_TIMEOUT_S) -> None:
    """Until ``ebplus serve`` printed its banner (Serve reports every deployment running: the
    ingress answers /v1/models before the model replicas are up) and the API and controller answer."""

    def ready() -> bool:
        if "EB+ Serve is up" not in dep.log_text():
            return False
        models = httpx.get(f"{dep.base_url}/v1/models", headers=dep.api_headers, timeout=5)
        health = httpx.get(f"{dep.base_url}/health", timeout=5)
        return models.status_code == 200 and health.status_code == 200 and health.json()["controller"]

    deadline = time.monotonic() + timeout_s
    while not _try(ready):
        if _exited(dep):
            raise HarnessError(f"ebplus serve exited with {dep.process.returncode}:\n{dep.log_tail()}")
        if time.monotonic() > deadline:
            raise HarnessError(f"deployment not ready after {timeout_s:.0f} s:\n{dep.log_tail()}")
        time.sleep(2)


def _try(check: Callable[[], bool]) -> bool:
    try:
        return bool(check())
    except (httpx.HTTPError, ValueError, KeyError):
        return False


def stop_deployment(dep: Deployment, timeout_s: float = 120) -> None:
    """SIGTERM (a clean shutdown), then SIGKILL of the whole session if it does not exit in time."""
    proc = dep.process
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of a process and all its descendants (Ray's GCS, raylet, workers, engine cores)."""
    import psutil

    total = 0
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            total += p.memory_info().rss
    return total


# --------------------------------------------------------------------------- the Ray driver


class Cluster:
    """A Ray driver attached to the deployment's cluster, for fault injection and replica introspection."""

    def __init__(self, dep: Deployment) -> None:
        self.dep = dep
        self.namespace = dep.config.ray.namespace

    def __enter__(self) -> Cluster:
        import ray

        # NOTE: a local `ray.init()` turns on Ray's token authentication and keeps the
        # token in ~/.ray/auth_token; a driver joining by address must opt in to send it.
        if "RAY_AUTH_MODE" not in os.environ and (Path.home() / ".ray" / "auth_token").exists():
            os.environ["RAY_AUTH_MODE"] = "token"
            from ray._raylet import Config

            Config.initialize("")  # the C++ config was read at import: read it again
        ray.init(address=self.dep.ray_address, namespace=self.namespace, log_to_driver=False)
        return self

    def __exit__(self, *exc: object) -> None:
        import ray

        ray.shutdown()

    # -- the controller --------------------------------------------------------

    def controller(self) -> Any:
        from ebplus.controller.actor import get_controller

        handle = get_controller()
        if handle is None:
            raise HarnessError("no controller actor")
        return handle

    def ping(self, timeout_s: float = 5.0) -> dict:
        import ray

        return ray.get(self.controller().ping.remote(), timeout=timeout_s)

    def snapshot(self, timeout_s: float = 10.0) -> dict:
        """The controller's full snapshot (per replica: last_seen, drops, engine counters...)."""
        import ray

        return ray.get(self.controller().snapshot.remote(), timeout=timeout_s)

    def kill_controller(self) -> dict:
        """``ray.kill`` the controller with restarts allowed; returns the ping before the kill."""
        import ray

        before = self.ping()
        ray.kill(self.controller(), no_restart=False)
        return before

    def wait_controller(self, timeout_s: float = 60.0, pid_not: int | None = None) -> dict:
        """The ping of a live controller (a new process when ``pid_not`` is given)."""

        def alive() -> dict | None:
            ping = self.ping(timeout_s=2.0)
            return ping if pid_not is None or ping["pid"] != pid_not else None

        return wait_until("the controller to answer", alive, timeout_s)

    @contextlib.contextmanager
    def controller_stopped(self) -> Iterator[int]:
        """SIGSTOP the controller's process for the duration of the block (SIGCONT always follows)."""
        pid = self.ping()["pid"]
        os.kill(pid, signal.SIGSTOP)
        try:
            yield pid
        finally:
            os.kill(pid, signal.SIGCONT)

    # -- the model replicas ----------------------------------------------------

    def llm_deployment(self) -> str:
        from ray import serve

        app = serve.status().applications["ebplus"]
        return next(name for name in app.deployments if name.startswith("EBPlusServer"))

    def running_replicas(self) -> int:
        from ray import serve

        app = serve.status().applications["ebplus"]
        return int(app.deployments[self.llm_deployment()].replica_states.get("RUNNING", 0))

    def replica_actors(self) -> dict[str, str]:
        """Serve replica id -> named actor of every model replica (starting ones included)."""
        import ray

        out = {}
        for actor in ray.util.list_named_actors(all_namespaces=True):
            name = actor["name"]
            if name.startswith("SERVE_REPLICA::ebplus#EBPlusServer"):
                out[name.rsplit("#", 1)[1]] = name
        return out

    def actor_pid(self, name: str, namespace: str = "serve") -> int:
        import ray
        from ray._private import state

        info = state.actors(ray.get_actor(name, namespace=namespace)._actor_id.hex())
        return int(info["Pid"])

    def kill_replica(self, replica_id: str) -> int:
        """SIGKILL a model replica's process (a crash: no shutdown hook runs); returns the pid."""
        pid = self.actor_pid(self.replica_actors()[replica_id])
        os.kill(pid, signal.SIGKILL)
        return pid

    def replica_status(self, replicas: int, timeout_s: float = 20.0) -> dict[str, dict]:
        """``ebplus_status`` of the model replicas, by replica id (calls in pairs until each answered:
        the router picks the replica; a handle's queue is bounded like any other)."""
        from ray import serve

        handle = serve.get_deployment_handle(self.llm_deployment(), app_name="ebplus")
        out: dict[str, dict] = {}
        deadline = time.monotonic() + timeout_s
        while len(out) < replicas and time.monotonic() < deadline:
            for response in [handle.ebplus_status.remote() for _ in range(2)]:
                with contextlib.suppress(Exception):
                    status = response.result(timeout_s=max(1.0, deadline - time.monotonic()))
                    out[status["replica_id"]] = status
        return out

    def session_logs(self) -> Path:
        """The cluster's log directory (Ray's session dir on this machine)."""
        import ray

        return Path(ray._private.worker._global_node.get_session_dir_path()) / "logs"


def healthy_fleet(dep: Deployment, cluster: Cluster, replicas: int, fresh_s: float = 3.0, timeout_s: float = 300) -> dict:
    """Wait until Serve runs ``replicas`` model replicas, the controller knows exactly those and
    hears from each, and every replica applies the controller's version. Returns the controller's snapshot."""

    def ok() -> dict | None:
        if cluster.running_replicas() != replicas:
            return None
        snap = cluster.snapshot()
        reps = snap["replicas"]
        if len(reps) != replicas or not set(reps) <= set(cluster.replica_actors()):
            return None
        now = time.time()
        if any(now - r["last_seen"] > fresh_s for r in reps.values()):
            return None
        if not all(r["applied_version"] == r["version"] == snap["version"] for r in reps.values()):
            return None
        return snap

    return wait_until(f"{replicas} healthy, registered and converged replicas", ok, timeout_s=timeout_s, every_s=0.5)


def fleet_totals(snapshot: dict) -> dict:
    """Counters to diff across a scenario: telemetry accepted/rejected, drops and preemptions of live replicas."""
    reps = snapshot["replicas"].values()
    return {
        "received_completions": snapshot["received"].get("completions", 0),
        "rejected": dict(snapshot["rejected"]),
        "dropped_completions": sum(r["dropped"]["completions"] for r in reps),
        "dropped_steps": sum(r["dropped"]["steps"] for r in reps),
        "preemptions": sum(int(r["engine_stats"].get("preemptions", 0)) for r in reps),
    }


# --------------------------------------------------------------------------- load


TOPICS = ("rivers", "bread", "chess", "rain", "trains", "music", "glass", "bees", "maps", "salt")


@dataclass
class Outcome:
    """One client request: what was asked, when, and how it ended."""

    index: int
    kind: str  # completion | chat, + "-stream"
    started: float
    ended: float = 0.0
    ok: bool = False
    error: str = ""
    chunks: int = 0


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
            "latency_p50_s": _pct(lat, 50),
            "latency_p95_s": _pct(lat, 95),
            "latency_max_s": round(lat[-1], 3) if lat else None,
        }


def _pct(values: list[float], q: float) -> float | None:
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
    on_start: Callable[[], Any] | None = None,
) -> LoadResult:
    """Send OpenAI requests (the official async client) from ``concurrency`` workers.

    Stops after ``requests`` requests or ``duration_s`` seconds, whichever comes
    first. ``max_retries`` is the client's own retry budget (it retries connection
    errors, 429 and 5xx, honouring ``Retry-After``); every HTTP answer is counted.
    A stream counts as ok only if it ends with a finish reason: a stream that stops
    early without an error would be a silent truncation.
    """
    from openai import AsyncOpenAI

    if requests is None and duration_s is None:
        raise ValueError("give requests or duration_s")
    result = LoadResult()

    async def count(response: httpx.Response) -> None:
        result.attempts[response.status_code] += 1
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
                kwargs = {"model": dep.model, "prompt": f"A note on {topic} ({i}):", "max_tokens": max_tokens, "extra_body": extra}
            api = client.chat.completions if chat else client.completions
            if stream:
                finish = None
                async for chunk in await api.create(stream=True, **kwargs):
                    out.chunks += 1
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

    async def worker() -> None:
        while deadline is None or time.monotonic() < deadline:
            i = next(counter, None)
            if i is None:
                return
            await one(i)

    if on_start is not None:
        on_start()
    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        await client.close()
        await http.aclose()
    result.wall_s = time.monotonic() - started
    return result


class BackgroundLoad:
    """:func:`run_load` on its own thread and event loop, so a test can inject faults meanwhile."""

    def __init__(self, dep: Deployment, **kwargs: Any) -> None:
        import threading

        self.result: LoadResult | None = None
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

    def __exit__(self, *exc: object) -> None:
        self.join()

    def join(self, timeout_s: float = 600) -> LoadResult:
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise HarnessError(f"load did not finish within {timeout_s:.0f} s (a hung connection?)")
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


# --------------------------------------------------------------------------- hostile requests


def hostile_requests(model: str) -> list[tuple[str, str, str, bytes | dict, str | None]]:
    """``(case, method, path, body, content_type)``: malformed and extreme API requests.

    Each must be answered with a 4xx and a reason (never a 5xx, never a crash).
    ``body`` is JSON (a dict) or raw bytes sent as is.
    """
    user = [{"role": "user", "content": "hi"}]
    return [
        ("max_tokens huge", "POST", "/v1/completions", {"model": model, "prompt": "hi", "max_tokens": 10**9}, None),
        ("max_tokens 2^63", "POST", "/v1/completions", {"model": model, "prompt": "hi", "max_tokens": 2**63}, None),
        ("max_tokens negative", "POST", "/v1/completions", {"model": model, "prompt": "hi", "max_tokens": -5}, None),
        ("max_tokens zero", "POST", "/v1/completions", {"model": model, "prompt": "hi", "max_tokens": 0}, None),
        ("max_tokens wrong type", "POST", "/v1/completions", {"model": model, "prompt": "hi", "max_tokens": "many"}, None),
        ("temperature negative", "POST", "/v1/completions", {"model": model, "prompt": "hi", "temperature": -1}, None),
        ("temperature 1e308", "POST", "/v1/completions", {"model": model, "prompt": "hi", "temperature": 1e308}, None),
        ("top_p 5", "POST", "/v1/completions", {"model": model, "prompt": "hi", "top_p": 5}, None),
        ("n negative", "POST", "/v1/completions", {"model": model, "prompt": "hi", "n": -1}, None),
        ("n 100000 (fan-out)", "POST", "/v1/completions", {"model": model, "prompt": "hi", "n": 100_000, "temperature": 1, "max_tokens": 4}, None),
        ("5000 prompts in one request", "POST", "/v1/completions", {"model": model, "prompt": ["hi"] * 5000, "max_tokens": 4}, None),
        ("logprobs 10000", "POST", "/v1/completions", {"model": model, "prompt": "hi", "logprobs": 10000}, None),
        ("seed 2^70", "POST", "/v1/completions", {"model": model, "prompt": "hi", "seed": 2**70}, None),
        ("prompt wrong type", "POST", "/v1/completions", {"model": model, "prompt": {"a": 1}}, None),
        ("prompt empty", "POST", "/v1/completions", {"model": model, "prompt": "", "max_tokens": 4}, None),
        ("prompt token id out of vocabulary", "POST", "/v1/completions", {"model": model, "prompt": [10**9]}, None),
        ("prompt token id negative", "POST", "/v1/completions", {"model": model, "prompt": [-1, 5]}, None),
        ("prompt enormous (200k chars)", "POST", "/v1/completions", {"model": model, "prompt": "word " * 40_000, "max_tokens": 4}, None),
        ("logit_bias not token ids", "POST", "/v1/completions", {"model": model, "prompt": "hi", "logit_bias": {"abc": 5}}, None),
        ("logit_bias out of vocabulary", "POST", "/v1/completions", {"model": model, "prompt": "hi", "logit_bias": {"999999999": 5}}, None),
        ("unknown model", "POST", "/v1/completions", {"model": "no-such-model", "prompt": "hi"}, None),
        ("unknown model (chat)", "POST", "/v1/chat/completions", {"model": "no-such-model", "messages": user}, None),
        ("chat messages empty", "POST", "/v1/chat/completions", {"model": model, "messages": []}, None),
        ("chat messages wrong type", "POST", "/v1/chat/completions", {"model": model, "messages": "hi"}, None),
        ("chat content wrong type", "POST", "/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": 5}]}, None),
        ("chat messages null", "POST", "/v1/chat/completions", {"model": model, "messages": None}, None),
        ("chat messages a number", "POST", "/v1/chat/completions", {"model": model, "messages": 5}, None),
        ("chat content part null", "POST", "/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": [None]}]}, None),
        ("chat content part a number", "POST", "/v1/chat/completions", {"model": model, "messages": [{"role": "system", "content": [5]}]}, None),
        ("chat message without a role", "POST", "/v1/chat/completions", {"model": model, "messages": [{"author": {"role": "assistant"}, "content": [{"type": "text", "text": "hi"}]}]}, None),
        ("chat max_tokens huge", "POST", "/v1/chat/completions", {"model": model, "messages": user, "max_tokens": 10**9}, None),
        ("chat max_completion_tokens negative", "POST", "/v1/chat/completions", {"model": model, "messages": user, "max_completion_tokens": -1}, None),
        ("chat image for a text model", "POST", "/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://127.0.0.1:1/x.png"}}]}]}, None),
        ("chat invalid regex", "POST", "/v1/chat/completions", {"model": model, "messages": user, "structured_outputs": {"regex": "(("}}, None),
        ("invalid UTF-8", "POST", "/v1/completions", b'{"model": "M", "prompt": "\xff\xfe"}'.replace(b"M", model.encode()), "application/json"),
        ("lone surrogate", "POST", "/v1/completions", b'{"model": "M", "prompt": "\\ud800"}'.replace(b"M", model.encode()), "application/json"),
        ("lone surrogate (chat)", "POST", "/v1/chat/completions", b'{"model": "M", "messages": [{"role": "user", "content": "\\udc00"}]}'.replace(b"M", model.encode()), "application/json"),
        ("number overflow 1e400", "POST", "/v1/completions", b'{"model": "M", "prompt": "hi", "max_tokens": 1e400}'.replace(b"M", model.encode()), "application/json"),
        ("NaN literal", "POST", "/v1/completions", b'{"model": "M", "prompt": "hi", "temperature": NaN}'.replace(b"M", model.encode()), "application/json"),
        ("invalid JSON", "POST", "/v1/completions", b'{"model": ', "application/json"),
        ("JSON not an object", "POST", "/v1/completions", b"[1, 2, 3]", "application/json"),
        ("JSON nested 5000 deep", "POST", "/v1/completions", b'{"prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}", "application/json"),
        ("empty body", "POST", "/v1/completions", b"", "application/json"),
        ("form body", "POST", "/v1/completions", b"model=x&prompt=hi", "application/x-www-form-urlencoded"),
        ("text/plain body", "POST", "/v1/chat/completions", b"hello", "text/plain"),
        ("body over the size limit", "POST", "/v1/completions", b'{"prompt": "' + b"a" * 300_000 + b'"}', "application/json"),
        ("GET on a POST route", "GET", "/v1/completions", b"", None),
        ("unknown model card", "GET", "/v1/models/no-such-model", b"", None),
        ("admin: invalid UTF-8 text", "PUT", "/admin/overrides", b"\xff\xfe", "text/plain"),
        ("admin: lone surrogate", "PUT", "/admin/overrides", b'{"replica": "\\ud800", "k": 2}', "application/json"),
        ("admin: number overflow", "PUT", "/admin/overrides", b'{"replica": "*", "k": 1e400}', "application/json"),
        ("admin: k negative", "PUT", "/admin/overrides", {"replica": "*", "k": -3}, None),
        ("admin: unknown field", "PUT", "/admin/overrides", {"replica": "*", "k": 2, "colour": "red"}, None),
        ("admin: history limit huge", "GET", "/admin/history?limit=99999999999999999999", b"", None),
    ]  # fmt: skip


def send_hostile(dep: Deployment) -> list[dict]:
    """Send every :func:`hostile_requests` case (with valid credentials); returns status and reason per case."""
    out = []
    with httpx.Client(base_url=dep.base_url, timeout=120) as client:
        for case, method, path, body, content_type in hostile_requests(dep.model):
            headers = dict(dep.admin_headers if path.startswith("/admin") else dep.api_headers)
            if isinstance(body, dict):
                r = client.request(method, path, json=body, headers=headers)
            else:
                if content_type:
                    headers["content-type"] = content_type
                r = client.request(method, path, content=body, headers=headers)
            out.append({"case": case, "path": path, "status": r.status_code, "reason": error_reason(r), "seconds": round(r.elapsed.total_seconds(), 2)})
    return out


def error_reason(r: httpx.Response) -> str:
    """The human-readable reason of an error answer (OpenAI ``error.message`` or FastAPI ``detail``)."""
    try:
        body = r.json()
    except ValueError:
        return r.text[:200]
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return str(body["error"].get("message", ""))[:200]
    if isinstance(body, dict) and "detail" in body:
        detail = body["detail"]
        if isinstance(detail, list) and detail and isinstance(detail[0], dict):
            return f"{detail[0].get('loc')}: {detail[0].get('msg')}"[:200]
        return str(detail)[:200]
    return json.dumps(body)[:200]


# --------------------------------------------------------------------------- scenarios
#
# Each returns plain figures (JSON-able): the tests assert on them, the benchmark tabulates them.


def _settle(cluster: Cluster, replicas: int, dep: Deployment) -> dict:
    """Let in-flight telemetry land (a few pushes), then the controller's snapshot."""
    time.sleep(3 * dep.config.replicas.telemetry_interval_s + 0.5)
    return healthy_fleet(dep, cluster, replicas)


def _telemetry_balance(before: dict, after: dict, served: int) -> dict:
    """Completions the clients got vs what the controller counted.

    ``lost``: served but neither received nor counted as dropped. ``double_counted``:
    received more often than served. A record dropped from a full outbox may
    still arrive (it was in a push that timed out and was delivered late), so
    ``received + dropped`` can exceed ``served`` without anything being counted twice.
    """
    received = after["received_completions"] - before["received_completions"]
    dropped = after["dropped_completions"] - before["dropped_completions"]
    dup = after["rejected"].get("duplicate", 0) - before["rejected"].get("duplicate", 0)
    return {
        "served": served,
        "received": received,
        "dropped_counted": dropped,
        "duplicates_skipped": dup,
        "lost": max(0, served - received - dropped),
        "double_counted": max(0, received - served),
    }


def _versions(snap: dict | None) -> str:
    """Fleet and per-replica versions of a snapshot, for error messages."""
    if snap is None:
        return "no snapshot"
    reps = {rid: (r["version"], r["applied_version"], r["active"], r["concurrency"]) for rid, r in snap["replicas"].items()}
    return f"version {snap['version']}, updates {snap['updates']}, replicas (version, applied, active, concurrency) {reps}"


def _plan_of(replica: dict) -> list:
    return [replica["k"], replica["n"], replica["active"], replica["theta"], replica["n_star"]]


def scenario_controller_kills(
    dep: Deployment, cluster: Cluster, *, kills: int = 3, gap_s: float = 6.0, concurrency: int = 4, max_tokens: int = 12
) -> dict:
    """``ray.kill`` the controller ``kills`` times during one load run (Ray restarts it).

    Per kill: restart time, whether it resumed from persisted state, each replica's
    (k, N, policy) before vs after, and how long until every replica applied the
    restarted controller's version.
    """
    replicas = dep.config.replicas.num_replicas
    snap0 = healthy_fleet(dep, cluster, replicas)
    totals0 = fleet_totals(snap0)
    events = []
    with BackgroundLoad(dep, duration_s=kills * gap_s + 3, concurrency=concurrency, max_tokens=max_tokens) as load:
        for _ in range(kills):
            time.sleep(gap_s / 2)
            before = cluster.snapshot()
            ping0 = cluster.kill_controller()
            t_kill = time.monotonic()
            ping1 = cluster.wait_controller(timeout_s=120, pid_not=ping0["pid"])
            t_up = time.monotonic()

            seen: dict = {}

            def converged(version_floor: int = before["version"], seen: dict = seen) -> dict | None:
                snap = seen["snap"] = cluster.snapshot()
                reps = snap["replicas"]
                if len(reps) != replicas or snap["version"] < version_floor:
                    return None
                ok = all(r["applied_version"] == r["version"] == snap["version"] for r in reps.values())
                return snap if ok else None

            try:
                after = wait_until("replicas to converge on the restarted controller", converged, timeout_s=60, every_s=0.05)
            except HarnessError as exc:
                raise HarnessError(f"{exc}; before the kill: {_versions(before)}; last seen: {_versions(seen.get('snap'))}") from exc
            t_conv = time.monotonic()
            same_version = after["version"] == before["version"]
            events.append(
                {
                    "restart_s": round(t_up - t_kill, 2),
                    "converge_s": round(t_conv - t_up, 2),
                    "restored": bool(ping1["restored"]),
                    "version_before": before["version"],
                    "version_after": after["version"],
                    "updates_before": before["updates"],
                    "updates_after": after["updates"],
                    "estimate_kept": after["estimate"] is not None or before["estimate"] is None,
                    # (k, N, policy, smoothed theta, N*): theta is theta_cold and N* null after a cold start
                    "thresholds_before": {rid: _plan_of(r) for rid, r in before["replicas"].items()},
                    "thresholds_after": {rid: _plan_of(r) for rid, r in after["replicas"].items()},
                    # a periodic re-plan between kill and convergence may change k legitimately
                    "same_version": same_version,
                }
            )
            time.sleep(gap_s / 2)
    result = load.join()
    totals1 = fleet_totals(_settle(cluster, replicas, dep))
    return {
        "kills": kills,
        "load": result.summary(),
        "failures": [o.error for o in result.failed],
        "events": events,
        "telemetry": _telemetry_balance(totals0, totals1, result.ok),
    }


def scenario_hung_controller(
    dep: Deployment, cluster: Cluster, *, hang_s: float = 8.0, base_s: float = 6.0, concurrency: int = 4, max_tokens: int = 12
) -> dict:
    """SIGSTOP the controller for ``hang_s`` under load: latency, the replicas' bounded outboxes, drops."""
    replicas = dep.config.replicas.num_replicas
    snap0 = healthy_fleet(dep, cluster, replicas)
    totals0 = fleet_totals(snap0)
    applied0 = {rid: [r["k"], r["n"], r["version"]] for rid, r in snap0["replicas"].items()}
    with BackgroundLoad(dep, duration_s=base_s + hang_s + base_s, concurrency=concurrency, max_tokens=max_tokens) as load:
        time.sleep(base_s)
        t_stop = time.monotonic()
        with cluster.controller_stopped():
            time.sleep(max(0.0, hang_s - 4.0))
            during = cluster.replica_status(replicas, timeout_s=4.0)  # while the controller is still stopped
            time.sleep(max(0.0, t_stop + hang_s - time.monotonic()))
        t_cont = time.monotonic()
    result = load.join()
    snap1 = _settle(cluster, replicas, dep)
    totals1 = fleet_totals(snap1)
    base = result.latencies(load.t0, t_stop)
    hung = result.latencies(t_stop, t_cont)
    return {
        "hang_s": round(t_cont - t_stop, 1),
        "load": result.summary(),
        "failures": [o.error for o in result.failed],
        "latency_p50_base_s": _pct(base, 50),
        "latency_p95_base_s": _pct(base, 95),
        "latency_p50_hung_s": _pct(hung, 50),
        "latency_p95_hung_s": _pct(hung, 95),
        "requests_during_hang": len(hung),
        "outbox_capacity": dep.config.replicas.telemetry_buffer,
        "during": {
            rid: {
                "applied": [s["applied"]["k"], s["applied"]["n"], s["applied"]["version"]],
                "outbox": s["outbox"],
                "push_failures": s["push_failures"],
            }
            for rid, s in during.items()
        },
        "applied_before": applied0,
        "dropped_completions": totals1["dropped_completions"] - totals0["dropped_completions"],
        "dropped_steps": totals1["dropped_steps"] - totals0["dropped_steps"],
        "telemetry": _telemetry_balance(totals0, totals1, result.ok),
        "replicas_after": sorted(snap1["replicas"]),
        "replicas_before": sorted(snap0["replicas"]),
    }


def scenario_replica_kill(
    dep: Deployment, cluster: Cluster, *, concurrency: int = 10, max_tokens: int = 160, load_s: float = 16.0, kill_after_s: float = 5.0
) -> dict:
    """SIGKILL the busiest model replica's process under load (streamed and not), the OpenAI client retrying as it does by default.

    Reports what the clients saw, whether any connection hung, how long the
    controller took to forget the dead replica, and how long Serve took to start a
    replacement that registered with the controller.
    """
    replicas = dep.config.replicas.num_replicas
    snap0 = healthy_fleet(dep, cluster, replicas)
    with BackgroundLoad(
        dep, duration_s=load_s, concurrency=concurrency, max_tokens=max_tokens, ignore_eos=True, max_retries=2
    ) as load:
        time.sleep(kill_after_s)
        status = cluster.replica_status(replicas, timeout_s=5.0)
        victim = max(sorted(status), key=lambda rid: status[rid]["running"])  # the one with requests in flight
        running_on_victim = status[victim]["running"]
        t_kill = time.monotonic()
        pid = cluster.kill_replica(victim)
        wait_until(
            "the controller to forget the dead replica",
            lambda: victim not in cluster.snapshot()["replicas"],
            timeout_s=dep.config.controller.stale_replica_s + 60,
            every_s=0.2,
        )
        t_forgot = time.monotonic()
    result = load.join(timeout_s=600)
    snap1 = healthy_fleet(dep, cluster, replicas, timeout_s=600)
    t_replaced = time.monotonic()
    return {
        "victim": victim,
        "victim_pid": pid,
        "running_on_victim_at_kill": running_on_victim,
        "in_flight_at_kill": len(result.in_flight_at(t_kill)),
        "load": result.summary(),
        "failed": [{"kind": o.kind, "error": o.error} for o in result.failed],
        "failed_streams": sum(o.kind.endswith("stream") for o in result.failed),
        "failed_non_streamed": sum(not o.kind.endswith("stream") for o in result.failed),
        "silently_truncated": sum(o.error.startswith("truncated") for o in result.failed),
        "longest_request_s": round(max(o.ended - o.started for o in result.outcomes), 1),
        "forgot_dead_s": round(t_forgot - t_kill, 1),
        "replaced_and_registered_s": round(t_replaced - t_kill, 1),
        "replicas_before": sorted(snap0["replicas"]),
        "replicas_after": sorted(snap1["replicas"]),
    }


def scenario_back_pressure(dep: Deployment, *, requests: int = 120, concurrency: int = 48, max_tokens: int = 32) -> dict:
    """More concurrent requests than slots + queue, no client retries: what comes back."""
    result = asyncio.run(
        run_load(dep, requests=requests, concurrency=concurrency, max_tokens=max_tokens, ignore_eos=True, max_retries=0)
    )
    other = [o.error for o in result.failed if " 503" not in o.error and " 429" not in o.error]
    return {
        "load": result.summary(),
        "streams_ok": sum(o.ok for o in result.outcomes if o.kind.endswith("stream")),
        "errors_other_than_back_pressure": other,
    }


def scenario_soak(
    dep: Deployment, cluster: Cluster, *, requests: int = 2000, concurrency: int = 64, max_tokens: int = 8, warmup: int = 100
) -> dict:
    """A bounded soak: ``requests`` requests at ``concurrency``, the client retrying back-pressure answers.

    RSS of the whole deployment (Ray, Serve, engines) after a warm-up and at the end.
    """
    replicas = dep.config.replicas.num_replicas
    asyncio.run(run_load(dep, requests=warmup, concurrency=min(concurrency, 16), max_tokens=max_tokens, max_retries=8))
    totals0 = fleet_totals(_settle(cluster, replicas, dep))  # the warm-up's telemetry has landed
    rss0 = tree_rss_bytes(dep.pid)
    result = asyncio.run(
        run_load(dep, requests=requests, concurrency=concurrency, max_tokens=max_tokens, max_retries=8, timeout_s=300)
    )
    rss1 = tree_rss_bytes(dep.pid)
    totals1 = fleet_totals(_settle(cluster, replicas, dep))
    return {
        "load": result.summary(),
        "failures": [o.error for o in result.failed][:20],
        "rss_start_mib": round(rss0 / 2**20),
        "rss_end_mib": round(rss1 / 2**20),
        "preemptions": totals1["preemptions"] - totals0["preemptions"],
        "telemetry": _telemetry_balance(totals0, totals1, result.ok),
    }


def scenario_bad_telemetry(dep: Deployment, cluster: Cluster) -> dict:
    """Malformed telemetry pushed straight to the live controller actor: rejected, counted, harmless."""
    import ray
    from ebplus.controller.telemetry import CompletionRecord, FinishReason, StepRecord, TelemetryBatch

    nan = float("nan")
    rid = sorted(cluster.snapshot()["replicas"])[0]
    batches = [
        TelemetryBatch(rid, completions=({"input_len": nan, "output_len": 4, "finish": "stop"},)),  # NaN
        TelemetryBatch(rid, completions=(CompletionRecord(12, -3, FinishReason.STOP),)),  # negative
        TelemetryBatch(rid, completions=(CompletionRecord(12, 10**12, FinishReason.STOP),)),  # absurd length
        TelemetryBatch(rid, completions=({"input_len": "x", "output_len": 4, "finish": "stop"},)),  # wrong type
        TelemetryBatch(rid, completions=({"input_len": 3, "output_len": 4, "finish": "exploded"},)),
        TelemetryBatch(rid, steps=(StepRecord(0, 5, 5, 0, float("inf")),)),  # infinite step time
        TelemetryBatch(rid, steps=(StepRecord(0, 5, 5, 0, -1.0),)),  # negative step time
        TelemetryBatch(rid, steps=(StepRecord(10**13, 0, 1, 0, 0.1),)),  # absurd token count
        TelemetryBatch(rid, completions=5, dropped_completions=float("nan")),  # wrong batch shapes
        TelemetryBatch(rid, extra={"engine_stats": {"preemptions": -7}}),
        TelemetryBatch("no-such-replica", completions=(CompletionRecord(12, 4, FinishReason.STOP),)),  # wrong replica
        TelemetryBatch(["not", "an", "id"]),
        "not a batch at all",
    ]
    before = cluster.snapshot()
    replies = [ray.get(cluster.controller().ingest.remote(b), timeout=10) for b in batches]
    after = cluster.snapshot()
    rejected = {k: after["rejected"].get(k, 0) - before["rejected"].get(k, 0) for k in after["rejected"]}
    return {
        "batches": len(batches),
        "rejected": {k: v for k, v in rejected.items() if v},
        "accepted_completions": after["received"].get("completions", 0) - before["received"].get("completions", 0),
        "replies_for_unknown": [r is None for r in replies[-3:]],
        "controller_alive": cluster.ping()["version"] >= 0,
        "metrics_text": httpx.get(f"{dep.base_url}/metrics", timeout=30).text,
    }


def scenario_secrets(dep: Deployment, cluster: Cluster) -> dict:
    """Credentials are enforced on the live deployment and appear in no response and no log line."""
    wrong = "wrong-token-Zx81q"
    base = dep.base_url
    body = {"model": dep.model, "prompt": "hi", "max_tokens": 2}
    checks = {
        "v1_without_key": httpx.post(f"{base}/v1/completions", json=body, timeout=60).status_code,
        "v1_wrong_key": httpx.post(f"{base}/v1/completions", json=body, headers={"Authorization": f"Bearer {wrong}"}, timeout=60).status_code,
        "v1_with_key": httpx.post(f"{base}/v1/completions", json=body, headers=dep.api_headers, timeout=60).status_code,
        "tokenize_without_key": httpx.post(f"{base}/tokenize", json={"model": dep.model, "prompt": "hi"}, timeout=60).status_code,
        "admin_put_without_token": httpx.put(f"{base}/admin/overrides", json={"replica": "*", "k": 2}, timeout=60).status_code,
        "admin_put_wrong_token": httpx.put(f"{base}/admin/overrides", json={"replica": "*", "k": 2}, headers={"Authorization": f"Bearer {wrong}"}, timeout=60).status_code,
        "admin_post_wrong_token": httpx.post(f"{base}/admin/recompute", headers={"Authorization": f"Bearer {wrong}"}, timeout=60).status_code,
        "admin_delete_wrong_token": httpx.delete(f"{base}/admin/overrides/x", headers={"Authorization": f"Bearer {wrong}"}, timeout=60).status_code,
        "admin_read_with_token": httpx.get(f"{base}/admin/thresholds", headers=dep.admin_headers, timeout=60).status_code,
    }  # fmt: skip
    answers = [
        httpx.post(f"{base}/v1/completions", json=body, headers={"Authorization": f"Bearer {wrong}"}, timeout=60).text,
        httpx.put(f"{base}/admin/overrides", json={"replica": "*", "k": 2}, headers={"Authorization": f"Bearer {wrong}"}, timeout=60).text,
        httpx.get(f"{base}/metrics", timeout=60).text,
        httpx.get(f"{base}/health", timeout=60).text,
        httpx.get(f"{base}/openapi.json", timeout=60).text,
    ]
    secrets = [s for s in (dep.admin_token, dep.api_key, wrong) if s]
    echoed = [s for s in secrets if any(s in a for a in answers)]
    time.sleep(2)  # log lines flush
    files = [dep.log_path, *(p for p in cluster.session_logs().rglob("*") if p.is_file())]
    leaks = []
    for path in files:
        try:
            data = path.read_bytes()
        except OSError:
            continue
        leaks.extend(f"{path.name}: {s[:4]}..." for s in secrets if s.encode() in data)
    return {"statuses": checks, "echoed": echoed, "log_files_scanned": len(files), "leaks": leaks}


def scenario_hostile(dep: Deployment) -> dict:
    """Every hostile request, then proof the deployment still serves."""
    answers = send_hostile(dep)
    ok = httpx.post(
        f"{dep.base_url}/v1/completions",
        json={"model": dep.model, "prompt": "still there?", "max_tokens": 4},
        headers=dep.api_headers,
        timeout=60,
    )
    return {
        "cases": answers,
        "bad": [a for a in answers if not (400 <= a["status"] < 500 and a["reason"])],
        "alive_after": ok.status_code == 200 and httpx.get(f"{dep.base_url}/health", timeout=30).status_code == 200,
    }


def scenario_fuzz(dep: Deployment, examples: int = 15, seed: int = 7) -> dict:
    """schemathesis (its CLI) over the live ``/openapi.json``, positive and negative cases, no 5xx allowed.

    Three runs so each gets its credentials: ``/admin`` with the admin token, the
    model routes with the API key, the open routes without either.
    """
    import shutil

    exe = shutil.which("schemathesis", path=str(Path(sys.executable).parent)) or shutil.which("schemathesis")
    if exe is None:
        return {"skipped": "schemathesis is not installed (pip install -e '.[dev]')"}
    runs = {}
    for name, regex, headers in (
        ("admin", "^/admin", dep.admin_headers),
        ("model API", "^/(v1|tokenize|detokenize)", dep.api_headers),
        ("open", "^/(metrics|health)", {}),
    ):
        cmd = [
            exe, "run", f"{dep.base_url}/openapi.json",
            "--checks", "not_a_server_error",
            "--max-examples", str(examples),
            "--include-path-regex", regex,
            "--mode", "all",
            "--request-timeout", "120",
            "--seed", str(seed),
            "--no-color",
        ]  # fmt: skip
        for key, value in headers.items():
            cmd += ["--header", f"{key}: {value}"]
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory() as scratch:  # schemathesis keeps a cache in its working dir
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, cwd=scratch)
        lines = [line for line in proc.stdout.splitlines() if line.strip()]
        runs[name] = {"exit_code": proc.returncode, "seconds": round(time.monotonic() - t0), "summary": lines[-15:]}
    return runs
