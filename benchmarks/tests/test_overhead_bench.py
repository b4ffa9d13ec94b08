"""The serving-plane benchmark's pure parts: engine flags, rotation, ratios per round, CPU roles, py-spy stacks."""

from __future__ import annotations

import argparse

import pytest

from benchmarks import overhead
from benchmarks.overhead_servers import SERVERS, cli_flags
from benchmarks.proctree import CpuWindow, ProcCpu, Profile, component_of, role_of
from ebplus.cli import main as ebplus_main
from ebplus.deploy.config import load_config


def test_engine_flags_are_the_configs_engine_arguments() -> None:
    flags = cli_flags(load_config("deploy/local.yaml").engine.engine_kwargs())
    assert flags[flags.index("--max-num-seqs") + 1] == "64"
    assert flags[flags.index("--dtype") + 1] == "float32"
    assert "--enforce-eager" in flags
    assert cli_flags({"enforce_eager": False, "additional_config": {"a": 1}}) == [
        "--no-enforce-eager", "--additional-config", '{"a": 1}',
    ]  # fmt: skip


def test_every_server_has_a_letter_and_rounds_rotate() -> None:
    assert [s.letter for s in SERVERS.values()] == ["a", "b", "c", "d", "e", "c+", "c-", "cg", "ca"]
    servers = list(SERVERS)
    orders = [overhead.rotated(servers, r) for r in range(len(servers))]
    assert [o[0] for o in orders] == servers  # each server leads one round
    assert all(sorted(o) == sorted(servers) for o in orders)


def test_a_server_without_its_plugin_is_skipped_with_the_reason(monkeypatch, capsys) -> None:
    from importlib import metadata

    from benchmarks import overhead_servers

    monkeypatch.setattr(metadata, "entry_points", lambda group: [])
    reason = overhead_servers.plugin_missing()
    assert reason is not None and "'vllm.endpoint_plugins' entry point 'ebplus'" in reason
    parser = argparse.ArgumentParser()
    overhead.add_arguments(parser)
    with pytest.raises(ValueError, match="none of them can start here"):
        overhead.run(parser.parse_args(["--servers", "vllm-plugin"]), "test")
    assert "(e) vllm-plugin: skipped: no 'vllm.endpoint_plugins'" in capsys.readouterr().out


def _row(server: str, rnd: int, tps: float, tpot: float, roles: dict[str, float]) -> dict:
    return {
        "server": server, "round": rnd, "failed": 0, "start_s": 30.0,
        "total_tok_per_s": tps, "output_tok_per_s": tps / 3, "ttft_p50_ms": 1000.0, "tpot_p50_ms": tpot,
        "cpu": {"seconds": 30.0, "cpu_s_by_role": roles, "worker_involuntary_switches": 100},
    }  # fmt: skip


ROWS = [
    _row("vllm", 0, 400.0, 100.0, {"model worker": 25.0, "vLLM API server": 3.0}),
    _row("ray-llm", 0, 360.0, 110.0, {"model worker": 25.0, "HTTP proxy": 4.0}),
    _row("ebplus-mb", 0, 350.0, 112.0, {"model worker": 25.0, "HTTP proxy": 4.0, "ingress replica": 5.0}),
    _row("vllm", 1, 300.0, 130.0, {"model worker": 25.0, "vLLM API server": 3.0}),  # a slower round
    _row("ray-llm", 1, 270.0, 140.0, {"model worker": 25.0, "HTTP proxy": 4.0}),
    _row("ebplus-mb", 1, 294.0, 132.0, {"model worker": 25.0, "HTTP proxy": 4.0, "ingress replica": 5.0}),
]


def test_ratios_are_taken_within_each_round() -> None:
    assert overhead.ratios(ROWS, "ebplus-mb", "vllm", "total_tok_per_s") == pytest.approx([0.875, 0.98])
    s = overhead.summary(ROWS, ["vllm", "ray-llm", "ebplus-mb"])
    med, lo, hi = s["ebplus-mb"]["total_tok_per_s_vs_vllm"]
    assert (lo, hi) == pytest.approx((0.875, 0.98)) and med == pytest.approx((0.875 + 0.98) / 2)
    assert "total_tok_per_s_vs_vllm" not in s["vllm"]
    # CPU per 1,000 output tokens: 5 s of ingress over 30 s at 350/3 output tok/s in round 0
    per_k = s["ebplus-mb"]["cpu_s_per_1k_tokens"]["ingress replica"]
    assert per_k == pytest.approx((5.0 / (350 / 3 * 30 / 1000) + 5.0 / (294 / 3 * 30 / 1000)) / 2)


