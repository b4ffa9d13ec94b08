"""The product end to end: OpenAI API, controller loop, admin API and metrics on a live deployment."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import psutil
import pytest
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

MODEL = "smollm2-135m-instruct"
#: Requests of the load: 4 controller updates (update_every 40) and every request kind 40 times.
LOAD = 160
TOPICS = ["France", "the moon", "rivers", "bread", "chess", "rain", "trains", "music", "glass", "bees"]


def one_request(client: OpenAI, i: int) -> tuple[str, str, int]:
    """Request i of the load: chat or completion, streamed or not, varied lengths."""
    topic = TOPICS[i % len(TOPICS)]
    max_tokens = 4 + (i * 7) % 28
    stream = i % 2 == 1
    if i % 4 < 2:
        messages = [{"role": "user", "content": f"Tell me one fact about {topic}." + " Please." * (i % 5)}]
        if stream:
            parts, finish = [], None
            for chunk in client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=max_tokens, stream=True
            ):
                if chunk.choices:
                    parts.append(chunk.choices[0].delta.content or "")
                    finish = chunk.choices[0].finish_reason or finish
            return "chat-stream", finish, len("".join(parts))
        r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=max_tokens)
        return "chat", r.choices[0].finish_reason, len(r.choices[0].message.content or "")
    prompt = f"A short note about {topic}:" + " and more" * (i % 9)
    if stream:
        parts, finish = [], None
        for chunk in client.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens, stream=True):
            if chunk.choices:
                parts.append(chunk.choices[0].text or "")
                finish = chunk.choices[0].finish_reason or finish
        return "completion-stream", finish, len("".join(parts))
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens)
    return "completion", r.choices[0].finish_reason, len(r.choices[0].text or "")


@pytest.fixture(scope="module")
def loaded(deployment):
    """Send LOAD requests through the official client (16 at a time) before the checks."""
    client = OpenAI(base_url=f"{deployment.base_url}/v1", api_key="unused", max_retries=0, timeout=300)
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda i: one_request(client, i), range(LOAD)))
    time.sleep(1.5)  # a few telemetry pushes
    return results


def test_openai_client_load(loaded) -> None:
    assert len(loaded) == LOAD
    kinds = {k for k, _, _ in loaded}
    assert kinds == {"chat", "chat-stream", "completion", "completion-stream"}
    assert all(finish in ("stop", "length") for _, finish, _ in loaded), loaded
    assert sum(n > 0 for _, _, n in loaded) > 15 * LOAD // 16  # more than 15 in 16 answers carry tokens


def admin(deployment, path: str) -> dict:
    r = httpx.get(f"{deployment.base_url}{path}", headers=deployment.admin_headers, timeout=30)
    r.raise_for_status()
    return r.json()


def wait_applied(deployment, timeout_s: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        th = admin(deployment, "/admin/thresholds")
        reps = th["replicas"]
        if reps and all(r["applied_version"] == r["version"] == th["version"] for r in reps.values()):
            return th
        if time.monotonic() > deadline:
            pytest.fail(f"replicas did not apply version {th['version']}: {reps}")
        time.sleep(0.5)


def test_controller_updated_and_replicas_applied(deployment, loaded) -> None:
    est = admin(deployment, "/admin/estimates")
    assert est["fleet"]["updates"] >= 2, est
    fleet = est["fleet"]["estimate"]
    assert fleet["p0"] > 0 and fleet["mu_o"] > 0 and fleet["mu_l"] > 0
    th = wait_applied(deployment)
    assert len(th["replicas"]) == 1
    rep = next(iter(th["replicas"].values()))
    assert rep["theta0"] is not None and 1 <= rep["k"] <= rep["n"] <= 32
    assert admin(deployment, "/admin/history?limit=5")["decisions"]


def metric_values(text: str) -> dict[tuple[str, frozenset], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def test_admin_and_metrics_show_the_same_values(deployment, loaded) -> None:
    th = wait_applied(deployment)
    values = metric_values(httpx.get(f"{deployment.base_url}/metrics", timeout=30).text)
    for rid, rep in th["replicas"].items():
        labels = frozenset({"ReplicaId": rid, "model_name": MODEL}.items())

        def at(name: str, labels: frozenset = labels) -> float:
            (value,) = [v for (n, series), v in values.items() if n == name and labels <= series]
            return value

        assert at("ebplus_threshold_k") == rep["k"]
        assert at("ebplus_batch_cap_n") == rep["n"]
        assert at("ebplus_threshold_version") == rep["version"]
        assert at("ebplus_applied_version") == rep["applied_version"]
        assert at("ebplus_theta0") == pytest.approx(rep["theta0"])
    assert values[("ebplus_controller_up", frozenset())] == 1
    assert values[("ebplus_telemetry_received_total", frozenset({"kind": "completions"}.items()))] >= LOAD


def test_override_applies_and_expires(deployment, loaded) -> None:
    th = wait_applied(deployment)
    rid = next(iter(th["replicas"]))
    r = httpx.put(
        f"{deployment.base_url}/admin/overrides",
        headers=deployment.admin_headers,
        json={"replica": rid, "mode": "eb", "k": 3, "n": 8, "ttl_s": 4},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    th = wait_applied(deployment)
    assert (th["replicas"][rid]["mode"], th["replicas"][rid]["k"], th["replicas"][rid]["n"]) == ("eb", 3, 8)
    time.sleep(4.5)
    th = wait_applied(deployment)
    assert th["replicas"][rid]["mode"] == "auto" and not th["overrides"]


def test_auth_and_validation(deployment, loaded) -> None:
    url = f"{deployment.base_url}/admin/overrides"
    assert httpx.put(url, json={"replica": "*", "k": 2}, timeout=30).status_code == 401
    assert (
        httpx.put(url, json={"replica": "*", "k": 2}, headers={"Authorization": "Bearer x"}, timeout=30).status_code
        == 401
    )
    bad = httpx.put(url, json={"replica": "*", "k": 0}, headers=deployment.admin_headers, timeout=30)
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"][-1] == "k"
    ghost = httpx.put(url, json={"replica": "ghost", "k": 2}, headers=deployment.admin_headers, timeout=30)
    assert ghost.status_code == 422 and ghost.json()["detail"][0]["loc"][-1] == "replica"


def test_models_health_and_openapi(deployment) -> None:
    models = httpx.get(f"{deployment.base_url}/v1/models", timeout=30).json()
    assert [m["id"] for m in models["data"]] == [MODEL]
    assert httpx.get(f"{deployment.base_url}/health", timeout=30).json()["status"] == "ok"
    paths = httpx.get(f"{deployment.base_url}/openapi.json", timeout=30).json()["paths"]
    for path in (
        "/admin/thresholds",
        "/admin/estimates",
        "/admin/history",
        "/admin/overrides",
        "/admin/recompute",
        "/v1/chat/completions",
    ):
        assert path in paths


def test_raw_sse_stream(deployment) -> None:
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 5, "stream": True}
    with httpx.stream("POST", f"{deployment.base_url}/v1/completions", json=body, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]" and all(line.startswith("data: ") for line in lines)


def test_the_ingress_runs_at_its_configured_niceness(deployment) -> None:
    """``http.ingress_niceness: 0`` (e2e.yaml): Ray starts the ingress' process at 0 (its ``RAY_worker_niceness``
    in the ingress' runtime_env), the model's replica at Ray's 15 and its engine at 19."""
    tree = psutil.Process(deployment.pid).children(recursive=True)
    serving = {p: " ".join(p.cmdline()) for p in tree if "ServeReplica:" in " ".join(p.cmdline())}
    ingress = [p for p, cmd in serving.items() if "EBPlusIngress" in cmd]
    models = [p for p, cmd in serving.items() if "EBPlusIngress" not in cmd]
    engines = [p for p in tree if p.name().startswith("VLLM::")]
    assert ingress and models and engines, serving
    assert {p.nice() for p in ingress} == {0}
    assert {p.nice() for p in models} == {15}
    assert {p.nice() for p in engines} == {19}
