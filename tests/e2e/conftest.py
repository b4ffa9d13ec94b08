"""One real deployment for the tests that share it: `ebplus serve` on the embedded model, on loopback.

The deployment is started exactly as a user starts it (the CLI, in a subprocess)
and stopped with SIGTERM, so the tests also cover start-up and clean shutdown.

Its users are the ``test_serving*`` modules, which pytest runs one after the other
(file order), after the modules that start deployments of their own: the shared one
does not idle beside them on the CI's two cores. It is started by its first user
and stopped once the run leaves this directory (the engine and unit tiers run
after it), not at the end of the whole session.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from observability.prom import prometheus  # noqa: F401  (fixture for the live dashboard test)

from harness import Deployment, deployed

CONFIG = Path(__file__).with_name("e2e.yaml")
ADMIN_TOKEN = "e2e-admin-token"
HERE = Path(__file__).parent

_shared = contextlib.ExitStack()


@pytest.fixture(scope="session")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    dep = _shared.enter_context(deployed(CONFIG, tmp_path_factory.mktemp("serve") / "serve.log", ADMIN_TOKEN))
    try:
        yield dep
    finally:
        _shared.close()


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop the shared deployment after the last test of this directory (a no-op when it never started)."""
    if nextitem is None or HERE not in Path(nextitem.path).parents:
        _shared.close()
