"""One real deployment per test session: `ebplus serve` on the embedded model, on loopback.

The deployment is started exactly as a user starts it (the CLI, in a subprocess)
and stopped with SIGTERM, so the tests also cover start-up and clean shutdown.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from observability.prom import prometheus  # noqa: F401  (fixture for the live dashboard test)

from ebplus.bench.reliability import Deployment, HarnessError, start_deployment, stop_deployment

CONFIG = Path(__file__).with_name("e2e.yaml")
ADMIN_TOKEN = "e2e-admin-token"


@pytest.fixture(scope="session")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    try:
        dep = start_deployment(CONFIG, log_path, ADMIN_TOKEN)
    except HarnessError as exc:
        pytest.fail(str(exc))
    try:
        yield dep
    finally:
        stop_deployment(dep)