def test_render_names_every_server_and_role() -> None:
    text = overhead.render(ROWS, ["vllm", "ray-llm", "ebplus-mb"], SERVERS, "cmd", [])
    assert "(a) vLLM OpenAI server" in text and "(c) ebplus serve, mode mb" in text
    assert "| ingress replica |" in text and "| **all** |" in text
    assert "0.927 (0.875–0.980)" in text  # (c) vs (a): median of the two rounds


def test_cpu_window_counts_new_processes_from_zero() -> None:
    before = {1: ProcCpu(1, "model worker", 10.0, 5)}
    after = {1: ProcCpu(1, "model worker", 14.0, 9), 2: ProcCpu(2, "HTTP proxy", 1.5, 0)}
    w = CpuWindow.between(before, after, 5.0)
    assert w.by_role == {"model worker": 4.0, "HTTP proxy": 1.5}
    assert w.worker_involuntary == 4


@pytest.mark.parametrize(
    ("cmdline", "role"),
    [
        ("VLLM::Worker", "model worker"),
        ("VLLM::EngineCore", "engine core"),
        ("ray::ServeReplica:ebplus:EBPlusIngress", "ingress replica"),
        ("ray::ServeReplica:ray-llm:OpenAiIngress", "ingress replica"),
        ("ray::ServeReplica:ebplus:EBPlusServer:smollm2-135m-instruct", "model replica"),
        ("ray::ProxyActor", "HTTP proxy"),
        ("ray::ServeController", "Serve controller"),
        ("ray::ControllerActor", "EB+ controller"),
        ("python -m vllm.entrypoints.openai.api_server --model m", "vLLM API server"),
        ("python -m ebplus.cli serve --config x.yaml", "driver"),
        ("/venv/lib/python3.11/site-packages/ray/core/src/ray/gcs/gcs_server --x", "Ray system"),
    ],
)
def test_process_roles(cmdline: str, role: str) -> None:
    assert role_of(cmdline) == role


def test_samples_go_to_the_innermost_known_component() -> None:
    from benchmarks.proctree import _REPO

    guard = f"__call__ ({_REPO}/deploy/middleware.py:220)"
    stack = [
        "run (/lib/python3.11/asyncio/base_events.py:600)",
        "handle (/site-packages/ray/serve/_private/proxy.py:10)",
        guard,
        "loads (/lib/python3.11/json/__init__.py:346)",  # generic: charged to the guard that called it
    ]
    assert component_of(stack) == "EB+ HTTP guards (deploy/middleware.py)"
    assert component_of(stack[:2]) == "Ray Serve proxy"
    assert component_of(stack[:1]) == "Python runtime (event loop, json, logging)"
    raw = (
        'process 10:"python -m ebplus.cli serve";process 11:"ray::ProxyActor";' + ";".join(stack[:2]) + " 30\n"
        'process 10:"python -m ebplus.cli serve";process 12:"VLLM::Worker";forward (/site-packages/torch/nn/x.py:1) 50\n'
    )
    prof = Profile.parse(raw, rate_hz=10)
    assert prof.seconds_by() == {"model worker": {"vLLM model execution": 5.0}, "HTTP proxy": {"Ray Serve proxy": 3.0}}


def test_bad_server_name_is_a_clear_error(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        overhead.main(["--servers", "vllm,nginx"])
    assert exc.value.code == 2
    assert "--servers: unknown server(s) ['nginx']" in capsys.readouterr().err


def test_the_ebplus_cli_reaches_the_benchmark(capsys) -> None:
    with pytest.raises(SystemExit):
        ebplus_main(["bench", "overhead", "--help"])
    assert "--rounds" in capsys.readouterr().out
    parser = argparse.ArgumentParser()
    overhead.add_arguments(parser)
    args = parser.parse_args([])
    assert (args.rounds, args.num_prompts, args.input_len, args.output_len) == (5, 16, 256, 128)
