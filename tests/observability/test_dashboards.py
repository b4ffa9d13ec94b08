"""The Grafana dashboards: generated from code, and every name they query is exported by someone.

Static checks (no server): the committed JSON, the Helm chart's copy of it and the docs page
``docs/reference/dashboards.md`` are the generator's output; every metric a
panel or variable query selects is an ``ebplus_*`` metric of ``ebplus.controller.exporter.METRICS``
or a vLLM / Ray Serve metric of ``dashboards.external`` (whose names
``test_external_metrics.py`` checks against the installed vLLM and Ray); histograms are
only read through ``_bucket``/``_sum``/``_count``; every label a query groups or filters
by is a label of the metrics it selects; the data source is a variable everywhere.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from external_tools import REPO
from observability.panels import DASHBOARDS, load, panel_queries, variable_queries

from docgen.dashboards.external import EXTERNAL
from docgen.dashboards.promql import base_name, metric_names
from ebplus.controller.exporter import SPECS

HISTOGRAMS = {n for n, s in (*SPECS.items(), *EXTERNAL.items()) if s.kind == "histogram"}
QUERIES = list(panel_queries()) + list(variable_queries())


def test_committed_files_are_generated() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "docgen.dashboards.generate", "--check"], cwd=REPO, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr


def test_check_covers_the_chart_copies_and_the_docs_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--check`` names a stale chart copy, a stale docs page and a JSON file no dashboard makes; a run fixes all."""
    from docgen.dashboards import generate

    out_dirs = (tmp_path / "dashboards", tmp_path / "helm" / "ebplus" / "dashboards")
    monkeypatch.setattr(generate, "ROOT", tmp_path)
    monkeypatch.setattr(generate, "OUT_DIRS", out_dirs)
    monkeypatch.setattr(generate, "DOCS_PAGE", tmp_path / "docs" / "reference" / "dashboards.md")
    assert generate.main(["--check"]) == 1  # nothing written yet
    assert generate.main([]) == 0 and generate.main(["--check"]) == 0
    chart_copy = out_dirs[1] / "ebplus-serving.json"
    assert chart_copy.read_bytes() == (out_dirs[0] / "ebplus-serving.json").read_bytes()

    chart_copy.write_text(chart_copy.read_text().replace("EB+ serving", "EB+ servng"))
    (out_dirs[1] / "old-dashboard.json").write_text("{}")
    generate.DOCS_PAGE.write_text("# Grafana dashboards\n")
    capsys.readouterr()
    assert generate.main(["--check"]) == 1
    stale = capsys.readouterr().err.split("stale: ", 1)[1].split(";", 1)[0].split(", ")
    assert sorted(stale) == [
        "docs/reference/dashboards.md",
        "helm/ebplus/dashboards/ebplus-serving.json",
        "helm/ebplus/dashboards/old-dashboard.json",
    ]
    assert generate.main([]) == 0 and generate.main(["--check"]) == 0
    assert not (out_dirs[1] / "old-dashboard.json").exists()


def test_two_dashboards_with_many_panels() -> None:
    titles = {load(p)["title"] for p in DASHBOARDS}
    assert titles == {"EB+ control plane", "EB+ serving"}
    assert len(list(panel_queries())) >= 50


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('sum by (le) (rate(a_bucket{x=~"$m", y="b{c}"}[$__rate_interval]))', {"a_bucket"}),
        ("max by (r) (a) - max by (r) (b) == 1", {"a", "b"}),
        ("histogram_quantile(0.99, sum by (le, kind) (rate(x_bucket[5m])))", {"x_bucket"}),
        ("60 * sum(rate(c_total[1m])) offset 5m", {"c_total"}),
        ('label_values(m{model=~"$model"}, replica)', {"m"}),
        ("a and on (x) b unless ignoring (y) c", {"a", "b", "c"}),
    ],
)
def test_metric_name_extraction(expr: str, names: set[str]) -> None:
    got = metric_names(expr)
    if expr.startswith("label_values"):  # a Grafana function, not PromQL: its first argument is the selector
        got -= {"replica"}
    assert got == names


