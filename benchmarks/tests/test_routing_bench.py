"""The real-deployment routing benchmark's pure parts: the arms' configs and the summary's ratios and stagger."""

from __future__ import annotations

import argparse
import http.server
import json
import threading
from pathlib import Path

import pytest

from benchmarks.routing_bench import deployment_config, markdown, stagger_seen
from ebplus.deploy.config import load_config
from harness import Deployment
from harness.routing import ROUTING_CONFIG


def test_an_unstaggered_arm_is_its_router_with_the_controllers_stagger_off(tmp_path: Path) -> None:
    phase = load_config(deployment_config(ROUTING_CONFIG, "phase", tmp_path))
    off = load_config(deployment_config(ROUTING_CONFIG, "phase+unstaggered", tmp_path))
    assert phase.replicas.routing.router == off.replicas.routing.router == "phase"
    assert (phase.controller.stagger, off.controller.stagger) == ("on", "off")


def test_an_inherit_arm_is_its_router_with_the_engines_left_at_the_replicas_priority(tmp_path: Path) -> None:
    phase = load_config(deployment_config(ROUTING_CONFIG, "phase", tmp_path))
    inherit = load_config(deployment_config(ROUTING_CONFIG, "phase+inherit", tmp_path))
    assert inherit.replicas.routing.router == "phase" and inherit.controller.stagger == phase.controller.stagger
    assert (phase.replicas.engine_niceness, inherit.replicas.engine_niceness) == ("auto", "inherit")


@pytest.mark.parametrize(
    ("arm", "key", "default", "value"),
    [("phase+ingress0", "ingress_niceness", "inherit", 0), ("phase+routerinherit", "router_niceness", 0, "inherit")],
)
def test_an_http_niceness_arm_is_its_router_with_that_one_setting_changed(
    tmp_path: Path, arm: str, key: str, default: object, value: object
) -> None:
    phase = load_config(deployment_config(ROUTING_CONFIG, "phase", tmp_path))
    changed = load_config(deployment_config(ROUTING_CONFIG, arm, tmp_path))
    assert changed.replicas.routing.router == "phase" and changed.replicas.engine_niceness == "auto"
    assert (getattr(phase.http, key), getattr(changed.http, key)) == (default, value)
    others = {k: v for k, v in changed.http.model_dump().items() if k != key}
    assert others == {k: v for k, v in phase.http.model_dump().items() if k != key}


def _row(arm: str, round_: int, ttft_p99: float, tok: float, on: bool) -> dict:
    view = None if arm == "default" else {
        "decisions": 10, "fallbacks": 1,
        "decision_us": {"p50": 50.0, "p99": 2000.0 + round_, "n": 10},
        "decision_cpu_us": {"p50": 40.0, "p99": 90.0 + round_, "n": 10},
        "thread": None if arm.endswith("+routerinherit") else {"id": 7, "niceness": 0},
    }  # fmt: skip
    return {
        "router": arm, "rate": 4.0, "round": round_, "failed": 0, "ttft_p50_ms": 100.0, "ttft_p99_ms": ttft_p99,
        "total_tok_per_s": tok, "router_view": view,
        "stagger": {"on": on, "reason": "why", "period_s": 0.5 if on else 0.0, "timer_windows": 7 if on else 0},
    }  # fmt: skip


