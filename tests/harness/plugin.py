"""EB+ inside vLLM's own OpenAI server (the plugin mode, no Ray), started as a plain-vLLM user starts it.

``tests/e2e/test_plain_vllm.py`` and the plugin half of ``make bench-hostile`` start it from here: the tiny random
Llama served under a Hugging Face Hub id that resolves offline from a Hub cache laid out in a temporary
``HF_HOME``, with ``VLLM_PLUGINS=ebplus``, ``--scheduler-cls`` and ``--additional-config``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from harness.waiting import HarnessError

MODEL = "ebplus-test/tiny-llama"  # a Hub id: found in the test's HF_HOME, offline
COMMIT = "0123456789abcdef0123456789abcdef01234567"
PORT = 18310
TOKEN = "plain-vllm-admin-token"
START_TIMEOUT_S = 300
ADDITIONAL = {
    "ebplus": {
        "scheduler": {"mode": "auto"},
        "controller": {"window": 60, "first_update": 20, "update_every": 20, "min_samples": 20,
                       "planner": {"min_concurrency": 2, "cooldown": 0}},
        "auth": {"admin_token_env": "EBPLUS_ADMIN_TOKEN"},
        "replicas": {"profile": "cpu-smollm2", "telemetry_interval_s": 0.25},
    }
}  # fmt: skip


def engine_args(additional: dict = ADDITIONAL) -> list[str]:
    """vLLM's engine arguments of the plugin mode, with ``additional`` as ``--additional-config``."""
    return [
        "--dtype", "float32", "--max-model-len", "512", "--max-num-seqs", "16", "--max-num-batched-tokens", "256",
        "--enforce-eager", "--scheduler-cls", "ebplus.replicas.scheduler.EBPlusScheduler",
        "--additional-config", json.dumps(additional),
    ]  # fmt: skip


ENGINE_ARGS = engine_args()


def hub_home(root: Path) -> tuple[Path, Path]:
    """``HF_HOME`` with the tiny model cached as the Hub would cache ``MODEL`` (files linked, like its blobs)."""
    from ebplus.deploy import models

    built = models.build_tiny_llama(models.DEFAULT_CACHE_DIR, seed=0)
    repo = root / "hub" / ("models--" + MODEL.replace("/", "--"))
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    for file in built.iterdir():
        if not file.name.startswith("."):
            (snapshot / file.name).symlink_to(file)
    return root, snapshot


def server_env(hf_home: Path) -> dict[str, str]:
    """The server's environment: the caller's without its EB+, vLLM and Hugging Face settings, plus the plugin's."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("EBPLUS_", "VLLM_", "HF_"))}
    return {
        **env,
        "VLLM_PLUGINS": "ebplus",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "EBPLUS_ADMIN_TOKEN": TOKEN,
        "HF_HOME": str(hf_home),
        "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
    }


@dataclass
class PluginServer:
    """A running ``vllm serve`` with EB+'s plugins, shaped like :class:`.deployment.Deployment` where the
    probes of :mod:`.campaign` read one (base URL, model, credentials, the root of the process tree)."""

    process: subprocess.Popen
    log_path: Path
    command: list[str] = field(default_factory=list)  # how it was started: :func:`restart_plugin_server` reuses it
    env: dict[str, str] = field(default_factory=dict)
    model: str = MODEL
    admin_token: str = TOKEN
    api_key: str | None = None
    base_url: str = f"http://127.0.0.1:{PORT}"
    api_headers: dict[str, str] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def admin_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin_token}"}

    def version(self) -> int:
        """The plugin's controller's threshold version (``/admin/thresholds``)."""
        r = httpx.get(f"{self.base_url}/admin/thresholds", headers=self.admin_headers, timeout=30)
        r.raise_for_status()
        return int(r.json()["version"])

    def engine_running(self) -> int:
        """Requests vLLM's engine runs now (its ``vllm:num_requests_running`` gauge)."""
        from prometheus_client.parser import text_string_to_metric_families

        text = httpx.get(f"{self.base_url}/metrics", timeout=30).text
        return int(sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
                       if s.name == "vllm:num_requests_running"))  # fmt: skip


def start_plugin_server(work: Path, additional: dict = ADDITIONAL, extra_env: dict[str, str] | None = None) -> PluginServer:
    """``python -m vllm.entrypoints.openai.api_server`` with the plugin, its output in ``work/vllm.log``; returns
    once it serves and its controller knows the engine (:class:`HarnessError` with the log's tail otherwise)."""
    hf_home, _ = hub_home(work / "hf")
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", MODEL,
               "--host", "127.0.0.1", "--port", str(PORT), *engine_args(additional)]  # fmt: skip
    env = {**server_env(hf_home), **(extra_env or {})}
    srv = PluginServer(_popen(command, env, work / "vllm.log"), work / "vllm.log", command, env)
    _wait_ready(srv)
    return srv


def restart_plugin_server(srv: PluginServer, log_path: Path) -> None:
    """Start the stopped ``srv`` again as it was started (same command and environment), its output in
    ``log_path``: ``srv`` is updated in place, so what holds it (a probe's measure) reaches the new server."""
    if srv.process.poll() is None:
        raise HarnessError("restart_plugin_server: the server still runs; stop it first")
    srv.log_path = log_path
    srv.process = _popen(srv.command, srv.env, log_path)
    _wait_ready(srv)


def _popen(command: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen:
    with open(log_path, "w") as log:
        return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _wait_ready(srv: PluginServer) -> None:
    """Until ``srv`` serves and its controller knows the engine (stopped, with the log's tail, if it never does)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if srv.process.poll() is not None or time.monotonic() > deadline:
            stop_plugin_server(srv)
            raise HarnessError(f"vLLM with the ebplus plugin not ready:\n{srv.log_path.read_text()[-4000:]}")
        try:
            ready = httpx.get(f"{srv.base_url}/health", timeout=5).status_code == 200
            if ready and httpx.get(f"{srv.base_url}/admin/thresholds", headers=srv.admin_headers, timeout=5).json()["replicas"]:
                return
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        time.sleep(1)


def stop_plugin_server(srv: PluginServer, timeout_s: float = 90) -> None:
    """SIGTERM, then SIGKILL of its process group if it does not stop in time."""
    if srv.process.poll() is None:
        srv.process.send_signal(signal.SIGTERM)
        try:
            srv.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(srv.process.pid, signal.SIGKILL)
            srv.process.wait()
