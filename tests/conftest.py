"""Shared fixtures and the GPU skip rule for the whole suite."""

from __future__ import annotations

import os
import shutil

import pytest

from harness.nodes import GCS_PORT_WAIT_ENV, GCS_PORT_WAIT_S

# One Ray authentication mode for every cluster the suite starts (in this process, in the
# `ebplus serve` processes it spawns, the multi-node harness's raylets) and every driver it
# runs. Ray reads it once per process: a driver that joined a token-mode cluster keeps its RPC
# server in token mode after ray.shutdown(), and later refuses a token-less cluster's raylets
# (a large actor reply from another node then fails with OwnerDiedError). Set here, before
# anything imports Ray; a user's own clusters keep Ray's default.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
# The GCS's wait for its own port, for every Ray the suite starts (`ebplus serve`'s local one included,
# which inherits this environment): the multi-node harness's reason, on a 2-core machine shared with engines.
os.environ.setdefault(GCS_PORT_WAIT_ENV, str(GCS_PORT_WAIT_S))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if shutil.which("nvidia-smi"):
        return
    skip = pytest.mark.skip(reason="needs a GPU (nvidia-smi not found)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
