"""A real Prometheus server for tests: start it on loopback, scrape given targets, run PromQL.

Nothing is installed here: the ``prometheus`` binary comes from Debian's package
(``make tools``), or ``$PROMETHEUS`` names one. Missing, a test fails under ``CI=true``
and is skipped elsewhere (see ``tests/external_tools.py``).

Use the fixture from any test module (import it, or list this module in ``pytest_plugins``
of the root conftest)::

    from observability.prom import Target, prometheus  # noqa: F401  (fixture)

    def test_panels(prometheus):
        prom = prometheus([Target("127.0.0.1:8000", job="ebplus"),          # the app's /metrics
                           Target("127.0.0.1:8080", job="ray")])             # Ray's metrics agent
        prom.wait_for("count_over_time(up[1m]) >= 5")
        assert prom.query('up{job="ebplus"}')[0]["value"][1] == "1"
"""

from __future__ import annotations

import json
import math
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from external_tools import binary


class PromQLError(RuntimeError):
    """Prometheus refused a query (bad syntax, unknown function...)."""


@dataclass(frozen=True)
class Target:
    """One scrape target: ``address`` is ``host:port``."""

    address: str
    job: str = "ebplus"
    metrics_path: str = "/metrics"
    labels: dict[str, str] = field(default_factory=dict)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    """One Prometheus server process with a generated scrape configuration.

    Args:
        binary: the ``prometheus`` executable.
        targets: what to scrape (grouped into one scrape job per ``Target.job``).
        workdir: where the config, the TSDB and the log go (a test's ``tmp_path``).
        scrape_interval: also the evaluation interval; 1s makes tests fast.
    """

    def __init__(self, binary: str, targets: Sequence[Target], workdir: Path, scrape_interval: str = "1s") -> None:
        self.binary = binary
        self.targets = list(targets)
        self.workdir = Path(workdir)
        self.scrape_interval = scrape_interval
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def config(self) -> dict:
        jobs: dict[tuple[str, str], list[Target]] = {}
        for t in self.targets:
            jobs.setdefault((t.job, t.metrics_path), []).append(t)
        names = [job for job, _ in jobs]
        return {
            "global": {"scrape_interval": self.scrape_interval, "evaluation_interval": self.scrape_interval},
            "scrape_configs": [
                {
                    # a job scraped on two paths needs two scrape configs; the `job` label stays the job
                    "job_name": job if names.count(job) == 1 else f"{job}-{i}",
                    "metrics_path": path,
                    "scrape_timeout": self.scrape_interval,
                    "static_configs": [{"targets": [t.address], "labels": {"job": job, **t.labels}} for t in group],
                }
                for i, ((job, path), group) in enumerate(jobs.items())
            ],
        }

    def start(self, timeout: float = 30.0) -> Prometheus:
        self.workdir.mkdir(parents=True, exist_ok=True)
        cfg = self.workdir / "prometheus.yml"
        cfg.write_text(yaml.safe_dump(self.config(), sort_keys=False))
        self.log = self.workdir / "prometheus.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    self.binary,
                    f"--config.file={cfg}",
                    f"--storage.tsdb.path={self.workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.proc.returncode}:\n{self.log.read_text()[-4000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"prometheus not ready after {timeout}s:\n{self.log.read_text()[-4000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None

    def __enter__(self) -> Prometheus:
        return self if self.proc is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- HTTP API --------------------------------------------------------------

    def _get(self, path: str, **params: str) -> dict:
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                body = json.load(resp)
        except urllib.error.HTTPError as e:
            body = json.load(e)
        if body.get("status") != "success":
            raise PromQLError(f"{params.get('query', path)}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        """An instant query; returns the result vector (``[{"metric": {...}, "value": [t, "v"]}, ...]``)."""
        params = {"query": expr}
        if at is not None:
            params["time"] = str(at)
        data = self._get("/api/v1/query", **params)
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        return data["result"]

    def metadata(self) -> dict[str, list[dict]]:
        """What the targets said about each metric family: ``{name: [{"type": "counter", "help": ...}]}``."""
        return self._get("/api/v1/metadata")

    def active_targets(self) -> list[dict]:
        return self._get("/api/v1/targets")["activeTargets"]

    def wait_for(self, expr: str, timeout: float = 60.0, predicate: Callable[[list[dict]], bool] = bool) -> list[dict]:
        """Poll ``expr`` until ``predicate(result)`` holds (default: a non-empty result)."""
        deadline = time.monotonic() + timeout
        result: list[dict] = []
        while time.monotonic() < deadline:
            result = self.query(expr)
            if predicate(result):
                return result
            time.sleep(0.5)
        health = [(t["scrapeUrl"], t["health"], t["lastError"]) for t in self.active_targets()]
        raise TimeoutError(f"{expr!r} still {result!r} after {timeout}s; targets: {health}")

    def wait_for_scrapes(self, n: int = 5, timeout: float = 60.0) -> None:
        """Until every target has been scraped successfully ``n`` times."""
        expected = len(self.targets)
        self.wait_for(
            f"sum_over_time(up[10m]) >= {n}",
            timeout,
            lambda r: len(r) >= expected,
        )


def has_finite(result: list[dict]) -> bool:
    """True if a query result holds at least one finite number (not only NaN/Inf)."""
    return any(math.isfinite(float(sample["value"][1])) for sample in result)


def prometheus_binary() -> str:
    return binary("prometheus", "PROMETHEUS")


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Callable[..., Prometheus]]:
    """Factory fixture: ``prometheus(targets, scrape_interval="1s")`` starts a server; all stop at teardown."""
    started: list[Prometheus] = []
    exe = prometheus_binary()

    def start(targets: Sequence[Target], scrape_interval: str = "1s") -> Prometheus:
        server = Prometheus(exe, targets, tmp_path / f"prometheus-{len(started)}", scrape_interval)
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.stop()
