"""The deployment under test: ``ebplus serve`` started (or attached to) as a user runs it, and stopped.

Nothing here talks to Ray: the deployment is reached over HTTP (the OpenAI API,
``/admin``, ``/health``) and its process tree; :mod:`.cluster` joins its Ray cluster.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from ebplus.deploy.config import ServeConfig, load_config
from harness.waiting import HarnessError

ROOT = Path(__file__).resolve().parents[2]
FAULTS_CONFIG = ROOT / "tests" / "e2e" / "faults.yaml"
START_TIMEOUT_S = 900


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
        match = re.search(r"^\s+Ray cluster\s+(\S+)\s+\(ray\.init", self.log_text(), re.MULTILINE)
        if match is None:
            raise HarnessError("the deployment's banner names no Ray cluster")
        return match.group(1)

    def admin(self, path: str, timeout_s: float = 30) -> dict:
        r = httpx.get(f"{self.base_url}{path}", headers=self.admin_headers, timeout=timeout_s)
        r.raise_for_status()
        return r.json()

    def thresholds(self) -> dict:
        return self.admin("/admin/thresholds")

    def metric_total(self, name: str) -> float:
        """The sum of ``name``'s samples on ``/metrics`` (every replica's, every label set)."""
        from prometheus_client.parser import text_string_to_metric_families

        text = httpx.get(f"{self.base_url}/metrics", timeout=30).text
        return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def start_deployment(
    config_path: Path,
    log_path: Path,
    admin_token: str,
    api_key: str | None = None,
    timeout_s: float = START_TIMEOUT_S,
    extra_env: dict[str, str] | None = None,
    ray_address: str | None = None,
) -> Deployment:
    """Start ``ebplus serve --config`` in its own session and wait until it serves and the controller answers.

    ``extra_env`` is added to the environment of the whole process tree (Ray's processes inherit it).
    With ``ray_address`` it joins that cluster (``--address``) instead of starting one.
    """
    config = load_config(config_path)
    extra = []
    if ray_address is not None:
        config = config.model_copy(update={"ray": config.ray.model_copy(update={"address": ray_address})})
        extra = ["--address", ray_address]
    env = {**os.environ, **(extra_env or {}), "EBPLUS_ADMIN_TOKEN": admin_token, "PYTHONUNBUFFERED": "1"}
    env.pop("EBPLUS_API_KEY", None)
    if api_key:
        env["EBPLUS_API_KEY"] = api_key
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ebplus.cli", "serve", "--config", str(config_path), *extra],
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


@contextlib.contextmanager
def deployed(config_path: Path, log_path: Path, admin_token: str, api_key: str | None = None, **kwargs) -> Iterator[Deployment]:
    """:func:`start_deployment` for the length of a ``with`` block (a test module's fixture), stopped at its end
    whatever happened inside; a deployment that does not start raises :class:`HarnessError` with its log's tail."""
    dep = start_deployment(config_path, log_path, admin_token, api_key, **kwargs)
    private = None if dep.process is None else haproxy_dir(dep.process.pid)
    try:
        yield dep
    finally:
        stop_deployment(dep)
    if private is not None and dep.process is not None and dep.process.returncode == 0 and private.exists():
        # a clean stop removes HAProxy's private directory (its admin socket) with what ran from it
        raise HarnessError(f"ebplus serve stopped but left HAProxy's directory {private} behind")


def haproxy_dir(pid: int) -> Path | None:
    """The private HAProxy directory of the deployment ``pid`` roots (``EBPLUS_HAPROXY_DIR``), if it runs one:
    read off HAProxy's command line (``-f <dir>/<node id>/haproxy.cfg``), since ``ebplus serve`` sets the
    variable after it started (``/proc/<pid>/environ`` shows the environment a process started with)."""
    import psutil

    from ebplus.deploy.serve_env import PRIVATE_PREFIX

    for proc in process_tree(pid):
        try:
            argv = proc.cmdline()
        except psutil.Error:
            continue
        for arg in argv:
            path = Path(arg)
            if path.name == "haproxy.cfg" and path.parent.parent.name.startswith(PRIVATE_PREFIX):
                return path.parent.parent
    return None


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
    if dep.process is not None:
        stop_session(dep.process, timeout_s)


def stop_session(proc: subprocess.Popen, timeout_s: float = 120) -> None:
    """Stop a process started in its own session: SIGTERM, then SIGKILL of its process group after
    ``timeout_s``; members of the group still alive after a clean exit are killed too, so the next
    server starts on a quiet machine."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=timeout_s)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def process_tree(pid: int) -> list:
    """``pid``'s ``psutil.Process`` and all its descendants (none when it is gone)."""
    import psutil

    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of a process and all its descendants (Ray's GCS, raylet, workers, engine cores)."""
    import psutil

    total = 0
    for p in process_tree(pid):
        with contextlib.suppress(psutil.Error):
            total += p.memory_info().rss
    return total