def test_the_summary_sets_each_arm_against_default_and_the_stagger_against_its_absence() -> None:
    rows = []
    for round_ in (1, 2, 3):
        rows += [
            _row("default", round_, 1000.0, 100.0, True),
            _row("phase", round_, 500.0, 100.0, True),
            _row("phase+unstaggered", round_, 800.0, 100.0 + round_, False),
        ]
    args = argparse.Namespace(rounds=3, num_prompts=10, input_len=8, output_len=8, range_ratio=0.5, rates=[4.0],
                              routers=["default", "phase", "phase+unstaggered"])  # fmt: skip
    text = "\n".join(markdown(rows, args, "cmd", 60.0))
    assert "| 4 | phase / default | 1.000 (1.000–1.000) (no difference) | 0.500 (0.500–0.500) |" in text
    # staggered over unstaggered: p99 0.625 in every round, throughput lower in every round (not "no difference")
    assert "| 4 | phase / phase+unstaggered | 1.000 (1.000–1.000) (no difference) | 0.625 (0.625–0.625) | 0.980" in text
    assert "- `phase`: on True; period 0.500 (0.500–0.500) s; windows opened by its timer 7 (7–7)" in text
    assert "- `phase+unstaggered`: on False;" in text
    # each deployment once (not once per rate), each arm apart, both clocks
    assert "2 deployments" not in text and "6 deployments" not in text
    assert "`phase`: 3 deployments, 30 decisions, 3 of them" in text and "thread at niceness 0 (" in text
    assert "`phase+unstaggered`: 3 deployments, 30 decisions, 3 of them" in text
    assert text.count("- wall clock: p50 50.0 (50.0–50.0) µs, p99 2,002.0 (2,001.0–2,003.0) µs") == 2
    assert text.count("- router thread's CPU time: p50 40.0 (40.0–40.0) µs, p99 92.0 (91.0–93.0) µs") == 2


def test_the_stagger_seen_is_the_controllers_decision_and_its_timers_windows_over_every_replica(
    tmp_path: Path,
) -> None:
    """Against a stand-in for the deployment's HTTP side: ``/admin/thresholds`` and a ``/metrics`` with two
    replicas' counters (and another metric sharing the name's prefix, which must not count)."""
    metrics = (
        "# TYPE ebplus_stagger_windows_total counter\n"
        'ebplus_stagger_windows_total{replica="a"} 3.0\nebplus_stagger_windows_total{replica="b"} 4.0\n'
        "# TYPE ebplus_stagger_windows_total_other gauge\nebplus_stagger_windows_total_other 100.0\n"
    )
    thresholds = json.dumps({"version": 3, "stagger": {"on": True, "reason": "2 of 2 replicas in EB", "period_s": 0.5}})

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = (thresholds if self.path == "/admin/thresholds" else metrics).encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        config = load_config(deployment_config(ROUTING_CONFIG, "phase", tmp_path))
        config = config.model_copy(update={"http": config.http.model_copy(update={"port": server.server_address[1]})})
        dep = Deployment(config=config, admin_token="t", api_key=None, process=None, log_path=tmp_path / "log")
        assert stagger_seen(dep) == {"on": True, "reason": "2 of 2 replicas in EB", "period_s": 0.5, "timer_windows": 7}
    finally:
        server.shutdown()


def test_the_summary_sets_an_inherit_arm_against_its_router_at_the_default_priority() -> None:
    rows = [
        row
        for r in (1, 2, 3)
        for row in (_row("phase", r, 500.0, 100.0, True), _row("phase+inherit", r, 1000.0, 100.0, True))
    ]
    args = argparse.Namespace(rounds=3, num_prompts=10, input_len=8, output_len=8, range_ratio=0.5, rates=[4.0],
                              routers=["phase", "phase+inherit"])  # fmt: skip
    text = "\n".join(markdown(rows, args, "cmd", 60.0))
    assert "| 4 | phase / phase+inherit | 1.000 (1.000–1.000) (no difference) | 0.500 (0.500–0.500) |" in text
    assert "an arm `ROUTER+inherit` with `replicas.engine_niceness: inherit`" in text


def test_the_summary_says_where_each_arms_router_thread_ran() -> None:
    rows = [
        row
        for r in (1, 2)
        for row in (_row("phase", r, 500.0, 100.0, True), _row("phase+routerinherit", r, 900.0, 100.0, True))
    ]
    args = argparse.Namespace(rounds=2, num_prompts=10, input_len=8, output_len=8, range_ratio=0.5, rates=[4.0],
                              routers=["phase", "phase+routerinherit"])  # fmt: skip
    text = "\n".join(markdown(rows, args, "cmd", 60.0))
    assert "an arm `ROUTER+routerinherit` with `http.router_niceness: inherit`" in text
    assert "`phase`: 2 deployments, 20 decisions, 2 of them left to power of two choices for want of a fresh " \
        "board; the routers' thread at niceness 0 (" in text  # fmt: skip
    assert "`phase+routerinherit`: 2 deployments" in text and "thread at the ingress's niceness (" in text
