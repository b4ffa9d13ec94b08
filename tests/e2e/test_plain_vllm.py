"""EB+ inside vLLM's own OpenAI server, no Ray: the ``ebplus`` plugins on the CPU build.

The server is started as a plain-vLLM user starts it (``VLLM_PLUGINS=ebplus``,
``--scheduler-cls``, ``--additional-config``), serving a Hugging Face Hub id that
resolves offline from a Hub cache laid out in a temporary ``HF_HOME`` (the tiny
random Llama, so the load takes seconds on 2 cores). It is driven by the official
``openai`` client and by vLLM's serving benchmark (``vllm bench serve``'s code: the
``vllm`` console script does not start in the CPU build), and the tests check what
the plugin adds: thresholds the controller moved, ``/admin`` auth, ``ebplus_*``
metrics on vLLM's ``/metrics``, a clean stop, and the refusal of several API servers.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import httpx
import pytest
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from harness.plugin import ENGINE_ARGS, MODEL, PORT, START_TIMEOUT_S, TOKEN, hub_home, server_env

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
#: ``vllm serve``'s own code path (several API servers are started there) without the console script.
VLLM_SERVE = (
    "import sys; "
    "from vllm.entrypoints.cli.serve import ServeSubcommand; "
    "from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args; "
    "from vllm.utils.argparse_utils import FlexibleArgumentParser; "
    "args = make_arg_parser(FlexibleArgumentParser()).parse_args(sys.argv[1:]); "
    "validate_parsed_serve_args(args); ServeSubcommand.cmd(args)"
)


@dataclass
class Server:
    process: subprocess.Popen
    log_path: Path
    snapshot: Path  # the model as the Hub cache holds it

    base_url: ClassVar[str] = f"http://127.0.0.1:{PORT}"
    admin_headers: ClassVar[dict[str, str]] = {"Authorization": f"Bearer {TOKEN}"}

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def thresholds(self) -> dict:
        r = httpx.get(f"{self.base_url}/admin/thresholds", headers=self.admin_headers, timeout=10)
        r.raise_for_status()
        return r.json()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with socket.socket() as probe:  # a server left over from another run would answer for this one
        if probe.connect_ex(("127.0.0.1", PORT)) == 0:
            pytest.fail(f"port {PORT} is in use: stop whatever listens there (e.g. a vLLM server of an earlier run)")
    work = tmp_path_factory.mktemp("plain-vllm")
    hf_home, snapshot = hub_home(work / "hf")
    log_path = work / "vllm.log"
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", MODEL,
               "--host", "127.0.0.1", "--port", str(PORT), *ENGINE_ARGS]  # fmt: skip
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            command, env=server_env(hf_home), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    srv = Server(proc, log_path, snapshot)
    try:
        wait_registered(srv)
        yield srv
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def wait_registered(srv: Server) -> None:
    """Until vLLM serves and the plugin's controller knows the engine."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if srv.process.poll() is not None:
            pytest.fail(f"vLLM exited with {srv.process.returncode}:\n{srv.log()[-4000:]}")
        try:
            if httpx.get(f"{srv.base_url}/health", timeout=5).status_code == 200 and srv.thresholds()["replicas"]:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    pytest.fail(f"vLLM with the ebplus plugin not ready after {START_TIMEOUT_S} s:\n{srv.log()[-4000:]}")


def test_the_plugins_are_loaded_and_the_hub_id_resolved_offline(server: Server) -> None:
    log = server.log()
    assert "Loaded endpoint plugin ebplus" in log and "EB+ controller running in this API server" in log
    models = httpx.get(f"{server.base_url}/v1/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == [MODEL]


def test_the_official_openai_client(server: Server) -> None:
    client = OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=8)
    assert chat.choices[0].finish_reason in ("stop", "length") and chat.usage.completion_tokens >= 1
    text = "".join(
        chunk.choices[0].text
        for chunk in client.completions.create(model=MODEL, prompt="Once upon", max_tokens=12, stream=True)
        if chunk.choices
    )
    assert text


def test_vllm_bench_serve(server: Server, tmp_path: Path) -> None:
    """vLLM's serving benchmark (random prompts of 16-112 tokens, 8-56 out, 8 at a time): every request served."""
    from benchmarks.e2e_bench import random_dataset, serving_benchmark

    result = serving_benchmark(
        server.base_url, MODEL, str(server.snapshot), random_dataset(64, 32, 0.75), 96, 8, tmp_path, "plain-vllm"
    )
    assert (result["completed"], result["failed"]) == (96, 0)


def test_the_controller_moved_the_thresholds(server: Server) -> None:
    """The controller re-estimated from the engine's telemetry (version >= 2) and the engine applied it."""
    deadline = time.monotonic() + 30
    while True:
        view = server.thresholds()
        (replica,) = view["replicas"].values()
        if view["version"] >= 2 and replica["applied_version"] == replica["version"]:
            break
        assert time.monotonic() < deadline, view
        time.sleep(0.5)
    assert replica["mode"] == "auto" and replica["active"] in ("eb", "mb") and replica["device"] == "cpu"
    estimate = httpx.get(f"{server.base_url}/admin/estimates", headers=server.admin_headers, timeout=10).json()
    assert estimate["fleet"]["updates"] >= 2 and estimate["fleet"]["estimate"]["mu_o"] > 0


