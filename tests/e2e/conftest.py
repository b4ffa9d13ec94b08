"""One real deployment per test session: `ebplus serve` on the embedded model, on loopback.

The deployment is started exactly as a user starts it (the CLI, in a subprocess)
and stopped with SIGTERM, so the tests also cover start-up and clean shutdown.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from observability.prom import prometheus  # noqa: F401  (fixture for the live dashboard test)

from harness import Deployment, deployed

CONFIG = Path(__file__).with_name("e2e.yaml")
ADMIN_TOKEN = "e2e-admin-token"


@pytest.fixture(scope="session")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    with deployed(CONFIG, tmp_path_factory.mktemp("serve") / "serve.log", ADMIN_TOKEN) as dep:
        yield dep
