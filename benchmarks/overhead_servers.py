"""The servers the serving-plane benchmark compares, each started as its user starts it.

Every server serves the same model with the same vLLM engine arguments (the
``engine:`` section of one deployment config, ``deploy/local.yaml`` by default)
on the same loopback port, one at a time:

* ``vllm`` (a): vLLM's own OpenAI server, ``python -m vllm.entrypoints.openai.api_server``,
  stock scheduler. (``vllm serve`` is the same server; the CPU build's console script
  does not start, see docs/plain-vllm.md.)
* ``ray-llm`` (b): Ray Serve LLM's stock OpenAI app (``ray.serve.llm.build_openai_app``)
  on the same Ray settings ``ebplus serve`` uses (:mod:`benchmarks.ray_llm_app`).
* ``ebplus-mb`` (c) and ``ebplus-auto`` (d): ``ebplus serve`` with ``scheduler.mode``
  replaced.

* ``vllm-plugin`` (e): the same vLLM server with EB+'s vLLM plugins (``VLLM_PLUGINS=ebplus``,
  ``--scheduler-cls``, mode ``mb`` through ``--additional-config``). The plugins are
  vLLM entry points of this package; where the installed package has none (they are
  not on every branch), the server is skipped with a message saying so.

Each server runs in its own session (process group), so stopping it stops its
whole process tree (engine core, Ray's GCS and raylet, every actor).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from benchmarks.e2e_bench import deployment_config, warm_up
from ebplus.deploy.app import engine_env
from ebplus.deploy.config import ServeConfig
from harness.deployment import ROOT, START_TIMEOUT_S, stop_session
from harness.waiting import HarnessError

#: The one port every server listens on (they run one at a time).
PORT = 18300
#: Ray's metrics agent port for the Ray-based servers (kept off the default 8080).
RAY_METRICS_PORT = 18380


@dataclass(frozen=True)
class Context:
    """What every server is started from: one deployment config and a scratch directory."""

    config_path: Path
    config: ServeConfig
    model_source: str  # the model directory (builtin models already built)
    workdir: Path
    port: int = PORT
    #: Added to every server's environment (``--env``: e.g. a ``RAY_SERVE_*`` setting to try).
    env: dict[str, str] = field(default_factory=dict)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass
class Running:
    """A started server: where it answers and the root of its process tree."""

    process: subprocess.Popen
    base_url: str
    model_id: str
    log_path: Path
    #: Read after the benchmark (``ebplus serve``: the controller's last decision).
    describe: Callable[[], dict[str, Any]] = field(default=lambda: {})

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self) -> None:
        stop_session(self.process)

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


@dataclass(frozen=True)
class ServerSpec:
    """One server of the comparison."""

    key: str  # command-line name
    letter: str  # the label: (a), (b), ...
    title: str
    start: Callable[[Context], Running]
    #: Why this installation cannot start it (None: it can); such a server is left out, with the reason.
    missing: Callable[[], str | None] = lambda: None


# --------------------------------------------------------------------------- launching


def _launch(argv: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        return subprocess.Popen(
            argv,
            cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _wait_ready(running: Running, marker: str | None, timeout_s: float = START_TIMEOUT_S) -> None:
    """Until the log shows ``marker`` (if any) and ``/v1/models`` answers 200."""

    def ready() -> bool:
        if marker is not None and marker not in running.log_path.read_text(errors="replace"):
            return False
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"{running.base_url}/v1/models", timeout=5).status_code == 200
        return False

    deadline = time.monotonic() + timeout_s
    while not ready():
        if running.process.poll() is not None:
            raise HarnessError(f"server exited with {running.process.returncode}:\n{running.log_tail()}")
        if time.monotonic() > deadline:
            raise HarnessError(f"server not ready after {timeout_s:.0f} s:\n{running.log_tail()}")
        time.sleep(1)


@contextlib.contextmanager
def _stopped_on_error(running: Running) -> Iterator[None]:
    try:
        yield
    except BaseException:
        running.stop()
        raise


def cli_flags(kwargs: dict[str, Any]) -> list[str]:
    """vLLM engine keyword arguments as ``vllm serve`` flags (``max_num_seqs=64`` -> ``--max-num-seqs 64``)."""
    flags: list[str] = []
    for key, value in kwargs.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + key.replace("_", "-"))
        elif isinstance(value, dict | list):
            flags += [flag, json.dumps(value)]
        else:
            flags += [flag, str(value)]
    return flags


def vllm_command(ctx: Context, extra: list[str] | None = None) -> list[str]:
    """vLLM's OpenAI server on the config's model and engine arguments (``extra``: further flags)."""
    cfg = ctx.config
    return [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", ctx.model_source, "--served-model-name", cfg.model.id,
        "--host", "127.0.0.1", "--port", str(ctx.port),
        *cli_flags(cfg.engine.engine_kwargs()), *(extra or []),
    ]  # fmt: skip


def start_vllm(ctx: Context) -> Running:
    """(a) vLLM's OpenAI server with its stock scheduler."""
    log_path = ctx.workdir / "vllm.log"
    proc = _launch(vllm_command(ctx), {**engine_env(ctx.config), **ctx.env}, log_path)
    running = Running(proc, ctx.base_url, ctx.config.model.id, log_path)
    with _stopped_on_error(running):
        _wait_ready(running, marker=None)
    return running


