"""Hostile input against the live deployment: malformed and extreme API requests, fuzzing of its
OpenAPI, wrong credentials, malformed telemetry straight to the controller.

Each ``scenario_*`` returns plain figures (JSON-able), like those of :mod:`.faults`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from ebplus.controller.actor import SNAPSHOT_TTL_S
from harness.cluster import Cluster
from harness.deployment import Deployment, process_tree


def hostile_requests(model: str) -> list[tuple[str, str, str, bytes | dict, str | None]]:
    """``(case, method, path, body, content_type)``: malformed and extreme API requests.

    Each must be answered with a 4xx and a reason (never a 5xx, never a crash).
    ``body`` is JSON (a dict) or raw bytes sent as is.
    """
    user = [{"role": "user", "content": "hi"}]
    return [
        ("max_tokens huge", "POST", "/v1/completions", {"model": model, "prompt": "hi", "max_tokens": 10**9}, None),
        ("max_tokens 2^63", "POST", "/v1/completions", {"model": model, "prompt": "hi", "max_tokens": 2**63}, None),
        ("max_tokens negative", "POST", "/v1/completions", {"model": model, "prompt": "hi", "max_tokens": -5}, None),
        ("max_tokens zero", "POST", "/v1/completions", {"model": model, "prompt": "hi", "max_tokens": 0}, None),
        ("max_tokens wrong type", "POST", "/v1/completions", {"model": model, "prompt": "hi", "max_tokens": "many"}, None),
        ("temperature negative", "POST", "/v1/completions", {"model": model, "prompt": "hi", "temperature": -1}, None),
        ("temperature 1e308", "POST", "/v1/completions", {"model": model, "prompt": "hi", "temperature": 1e308}, None),
        ("top_p 5", "POST", "/v1/completions", {"model": model, "prompt": "hi", "top_p": 5}, None),
        ("n negative", "POST", "/v1/completions", {"model": model, "prompt": "hi", "n": -1}, None),
        ("n 100000 (fan-out)", "POST", "/v1/completions", {"model": model, "prompt": "hi", "n": 100_000, "temperature": 1, "max_tokens": 4}, None),
        ("5000 prompts in one request", "POST", "/v1/completions", {"model": model, "prompt": ["hi"] * 5000, "max_tokens": 4}, None),
        ("logprobs 10000", "POST", "/v1/completions", {"model": model, "prompt": "hi", "logprobs": 10000}, None),
        ("seed 2^70", "POST", "/v1/completions", {"model": model, "prompt": "hi", "seed": 2**70}, None),
        ("prompt wrong type", "POST", "/v1/completions", {"model": model, "prompt": {"a": 1}}, None),
        ("prompt empty", "POST", "/v1/completions", {"model": model, "prompt": "", "max_tokens": 4}, None),
        ("prompt token id out of vocabulary", "POST", "/v1/completions", {"model": model, "prompt": [10**9]}, None),
        ("prompt token id negative", "POST", "/v1/completions", {"model": model, "prompt": [-1, 5]}, None),
        ("prompt enormous (200k chars)", "POST", "/v1/completions", {"model": model, "prompt": "word " * 40_000, "max_tokens": 4}, None),
        ("logit_bias not token ids", "POST", "/v1/completions", {"model": model, "prompt": "hi", "logit_bias": {"abc": 5}}, None),
        ("logit_bias out of vocabulary", "POST", "/v1/completions", {"model": model, "prompt": "hi", "logit_bias": {"999999999": 5}}, None),
        ("unknown model", "POST", "/v1/completions", {"model": "no-such-model", "prompt": "hi"}, None),
        ("unknown model (chat)", "POST", "/v1/chat/completions", {"model": "no-such-model", "messages": user}, None),
        ("chat messages empty", "POST", "/v1/chat/completions", {"model": model, "messages": []}, None),
        ("chat messages wrong type", "POST", "/v1/chat/completions", {"model": model, "messages": "hi"}, None),
        ("chat content wrong type", "POST", "/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": 5}]}, None),
        ("chat messages null", "POST", "/v1/chat/completions", {"model": model, "messages": None}, None),
        ("chat messages a number", "POST", "/v1/chat/completions", {"model": model, "messages": 5}, None),
        ("chat content part null", "POST", "/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": [None]}]}, None),
        ("chat content part a number", "POST", "/v1/chat/completions", {"model": model, "messages": [{"role": "system", "content": [5]}]}, None),
        ("chat message without a role", "POST", "/v1/chat/completions", {"model": model, "messages": [{"author": {"role": "assistant"}, "content": [{"type": "text", "text": "hi"}]}]}, None),
        ("chat max_tokens huge", "POST", "/v1/chat/completions", {"model": model, "messages": user, "max_tokens": 10**9}, None),
        ("chat max_completion_tokens negative", "POST", "/v1/chat/completions", {"model": model, "messages": user, "max_completion_tokens": -1}, None),
        ("chat image for a text model", "POST", "/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://127.0.0.1:1/x.png"}}]}]}, None),
        ("chat invalid regex", "POST", "/v1/chat/completions", {"model": model, "messages": user, "structured_outputs": {"regex": "(("}}, None),
        ("invalid UTF-8", "POST", "/v1/completions", b'{"model": "M", "prompt": "\xff\xfe"}'.replace(b"M", model.encode()), "application/json"),
        ("lone surrogate", "POST", "/v1/completions", b'{"model": "M", "prompt": "\\ud800"}'.replace(b"M", model.encode()), "application/json"),
        ("lone surrogate (chat)", "POST", "/v1/chat/completions", b'{"model": "M", "messages": [{"role": "user", "content": "\\udc00"}]}'.replace(b"M", model.encode()), "application/json"),
        ("number overflow 1e400", "POST", "/v1/completions", b'{"model": "M", "prompt": "hi", "max_tokens": 1e400}'.replace(b"M", model.encode()), "application/json"),
        ("NaN literal", "POST", "/v1/completions", b'{"model": "M", "prompt": "hi", "temperature": NaN}'.replace(b"M", model.encode()), "application/json"),
        ("invalid JSON", "POST", "/v1/completions", b'{"model": ', "application/json"),
        ("JSON not an object", "POST", "/v1/completions", b"[1, 2, 3]", "application/json"),
        ("JSON nested 5000 deep", "POST", "/v1/completions", b'{"prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}", "application/json"),
        ("empty body", "POST", "/v1/completions", b"", "application/json"),
        ("form body", "POST", "/v1/completions", b"model=x&prompt=hi", "application/x-www-form-urlencoded"),
        ("text/plain body", "POST", "/v1/chat/completions", b"hello", "text/plain"),
        ("body over the size limit", "POST", "/v1/completions", b'{"prompt": "' + b"a" * 300_000 + b'"}', "application/json"),
        ("GET on a POST route", "GET", "/v1/completions", b"", None),
        ("unknown model card", "GET", "/v1/models/no-such-model", b"", None),
        ("admin: invalid UTF-8 text", "PUT", "/admin/overrides", b"\xff\xfe", "text/plain"),
        ("admin: lone surrogate", "PUT", "/admin/overrides", b'{"replica": "\\ud800", "k": 2}', "application/json"),
        ("admin: number overflow", "PUT", "/admin/overrides", b'{"replica": "*", "k": 1e400}', "application/json"),
        ("admin: k negative", "PUT", "/admin/overrides", {"replica": "*", "k": -3}, None),
        ("admin: unknown field", "PUT", "/admin/overrides", {"replica": "*", "k": 2, "colour": "red"}, None),
        ("admin: history limit huge", "GET", "/admin/history?limit=99999999999999999999", b"", None),
        # the output budget (replicas.max_request_output): each factor within vLLM's own caps, the product not
        ("output budget: n x max_tokens x logprobs", "POST", "/v1/completions", {"model": model, "prompt": "hi", "n": 16, "max_tokens": 500, "logprobs": 20, "ignore_eos": True, "stream": False}, None),
        ("output budget: chat top_logprobs", "POST", "/v1/chat/completions", {"model": model, "messages": user, "n": 16, "max_completion_tokens": 500, "logprobs": True, "top_logprobs": 20}, None),
        ("output budget: 16 prompts x n", "POST", "/v1/completions", {"model": model, "prompt": ["hi"] * 16, "n": 16, "max_tokens": 100}, None),
    ]  # fmt: skip


#: ``(case, method, path, body, content_type[, headers])``: ``body`` is JSON (a dict), raw bytes, or a list of
#: byte chunks (sent chunked, with no Content-Length); ``headers`` are added last (they may replace the credentials)
Case = tuple


def send_hostile(dep: Deployment) -> list[dict]:
    """Send every :func:`hostile_requests` case (with valid credentials); returns status and reason per case."""
    return send_cases(dep, hostile_requests(dep.model))


def send_cases(dep: Deployment, cases: list[Case]) -> list[dict]:
    """Send each :data:`Case` with the deployment's credentials; status and reason per case (status 0: no HTTP
    answer, the reason says what happened to the connection)."""
    out = []
    with httpx.Client(base_url=dep.base_url, timeout=120) as client:
        for case, method, path, body, content_type, *extra in cases:
            headers = httpx.Headers(dep.admin_headers if path.startswith("/admin") else dep.api_headers)
            if content_type and not isinstance(body, dict):
                headers["content-type"] = content_type
            for key, value in (extra[0] if extra else {}).items():
                headers[key] = value  # replaces, whatever the case: a case's Authorization is the only one sent
            kwargs = (
                {"json": body}
                if isinstance(body, dict)
                else {"content": iter(body) if isinstance(body, list) else body}
            )
            t0 = time.monotonic()
            try:
                r = client.request(method, path, headers=headers, **kwargs)
                status, reason = r.status_code, error_reason(r)
            except httpx.HTTPError as exc:
                status, reason = 0, f"{type(exc).__name__}: {exc}"[:200]
            out.append(
                {
                    "case": case,
                    "path": path,
                    "status": status,
                    "reason": reason,
                    "seconds": round(time.monotonic() - t0, 2),
                }
            )
    return out


def error_reason(r: httpx.Response) -> str:
    """The human-readable reason of an error answer (OpenAI ``error.message`` or FastAPI ``detail``)."""
    try:
        body = r.json()
    except ValueError:
        return r.text[:200]
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return str(body["error"].get("message", ""))[:200]
    if isinstance(body, dict) and "detail" in body:
        detail = body["detail"]
        if isinstance(detail, list) and detail and isinstance(detail[0], dict):
            return f"{detail[0].get('loc')}: {detail[0].get('msg')}"[:200]
        return str(detail)[:200]
    return json.dumps(body)[:200]


def scenario_bad_telemetry(dep: Deployment, cluster: Cluster) -> dict:
    """Malformed telemetry pushed straight to the live controller actor: rejected, counted, harmless."""
    import msgspec
    import ray

    nan = float("nan")
    rid = sorted(cluster.snapshot()["replicas"])[0]

    def batch(replica_id: object = rid, **fields: object) -> bytes:
        # raw msgpack in the wire layout of TelemetryBatch (records are arrays): what a buggy
        # or hostile sender could put on the wire, which the typed encoder would refuse
        return msgspec.msgpack.encode({"wire": 1, "replica_id": replica_id, **fields})

    batches: list[object] = [
        batch(completions=[[nan, 4, "stop"]]),  # NaN
        batch(completions=[[12, -3, "stop"]]),  # negative
        batch(completions=[[12, 10**12, "stop"]]),  # absurd length
        batch(completions=[["x", 4, "stop"]]),  # wrong type
        batch(completions=[[3, 4, "exploded"]]),  # unknown finish reason
        batch(steps=[[0, 5, 5, 0, float("inf")]]),  # infinite step time
        batch(steps=[[0, 5, 5, 0, -1.0]]),  # negative step time
        batch(steps=[[10**13, 0, 1, 0, 0.1]]),  # absurd token count
        batch(completions=5),  # records not a list: the batch is unreadable
        batch(dropped_completions=nan),  # a counter that is not one
        batch(stats={"preemptions": -7}),
        batch("no-such-replica", completions=[[12, 4, "stop"]]),  # wrong replica
        batch(["not", "an", "id"]),
        b"not a batch at all",
        msgspec.msgpack.encode({"wire": 99, "replica_id": rid}),  # a wire version from the future
    ]
    time.sleep(SNAPSHOT_TTL_S)  # reads closer together than this may share one snapshot: both are fresh
    before = cluster.snapshot()
    replies = [ray.get(cluster.controller().ingest.remote(b), timeout=10) for b in batches]
    time.sleep(SNAPSHOT_TTL_S)
    after = cluster.snapshot()
    rejected = {k: after["rejected"].get(k, 0) - before["rejected"].get(k, 0) for k in after["rejected"]}
    return {
        "batches": len(batches),
        "rejected": {k: v for k, v in rejected.items() if v},
        "accepted_completions": after["received"].get("completions", 0) - before["received"].get("completions", 0),
        "replies_for_unknown": [r is None for r in replies[-4:]],
        "controller_alive": cluster.ping()["version"] >= 0,
        "metrics_text": httpx.get(f"{dep.base_url}/metrics", timeout=30).text,
    }


def scenario_secrets(dep: Deployment, cluster: Cluster) -> dict:
    """Credentials are enforced on the live deployment and appear in no response and no log line."""
    wrong = "wrong-token-Zx81q"
    base = dep.base_url
    body = {"model": dep.model, "prompt": "hi", "max_tokens": 2}
    checks = {
        "v1_without_key": httpx.post(f"{base}/v1/completions", json=body, timeout=60).status_code,
        "v1_wrong_key": httpx.post(f"{base}/v1/completions", json=body, headers={"Authorization": f"Bearer {wrong}"}, timeout=60).status_code,
        "v1_with_key": httpx.post(f"{base}/v1/completions", json=body, headers=dep.api_headers, timeout=60).status_code,
        "tokenize_without_key": httpx.post(f"{base}/tokenize", json={"model": dep.model, "prompt": "hi"}, timeout=60).status_code,
        "admin_put_without_token": httpx.put(f"{base}/admin/overrides", json={"replica": "*", "k": 2}, timeout=60).status_code,
        "admin_put_wrong_token": httpx.put(f"{base}/admin/overrides", json={"replica": "*", "k": 2}, headers={"Authorization": f"Bearer {wrong}"}, timeout=60).status_code,
        "admin_post_wrong_token": httpx.post(f"{base}/admin/recompute", headers={"Authorization": f"Bearer {wrong}"}, timeout=60).status_code,
        "admin_delete_wrong_token": httpx.delete(f"{base}/admin/overrides/x", headers={"Authorization": f"Bearer {wrong}"}, timeout=60).status_code,
        "admin_read_with_token": httpx.get(f"{base}/admin/thresholds", headers=dep.admin_headers, timeout=60).status_code,
    }  # fmt: skip
    answers = [
        httpx.post(f"{base}/v1/completions", json=body, headers={"Authorization": f"Bearer {wrong}"}, timeout=60).text,
        httpx.put(
            f"{base}/admin/overrides",
            json={"replica": "*", "k": 2},
            headers={"Authorization": f"Bearer {wrong}"},
            timeout=60,
        ).text,
        httpx.get(f"{base}/metrics", timeout=60).text,
        httpx.get(f"{base}/health", timeout=60).text,
        httpx.get(f"{base}/openapi.json", timeout=60).text,
    ]
    secrets = [s for s in (dep.admin_token, dep.api_key, wrong) if s]
    echoed = [s for s in secrets if any(s in a for a in answers)]
    time.sleep(2)  # log lines flush
    files = [dep.log_path, *(p for p in cluster.session_logs().rglob("*") if p.is_file())]
    leaks = []
    for path in files:
        try:
            data = path.read_bytes()
        except OSError:
            continue
        leaks.extend(f"{path.name}: {s[:4]}..." for s in secrets if s.encode() in data)
    return {"statuses": checks, "echoed": echoed, "log_files_scanned": len(files), "leaks": leaks}


def scenario_hostile(dep: Deployment) -> dict:
    """Every hostile request, then proof the deployment still serves."""
    answers = send_hostile(dep)
    ok = httpx.post(
        f"{dep.base_url}/v1/completions",
        json={"model": dep.model, "prompt": "still there?", "max_tokens": 4},
        headers=dep.api_headers,
        timeout=60,
    )
    return {
        "cases": answers,
        "bad": [a for a in answers if not (400 <= a["status"] < 500 and a["reason"])],
        "alive_after": ok.status_code == 200 and httpx.get(f"{dep.base_url}/health", timeout=30).status_code == 200,
    }


def engine_running(cluster: Cluster, replicas: int) -> int:
    """Requests the replicas' engines run now (their schedulers' last telemetry drain)."""
    return sum(int(status["running"]) for status in cluster.replica_status(replicas).values())


def received_totals(dep: Deployment) -> dict[str, float]:
    """``ebplus_telemetry_received_total`` by kind: ``completions`` counts every request an engine freed,
    ``aborted`` those that left unfinished (aborted, failed, or with no output token)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{dep.base_url}/metrics", timeout=30).text
    out = {"completions": 0.0, "aborted": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "ebplus_telemetry_received_total" and sample.labels.get("kind") in out:
                out[sample.labels["kind"]] = sample.value
    return out


def _quiet_totals(
    dep: Deployment, quiet_s: float, timeout_s: float, completions_at_least: float = 0.0
) -> tuple[dict[str, float], float]:
    """The totals once they count ``completions_at_least`` and have not moved for ``quiet_s``, and the seconds
    (from now) of their last move.

    Quiet alone is not proof that a push arrived: a push that times out (``PUSH_TIMEOUT_S``, 2 s) keeps its
    records for the next one, so a count the caller knows is coming is waited for by number."""
    started = time.monotonic()
    last, moved_at = received_totals(dep), started
    while time.monotonic() - started < timeout_s:
        time.sleep(0.25)
        now = received_totals(dep)
        if now != last:
            last, moved_at = now, time.monotonic()
        elif time.monotonic() - moved_at >= quiet_s and last["completions"] >= completions_at_least:
            break
    return last, moved_at - started


def scenario_abandoned(
    dep: Deployment,
    cluster: Cluster,
    replicas: int,
    clients: int = 2,
    leave_after_s: float = 0.75,
    settle_s: float = 5.0,
    n: int = 16,
) -> dict:
    """Clients that give up: non-streamed and streamed requests for long answers, dropped after
    ``leave_after_s``; how long until the engines have let go of every sequence they were running for them
    (target: within ``settle_s``).

    The evidence is what each engine reports when it frees a request (the controller's counters,
    pushed every ``telemetry_interval_s``): a sequence generated in full for nobody is counted
    freed but not aborted (``finished_for_nobody``); one Serve cancelled before the engine took it
    is counted by neither (it cost the engine nothing). Each request asks for ``n`` sequences of
    480 tokens (a stream ``n - 1``, so the totals say which kind was left running:
    ``finished_for_nobody_by_kind``), and its client leaves ``leave_after_s`` after sending it (a
    stream: after its first line), well before the answer can be done (``full_answer_s``, the
    control, says how long it takes), so every sequence of it must be aborted. (A reading of the
    engines' running count at one instant missed a stream that was being answered: it is kept as
    the secondary figure.)

    Without cancellation a non-streamed answer is generated in full for nobody (nothing is
    written until it is done, so nothing notices the client left).

    Each client's departure is measured (``left_s``: from just before it sent its request to its
    connection closed), and ``on_time`` says whether every one left before ``full_answer_s``. On the
    2-core machine the engines take both cores and the clients (threads of this process) left
    0.85-6.0 s after sending (16 runs), not ``leave_after_s``; a client that leaves after its answer
    could be done may find it done, and such a run says nothing about cancellation.
    """
    import threading

    body = {"model": dep.model, "prompt": "tell me everything", "n": n, "max_tokens": 480, "ignore_eos": True}

    def give_up(stream: bool) -> tuple[str, float]:
        sent = time.monotonic()
        outcome = leave(stream)
        return outcome, round(time.monotonic() - sent, 2)

    def leave(stream: bool) -> str:
        try:
            with httpx.Client(base_url=dep.base_url, timeout=leave_after_s, headers=dep.api_headers) as client:
                if not stream:
                    answer = client.post("/v1/completions", json={**body, "stream": False})
                    return f"answered {answer.status_code} before the client left: {answer.text[:300]}"
                with client.stream("POST", "/v1/completions", json={**body, "n": n - 1, "stream": True}) as r:
                    for _ in r.iter_lines():
                        time.sleep(leave_after_s)  # read one line, then go away
                        break
                return "left mid-stream"
        except httpx.TimeoutException:
            return "left before the answer"

    zero = received_totals(dep)
    started = time.monotonic()  # the control: how long the engine works for one such request a client waits for
    with httpx.Client(base_url=dep.base_url, timeout=300, headers=dep.api_headers) as client:
        full = client.post("/v1/completions", json={**body, "stream": False})
    full_answer_s = round(time.monotonic() - started, 2) if full.status_code == 200 else None
    # the control's own n completions in first (counted, not guessed from a quiet spell)
    before, _ = _quiet_totals(dep, 1.5, 30, completions_at_least=zero["completions"] + n)
    outcomes: list[tuple[str, float]] = []
    threads = [
        threading.Thread(target=lambda s=stream: outcomes.append(give_up(s)))
        for stream in [False] * clients + [True] * clients
    ]
    for t in threads:
        t.start()
    running_before = 0  # the most the engines ran for the clients before they left (secondary)
    while any(t.is_alive() for t in threads):
        running_before = max(running_before, engine_running(cluster, replicas))
        time.sleep(0.2)
    for t in threads:
        t.join()
    after, last_move_s = _quiet_totals(dep, 2.0, settle_s + 30)
    freed = after["completions"] - before["completions"]
    aborted = after["aborted"] - before["aborted"]
    left_s = sorted(left for _, left in outcomes)
    return {
        "clients": len(threads),
        "outcomes": sorted(outcome for outcome, _ in outcomes),
        "full_answer_s": full_answer_s,
        "left_s": left_s,
        "on_time": full_answer_s is not None and max(left_s) < full_answer_s,
        "sequences_per_request": n,
        "sequences_sent": (2 * n - 1) * clients,
        "aborted": aborted,
        "finished_for_nobody": freed - aborted,
        "finished_for_nobody_by_kind": _by_kind(freed - aborted, n, clients),
        "seconds_until_no_work": round(last_move_s, 2),
        "running_before_they_left": running_before,
        "leave_after_s": leave_after_s,
        "settle_s": settle_s,
    }


def _by_kind(sequences: float, n: int, clients: int) -> dict[str, int] | None:
    """Sequences finished for nobody split into non-streamed requests (``n`` each) and streams (``n - 1`` each):
    the split of ``sequences`` with at most ``clients`` requests of each kind, one only while ``clients`` < ``n - 1``
    (``None``: no such split)."""
    for whole in range(clients + 1):
        for streams in range(clients + 1):
            if whole * n + streams * (n - 1) == sequences:
                return {"non-streamed": whole * n, "streamed": streams * (n - 1)}
    return None


def is_loopback(address: str) -> bool:
    """``127.0.0.0/8``, ``::1`` or an IPv4-mapped loopback (``::ffff:127.0.0.1``, how gRPC's dual-stack
    sockets show it)."""
    import ipaddress

    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or bool(mapped and mapped.is_loopback)


#: What may listen outside loopback in a local ``ebplus serve``, by process, and why (docs/reliability.md):
#: Ray 2.60's own servers, which bind every interface or the node IP, and no setting moves them (the one
#: switch that makes the node IP loopback, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, leaves every process that
#: joins the cluster without it hanging at ray.init: measured).
RAY_LISTENERS = {
    "gcs_server": "the GCS's gRPC server: every interface (C++, no bind setting)",
    "raylet": "the raylet's node-manager and object-manager gRPC servers: every interface (C++)",
    "ray::": "each worker's core-worker gRPC server (every actor and task process, Serve's included): every "
    "interface (C++); a Serve replica also has Ray Serve's inter-deployment gRPC server on [::]:0",
    "DashboardAgent": "the dashboard agent: its gRPC server, its HTTP port (52365) on the node IP, and the "
    "metrics export port (ray.metrics_export_port) on every interface",
    "RuntimeEnvAgent": "the runtime-env agent: the node IP",
    "monitor.py": "the autoscaler monitor's metrics server (AUTOSCALER_METRIC_PORT, 44217): every interface",
    "dashboard.py": "the dashboard head's metrics server (DASHBOARD_METRIC_PORT, 44227): every interface, "
    "even with the dashboard off",
    "ebplus": "the `ebplus serve` driver (`python -m ebplus.cli serve`): its core-worker gRPC server, every "
    "interface (C++)",
}


def ray_listener_kind(process: str) -> str | None:
    """The :data:`RAY_LISTENERS` entry a listening process is, or ``None`` (not one Ray explains). A Ray worker
    (``ray::<name>``) is its named agent when it is one (``ray::DashboardAgent``), else any worker: a Serve
    replica of the ``ebplus`` application is not the ``ebplus serve`` driver."""
    if process.startswith("ray::"):
        name = process[len("ray::") :]
        return next((kind for kind in RAY_LISTENERS if kind.endswith("Agent") and name.startswith(kind)), "ray::")
    return next((kind for kind in RAY_LISTENERS if kind != "ray::" and kind in process), None)


def listeners(pid: int) -> list[dict]:
    """TCP sockets listening in the process tree of ``pid`` (the deployment): address, port, process."""
    import psutil

    out = []
    for proc in process_tree(pid):
        try:
            conns = proc.net_connections(kind="tcp")
            name = " ".join(proc.cmdline()[:3])  # not cut to a width: a deep checkout's path would hide the script
        except psutil.Error:
            continue
        for c in conns:
            if c.status == psutil.CONN_LISTEN:
                out.append({"address": c.laddr.ip, "port": c.laddr.port, "pid": proc.pid, "process": name})
    return sorted(out, key=lambda item: (item["port"], item["address"]))


def scenario_fuzz(dep: Deployment, examples: int = 15, seed: int = 7) -> dict:
    """schemathesis (its CLI) over the live ``/openapi.json``, positive and negative cases, no 5xx allowed.

    Three runs so each gets its credentials: ``/admin`` with the admin token, the
    model routes with the API key, the open routes without either.
    """
    import shutil

    exe = shutil.which("schemathesis", path=str(Path(sys.executable).parent)) or shutil.which("schemathesis")
    if exe is None:
        return {"skipped": "schemathesis is not installed (pip install -e '.[dev]')"}
    runs = {}
    for name, regex, headers in (
        ("admin", "^/admin", dep.admin_headers),
        ("model API", "^/(v1|tokenize|detokenize)", dep.api_headers),
        ("open", "^/(metrics|health)", {}),
    ):
        cmd = [
            exe, "run", f"{dep.base_url}/openapi.json",
            "--checks", "not_a_server_error",
            "--max-examples", str(examples),
            "--include-path-regex", regex,
            "--mode", "all",
            "--request-timeout", "120",
            "--seed", str(seed),
            "--no-color",
        ]  # fmt: skip
        for key, value in headers.items():
            cmd += ["--header", f"{key}: {value}"]
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory() as scratch:  # schemathesis keeps a cache in its working dir
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, cwd=scratch)
        lines = [line for line in proc.stdout.splitlines() if line.strip()]
        runs[name] = {"exit_code": proc.returncode, "seconds": round(time.monotonic() - t0), "summary": lines[-15:]}
    return runs
