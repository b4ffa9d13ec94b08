"""The Grafana dashboards of EB+ Serve, as the JSON files Grafana imports (this package's data).

The files are generated from code in a checkout (:mod:`docgen.dashboards`); the wheel ships them so
that an installed deployment has its dashboards without a checkout, and the chart ships the same files
as a ConfigMap for Grafana's sidecar.
"""

from __future__ import annotations

from importlib import resources
from importlib.resources.abc import Traversable


def files() -> list[Traversable]:
    """Every dashboard's JSON file (``ebplus-control-plane.json``, ``ebplus-serving.json``), by name."""
    return sorted((f for f in resources.files(__name__).iterdir() if f.name.endswith(".json")), key=lambda f: f.name)