def start_ray_llm(ctx: Context) -> Running:
    """(b) Ray Serve LLM's stock OpenAI app on the same engine and Ray settings."""
    log_path = ctx.workdir / "ray-llm.log"
    argv = [
        sys.executable, "-m", "benchmarks.ray_llm_app", "--config", str(ctx.config_path),
        "--port", str(ctx.port), "--ray-metrics-port", str(RAY_METRICS_PORT),
    ]  # fmt: skip
    proc = _launch(argv, ctx.env, log_path)
    running = Running(proc, ctx.base_url, ctx.config.model.id, log_path)
    with _stopped_on_error(running):
        from benchmarks.ray_llm_app import READY

        _wait_ready(running, marker=READY)
    return running


#: The vLLM entry point (group, name) the EB+ plugin server needs.
PLUGIN_ENTRY_POINT = ("vllm.endpoint_plugins", "ebplus")


def plugin_missing() -> str | None:
    """Why (e) cannot start here, or None: the installed package declares no vLLM endpoint plugin."""
    from importlib.metadata import entry_points

    group, name = PLUGIN_ENTRY_POINT
    if any(ep.name == name for ep in entry_points(group=group)):
        return None
    return (
        f"no {group!r} entry point {name!r} is installed (the EB+ vLLM plugin is not in this checkout, "
        "or the package was installed before it: pip install --no-deps -e .)"
    )


def start_vllm_plugin(ctx: Context) -> Running:
    """(e) vLLM's OpenAI server with EB+'s plugins: our scheduler, mode mb, controller in the API server."""
    from ebplus.replicas.settings import SCHEDULER_CLS

    # The EB+ settings (c) runs with, less what only a Ray deployment has: the same controller
    # tuning (deploy/local.yaml sets planner.min_concurrency for a CPU replica) and cost profile.
    cfg = ctx.config
    extra = {
        "ebplus": {
            "scheduler": {"mode": "mb"},
            "controller": cfg.controller.model_dump(mode="json", exclude_unset=True),
            "replicas": {"profile": cfg.replicas.profile},
        }
    }
    flags = ["--scheduler-cls", SCHEDULER_CLS, "--additional-config", json.dumps(extra)]
    log_path = ctx.workdir / "vllm-plugin.log"
    env = {**engine_env(ctx.config), "VLLM_PLUGINS": "ebplus", **ctx.env}
    proc = _launch(vllm_command(ctx, flags), env, log_path)
    running = Running(proc, ctx.base_url, ctx.config.model.id, log_path)
    with _stopped_on_error(running):
        _wait_ready(running, marker=None)
    return running


def ebplus_starter(mode: str, env: dict[str, str] | None = None, tag: str = "") -> Callable[[Context], Running]:
    """(c), (d): ``ebplus serve`` with ``scheduler.mode`` set to ``mode`` (and ``env`` for its processes)."""

    def start(ctx: Context) -> Running:
        from harness import start_deployment

        path = deployment_config(ctx.config_path, mode, ctx.workdir, ctx.port, RAY_METRICS_PORT)
        log_path = ctx.workdir / f"ebplus-{mode}{tag}.log"
        dep = start_deployment(path, log_path, admin_token=secrets.token_hex(16), extra_env={**ctx.env, **(env or {})})
        assert dep.process is not None

        def describe() -> dict[str, Any]:
            replica = next(iter(dep.thresholds()["replicas"].values()), {})
            return {key: replica.get(key) for key in ("mode", "active", "k", "n", "version")}

        return Running(dep.process, dep.base_url, dep.model, log_path, describe)

    return start


def _mb_variant(key: str, letter: str, what: str, var: str, value: str) -> ServerSpec:
    """(c) with one of Ray Serve's settings given: ``what`` it does, ``var=value`` (not in the default list)."""
    return ServerSpec(key, letter, f"ebplus serve, mode mb, {what} ({var}={value})",
                      ebplus_starter("mb", {var: value}, key.removeprefix("ebplus-mb")))  # fmt: skip


SERVERS: dict[str, ServerSpec] = {
    spec.key: spec
    for spec in (
        ServerSpec("vllm", "a", "vLLM OpenAI server (stock scheduler)", start_vllm),
        ServerSpec("ray-llm", "b", "Ray Serve LLM build_openai_app", start_ray_llm),
        ServerSpec("ebplus-mb", "c", "ebplus serve, mode mb", ebplus_starter("mb")),
        ServerSpec("ebplus-auto", "d", "ebplus serve, mode auto", ebplus_starter("auto")),
        ServerSpec("vllm-plugin", "e", "vLLM OpenAI server + EB+ plugin, mode mb", start_vllm_plugin, plugin_missing),
        # (c) with HAProxy in front and without: what RAY_SERVE_ENABLE_HA_PROXY costs (not in the default list)
        _mb_variant("ebplus-mb-haproxy", "c+", "HAProxy in front", "RAY_SERVE_ENABLE_HA_PROXY", "1"),
        _mb_variant("ebplus-mb-no-haproxy", "c-", "Ray Serve's proxy in front", "RAY_SERVE_ENABLE_HA_PROXY", "0"),
        # (c) with Serve's proxy calling the ingress replica over gRPC (the default) and over Ray actor calls
        _mb_variant("ebplus-mb-proxy-grpc", "cg", "proxy to ingress over gRPC", "RAY_SERVE_PROXY_USE_GRPC", "1"),
        _mb_variant(
            "ebplus-mb-proxy-actor", "ca", "proxy to ingress by Ray actor calls", "RAY_SERVE_PROXY_USE_GRPC", "0"
        ),
    )
}


def start_and_warm(spec: ServerSpec, ctx: Context) -> tuple[Running, float]:
    """Start a server, warm it up (the first steps of a fresh engine are slow); also the start-up seconds."""
    t0 = time.monotonic()
    running = spec.start(ctx)
    seconds = time.monotonic() - t0
    with _stopped_on_error(running):
        warm_up(running.base_url, running.model_id)
    return running, seconds
