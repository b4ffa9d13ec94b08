"""The chart's alerts (helm/ebplus/rules/ebplus-alerts.yaml), checked by promtool and against the exporter.

* ``promtool check rules`` accepts the file and ``promtool test rules`` passes
  tests/helm/alerts_test.yaml (synthetic series), where every alert both fires and stays quiet;
* every metric an alert reads is one ``ebplus.controller.exporter.METRICS`` exports, counters
  only through rate()/increase() and gauges never;
* the chart's PrometheusRule is that file, verbatim (its CRD validation is in test_chart.py).

promtool ships with Debian's prometheus package, which ``make tools`` installs.
"""

from __future__ import annotations

import re
import subprocess

import pytest
import yaml
from external_tools import REPO, binary

from ebplus.controller.exporter import LEGACY_LABELS, SPECS

RULES = REPO / "helm" / "ebplus" / "rules" / "ebplus-alerts.yaml"
TESTS = REPO / "tests" / "helm" / "alerts_test.yaml"
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def alerts() -> list[dict]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r]


@pytest.fixture(scope="module")
def promtool() -> str:
    return binary("promtool", "PROMTOOL")


def test_promtool_check_rules(promtool: str) -> None:
    proc = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in proc.stdout


def test_promtool_test_rules(promtool: str) -> None:
    proc = subprocess.run([promtool, "test", "rules", str(TESTS)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "SUCCESS" in proc.stdout, proc.stdout + proc.stderr


def test_promtool_test_rules_can_fail(promtool: str, tmp_path) -> None:
    """The cases pin the alerts: an alert that never fires fails them."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES.read_text().replace("(ebplus_controller_up) == 0", "(ebplus_controller_up) == 7"))
    cases = tmp_path / "cases.yaml"
    cases.write_text(TESTS.read_text().replace("../../helm/ebplus/rules/ebplus-alerts.yaml", str(rules)))
    proc = subprocess.run([promtool, "test", "rules", str(cases)], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "EBPlusControllerDown" in proc.stdout + proc.stderr


def test_every_alert_fires_and_stays_quiet_in_a_case() -> None:
    fired, quiet = set(), set()
    for case in yaml.safe_load(TESTS.read_text())["tests"]:
        for check in case.get("alert_rule_test", []):
            (fired if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = {a["alert"] for a in alerts()}
    assert names - fired == set(), "alerts never shown firing"
    assert names - quiet == set(), "alerts never shown quiet"


def metrics_of(expr: str) -> set[str]:
    return set(re.findall(r"\b(ebplus_[a-z0-9_]+)\b", expr))


def test_alerts_read_only_exported_metrics_the_right_way() -> None:
    for alert in alerts():
        expr, name = alert["expr"], alert["alert"]
        used = metrics_of(expr)
        assert used, f"{name} reads no ebplus_* metric"
        assert not re.search(r"\b(ray|vllm)_", expr), f"{name}: only the app's own metrics (scraped by the chart)"
        for metric in used:
            base = next((metric.removesuffix(s) for s in HISTOGRAM_SUFFIXES if metric.endswith(s)), metric)
            spec = SPECS.get(metric) or SPECS.get(base)
            assert spec is not None, f"{name} reads {metric}, which ebplus.controller.exporter.METRICS does not export"
            assert not spec.deprecated, f"{name} reads {metric}: {spec.help}"
            wrapped = re.search(rf"\b(rate|increase|irate)\(\s*{metric}\b", expr) is not None
            if spec.kind == "counter":
                assert wrapped, f"{name}: counter {metric} only through rate()/increase()"
            elif spec.kind == "gauge":
                assert not wrapped, f"{name}: gauge {metric} through rate()/increase()"
        labels = set(re.findall(r"\$labels\.(\w+)", " ".join(alert["annotations"].values())))
        exported = {label for m in used for label in (SPECS.get(m) or SPECS[m]).labels}
        assert labels <= exported | {"namespace", "service"}, f"{name} annotations use unknown labels"
        legacy = {old for old, _ in LEGACY_LABELS}
        grouped = {g.strip() for group in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^()]*)\)", expr)
                   for g in group.split(",")}  # fmt: skip
        assert not (labels | grouped) & legacy, f"{name} uses a deprecated label (the new ones: {LEGACY_LABELS})"


def test_chart_renders_the_rules_file_verbatim() -> None:
    helm = binary("helm", "HELM")
    proc = subprocess.run(
        [helm, "template", "eb", str(REPO / "helm" / "ebplus"), "--api-versions", "monitoring.coreos.com/v1",
         "--show-only", "templates/prometheusrule.yaml"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rule = yaml.safe_load(proc.stdout)
    assert rule["kind"] == "PrometheusRule" and rule["spec"] == yaml.safe_load(RULES.read_text())