def test_admin_auth(server: Server) -> None:
    base = server.base_url
    r = httpx.get(f"{base}/admin/thresholds", timeout=10)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert r.json() == {"detail": "missing or invalid admin token"}
    assert (
        httpx.get(f"{base}/admin/thresholds", headers={"Authorization": "Bearer wrong"}, timeout=10).status_code == 401
    )
    (rid,) = server.thresholds()["replicas"]
    assert httpx.put(f"{base}/admin/overrides", json={"replica": rid, "k": 2}, timeout=10).status_code == 401
    bad = httpx.put(f"{base}/admin/overrides", headers=server.admin_headers, json={"replica": rid, "k": 0}, timeout=10)
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "k"]
    put = httpx.put(f"{base}/admin/overrides", headers=server.admin_headers, json={"replica": rid, "k": 2}, timeout=10)
    assert put.status_code == 200 and server.thresholds()["overrides"][rid]["k"] == 2
    assert httpx.delete(f"{base}/admin/overrides/{rid}", headers=server.admin_headers, timeout=10).status_code == 200


def test_ebplus_metrics_on_vllms_metrics(server: Server) -> None:
    text = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    samples = {s.name: s for family in text_string_to_metric_families(text) for s in family.samples}
    assert any(name.startswith("vllm:") for name in samples), "vLLM's own metrics are gone"
    assert samples["ebplus_controller_up"].value == 1
    assert (
        samples["ebplus_threshold_version"].value >= 2
        and samples["ebplus_threshold_version"].labels["model_name"] == MODEL
    )
    assert samples["ebplus_controller_updates_total"].value >= 2
    assert samples["ebplus_workload_mu_o_tokens"].value > 0


def our_frames(log: str) -> list[str]:
    """Traceback frames in this repository's code (not in the installed vLLM, Ray, ...)."""
    files = re.findall(r'File "([^"]+)", line \d+', log)
    return [f for f in files if f.startswith(str(REPO)) and "site-packages" not in f]


def test_stops_cleanly(server: Server) -> None:
    """SIGTERM: vLLM exits 0 and the plugin's telemetry stops without an error of its own.

    vLLM 0.29 stops its engine core before it cancels its output handler, which then
    sometimes logs ``AsyncLLM output_handler failed`` with a traceback of vLLM's frames only
    (the same without the plugin): that is not counted; a frame of this repository's code is.
    """
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(timeout=90) == 0
    log = server.log()
    assert "telemetry push failed" not in log
    assert "could not persist the EB+ controller state" not in log
    assert our_frames(log) == [], log[-6000:]


#: The two starts that must be refused: ``vllm serve``'s own code with two API servers, and the API server
#: under a vLLM that reports a release outside the supported range (the installed one, claiming 0.28.1).
REFUSED_STARTS = {
    "several API servers": [sys.executable, "-c", VLLM_SERVE, "--model", MODEL, "--host", "127.0.0.1",
                            "--port", str(PORT + 1), "--api-server-count", "2", *ENGINE_ARGS],
    "outside the range": [sys.executable, "-c", "import runpy, sys, vllm; vllm.__version__ = '0.28.1'; "
                          "runpy.run_module('vllm.entrypoints.openai.api_server', run_name='__main__')",
                          "--model", MODEL, "--host", "127.0.0.1", "--port", str(PORT + 2), *ENGINE_ARGS],
}  # fmt: skip


@pytest.fixture(scope="module")
def refused(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str, float]]:
    """Each of :data:`REFUSED_STARTS`' exit status, output and seconds, the two started side by side: each
    is mostly vLLM's import, and the two refusals would otherwise cost as long as a server start each."""
    hf_home, _ = hub_home(tmp_path_factory.mktemp("refused") / "hf")
    started = time.monotonic()
    procs = {
        name: subprocess.Popen(command, env=server_env(hf_home), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
        for name, command in REFUSED_STARTS.items()
    }  # fmt: skip
    out = {}
    for name, proc in procs.items():
        try:
            text, _ = proc.communicate(timeout=400)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            text, _ = proc.communicate()
        out[name] = (proc.returncode, text, time.monotonic() - started)
        with contextlib.suppress(ProcessLookupError):  # an API server or engine core the refusal left behind
            os.killpg(proc.pid, signal.SIGKILL)
    return out


def test_several_api_servers_are_refused(refused: dict[str, tuple[int, str, float]]) -> None:
    """``vllm serve --api-server-count 2``: the engine core refuses to start, naming the flag, and
    ``vllm serve`` exits non-zero (the check runs where vLLM builds the scheduler, so it does not
    depend on which API server process gets to the plugin's own check first)."""
    returncode, out, seconds = refused["several API servers"]
    assert returncode != 0, out[-4000:]
    assert "TopologyError: --api-server-count is 2: EB+ runs one controller per engine" in out, out[-4000:]
    assert "Start vLLM with --api-server-count 1" in out
    print(f"refused, exit {returncode}, after {seconds:.0f} s")


def test_a_vllm_outside_the_range_is_refused(refused: dict[str, tuple[int, str, float]]) -> None:
    """A vLLM outside the supported range (the installed one reporting 0.28.1): the start fails naming
    the range and the version found."""
    returncode, out, _ = refused["outside the range"]
    assert returncode != 0, out[-4000:]
    assert "EB+ supports vLLM 0.29–0.32; found 0.28.1" in out, out[-4000:]