def _selected(expr: str) -> set[str]:
    if expr.startswith("label_values("):
        expr = expr.removeprefix("label_values(").rsplit(",", 1)[0]
    return metric_names(expr)


@pytest.mark.parametrize("query", QUERIES, ids=[q.id for q in QUERIES])
def test_every_queried_metric_is_exported(query) -> None:
    names = _selected(query.expr)
    assert names, "a query without a metric"
    for series in names:
        name = base_name(series, HISTOGRAMS)
        spec = SPECS.get(name) or EXTERNAL.get(name)
        assert spec is not None, f"{series}: not in ebplus.controller.exporter.METRICS nor dashboards.external"
        assert not getattr(spec, "deprecated", False), f"{series} is deprecated: {spec.help}"
        if spec.kind == "histogram":
            assert series != name, f"{name} is a histogram: query _bucket, _sum or _count"


@pytest.mark.parametrize("query", QUERIES, ids=[q.id for q in QUERIES])
def test_every_queried_label_exists(query) -> None:
    expr = query.expr
    specs = [SPECS.get(n) or EXTERNAL.get(n) for n in (base_name(s, HISTOGRAMS) for s in _selected(expr))]
    labels = {"le", "job", "instance"} | {label for s in specs for label in s.labels}
    used = set()
    for group in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^()]*)\)", expr):
        used |= {g.strip() for g in group.split(",") if g.strip()}
    for matchers in re.findall(r"\{([^{}]*)\}", re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)):
        used |= {m.split("=")[0].split("!")[0].strip() for m in matchers.split(",") if m.strip()}
    if expr.startswith("label_values("):
        used.add(expr.rsplit(",", 1)[1].strip(" )"))
    for legend_label in re.findall(r"\{\{(\w+)\}\}", _legend(query)):
        used.add(legend_label)
    assert used <= labels, f"labels {sorted(used - labels)} are not labels of {sorted(_selected(expr))}"


def _legend(query) -> str:
    for path in DASHBOARDS:
        board = load(path)
        if board["title"] != query.dashboard:
            continue
        for panel in board["panels"]:
            if panel["title"] == query.panel:
                for target in panel.get("targets", []):
                    if target["refId"] == query.ref:
                        return target.get("legendFormat", "")
    return ""


@pytest.mark.parametrize("path", DASHBOARDS, ids=[p.stem for p in DASHBOARDS])
def test_datasource_is_a_variable_and_variables_exist(path) -> None:
    board = load(path)
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    # one replica variable: EB+'s metrics and the engine's (both deployments) share ReplicaId and model_name
    assert [v["name"] for v in board["templating"]["list"]] == ["datasource", "model", "replica"]
    assert [v["definition"].rsplit(",", 1)[1].strip(" )") for v in list(variables.values())[1:]] == [
        "model_name",
        "ReplicaId",
    ]
    ids = set()
    for panel in board["panels"]:
        assert panel["id"] not in ids
        ids.add(panel["id"])
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        if panel["type"] == "row":
            continue
        assert panel["description"], panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        for target in panel["targets"]:
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            for var in re.findall(r"\$(\w+)", target["expr"]):
                assert var == "__rate_interval" or var in variables, f"{panel['title']}: unknown variable ${var}"
    # no hard-coded data source UID anywhere
    text = path.read_text()
    assert re.findall(r'"uid": "([^"]*)"', text) == [board["uid"]] + ["${datasource}"] * (text.count('"uid"') - 1)


def test_the_installed_package_hands_out_the_committed_dashboards() -> None:
    import ebplus.dashboards

    shipped = {f.name: f.read_text() for f in ebplus.dashboards.files()}
    assert shipped == {p.name: p.read_text() for p in sorted((REPO / "dashboards").glob("*.json"))}
    assert set(shipped) == {"ebplus-control-plane.json", "ebplus-serving.json"}
