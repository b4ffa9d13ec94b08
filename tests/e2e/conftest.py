"""One real deployment per test session: `ebplus serve` on the embedded model, on loopback.

The deployment is started exactly as a user starts it (the CLI, in a subprocess)
and stopped with SIGTERM, so the tests also cover start-up and clean shutdown.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from observability.prom import prometheus  # noqa: F401  (fixture for the live dashboard test)

ROOT = Path(__file__).resolve().parents[2]
CONFIG = Path(__file__).with_name("e2e.yaml")
ADMIN_TOKEN = "e2e-admin-token"
START_TIMEOUT_S = 900


@dataclass
class Deployment:
    base_url: str
    admin_token: str
    process: subprocess.Popen
    log_path: Path

    @property
    def admin_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin_token}"}

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def _wait_ready(dep: Deployment) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if dep.process.poll() is not None:
            pytest.fail(f"ebplus serve exited with {dep.process.returncode}:\n{dep.log_tail()}")
        try:
            models = httpx.get(f"{dep.base_url}/v1/models", timeout=5)
            health = httpx.get(f"{dep.base_url}/health", timeout=5)
            if models.status_code == 200 and health.status_code == 200 and health.json()["controller"]:
                return
        except httpx.HTTPError:
            pass
        time.sleep(2)
    pytest.fail(f"deployment not ready after {START_TIMEOUT_S} s:\n{dep.log_tail()}")


@pytest.fixture(scope="session")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    env = {**os.environ, "EBPLUS_ADMIN_TOKEN": ADMIN_TOKEN, "PYTHONUNBUFFERED": "1"}
    env.pop("EBPLUS_API_KEY", None)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ebplus.cli", "serve", "--config", str(CONFIG)],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    dep = Deployment("http://127.0.0.1:18000", ADMIN_TOKEN, proc, log_path)
    try:
        _wait_ready(dep)
        yield dep
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
