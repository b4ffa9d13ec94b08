"""Every PromQL query of the shipped Grafana dashboards, and Grafana's variable expansion."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from external_tools import REPO

DASHBOARDS = sorted((REPO / "dashboards").glob("*.json"))


@dataclass(frozen=True)
class PanelQuery:
    dashboard: str
    panel: str
    ref: str
    expr: str

    @property
    def id(self) -> str:
        return f"{self.dashboard} / {self.panel} / {self.ref}"


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def panel_queries(paths: list[Path] | None = None) -> Iterator[PanelQuery]:
    """Each target of each panel (rows included) of the dashboards."""
    for path in paths or DASHBOARDS:
        board = load(path)
        stack = list(board["panels"])
        while stack:
            panel = stack.pop(0)
            stack.extend(panel.get("panels", []))
            for target in panel.get("targets", []):
                yield PanelQuery(board["title"], panel["title"], target["refId"], target["expr"])


def variable_queries(paths: list[Path] | None = None) -> Iterator[PanelQuery]:
    """The ``label_values(...)`` queries of the dashboards' template variables."""
    for path in paths or DASHBOARDS:
        board = load(path)
        for var in board["templating"]["list"]:
            if var["type"] == "query":
                yield PanelQuery(board["title"], f"${var['name']}", "var", var["definition"])


def expand(expr: str, rate_interval: str = "10s", variables: dict[str, str] | None = None) -> str:
    """What Grafana sends: ``$__rate_interval`` and template variables substituted.

    A variable left out stands for "All", i.e. its ``allValue`` ``.*``.
    """
    variables = variables or {}
    expr = expr.replace("$__rate_interval", rate_interval)
    return re.sub(r"\$(\w+)", lambda m: variables.get(m.group(1), ".*"), expr)
