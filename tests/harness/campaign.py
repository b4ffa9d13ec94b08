"""The probes of the hostile-input and fault campaign (``make bench-hostile``, issue 23), reusable by the e2e tier.

Each probe family is a generator of distinct requests (never copies of one) or a fault, and
:func:`measure` wraps any of them with what the campaign records per probe: the answers
(status-code histogram), 5xx, the peak resident memory of the ingress/proxy processes and
of the head (GCS, raylet, Serve's and EB+'s controllers) while it runs, requests lost (a
control request afterwards must be answered 200), engine work still running 5 s after the
clients left, and whether the controller kept deciding (an operator's ``/admin/recompute``
is answered with a decision and the controller's version never goes back).
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

import httpx

from harness.cluster import Cluster
from harness.deployment import Deployment, process_tree
from harness.hostile import Case, engine_running, send_cases

#: The processes whose memory is each role's in ``ebplus serve``: the ingress (Serve's HTTP proxy, the ingress
#: replica, HAProxy when on) and the head (Ray's GCS and raylet, Serve's controller, EB+'s controller actor)
SERVE_ROLES = {
    "ingress": re.compile(r"ProxyActor|ServeReplica:\S*Ingress|haproxy"),
    "head": re.compile(r"gcs_server|raylet|ServeController|ebplus-controller|ControllerActor"),
}
#: The plugin mode has no head: vLLM's API server is the ingress and runs EB+'s controller in-process
PLUGIN_ROLES = {"ingress": re.compile(r"vllm\.entrypoints\.openai\.api_server|vllm serve")}
#: Seconds after the clients left at which the engines must run nothing for them (issue 23's target)
SETTLE_S = 5.0
MIB = 1 << 20


class RssPeaks:
    """Peak summed RSS of each role's processes (:data:`SERVE_ROLES`) in the process tree of ``pid``, sampled on a
    thread while a probe runs (a peak needs sampling: a reading before and after misses a spike it freed)."""

    def __init__(self, pid: int, roles: dict[str, re.Pattern] = SERVE_ROLES, every_s: float = 0.25) -> None:
        self.pid, self.roles, self.every_s = pid, roles, every_s
        self.peaks = dict.fromkeys(roles, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        import psutil

        now = dict.fromkeys(self.roles, 0)
        for proc in process_tree(self.pid):
            with contextlib.suppress(psutil.Error):
                line = " ".join(proc.cmdline())
                for role, pattern in self.roles.items():
                    if pattern.search(line):
                        now[role] += proc.memory_info().rss
        for role, rss in now.items():
            self.peaks[role] = max(self.peaks[role], rss)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sample()

    def __enter__(self) -> RssPeaks:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def mib(self) -> dict[str, int]:
        return {role: round(rss / MIB) for role, rss in self.peaks.items()}


#: What the probes read of a server: ``ebplus serve``'s :class:`Deployment`, or the plugin mode's
#: :class:`harness.plugin.PluginServer` (base_url, model, api_key, api_headers, admin_headers, pid)
Target = Any


def control(dep: Target) -> int:
    """The status of one ordinary request after a probe (200: nothing the probe did cost the next client)."""
    body = {"model": dep.model, "prompt": "control request", "max_tokens": 4}
    try:
        return httpx.post(f"{dep.base_url}/v1/completions", json=body, headers=dep.api_headers, timeout=120).status_code
    except httpx.HTTPError:
        return 0


def deciding(dep: Target, version_before: int) -> dict:
    """Whether the controller still decides: ``/admin/recompute`` answered with a decision whose version is not below
    the one before the probe (``version_before`` 0 for a controller that restarted cold on purpose)."""
    try:
        r = httpx.post(f"{dep.base_url}/admin/recompute", headers=dep.admin_headers, timeout=60)
        body = r.json() if r.status_code == 200 else {}
    except (httpx.HTTPError, ValueError):
        return {"ok": False, "status": 0}
    version = body.get("version", -1)
    return {"ok": r.status_code == 200 and version >= version_before, "status": r.status_code, "version": version,
            "persisted": body.get("persisted"), "message": body.get("message")}  # fmt: skip


def measure(name: str, dep: Deployment, cluster: Cluster, probe: Callable[[], dict], *, injected: bool = False) -> dict:
    """:func:`observe` on ``ebplus serve``: the controller actor's version, the replicas' running requests."""
    replicas = dep.config.replicas.num_replicas
    return observe(name, dep, probe, version=lambda: cluster.ping()["version"],
                   engine_work=lambda: engine_running(cluster, replicas), injected=injected)  # fmt: skip


def observe(
    name: str,
    dep: Target,
    probe: Callable[[], dict],
    *,
    version: Callable[[], int],
    engine_work: Callable[[], int],
    roles: dict[str, re.Pattern] = SERVE_ROLES,
    injected: bool = False,
) -> dict:
    """Run ``probe`` (it returns ``{"answers": Counter-like, ...}`` plus anything it wants kept) under
    :class:`RssPeaks` and record the campaign's figures for it. ``version`` reads the controller's decision
    version, ``engine_work`` the requests the engines run now. ``injected``: a fault probe, whose 5xx are the
    fault's own (reported, not held against the target)."""
    version0 = version()
    t0 = time.monotonic()
    with RssPeaks(dep.pid, roles) as rss:
        out = probe()
    seconds = time.monotonic() - t0
    time.sleep(SETTLE_S)  # the clients are gone: what the engines still run now is work for nobody
    left = engine_work()
    merged: Counter = Counter()  # status codes may come as ints (httpx) and strings (the load's summary)
    for key, count in out.pop("answers", {}).items():
        merged[str(key)] += count
    answers = dict(sorted(merged.items()))
    control_status = control(dep)
    return {
        "probe": name,
        "cases": out.pop("cases", sum(answers.values())),
        "answers": answers,
        "5xx": sum(v for k, v in answers.items() if k.isdigit() and int(k) >= 500),
        "injected": injected,
        "rss_peak_mib": rss.mib(),
        "lost": int(control_status != 200) + int(out.pop("lost", 0)),
        "control_status": control_status,
        "engine_left": left,
        # a controller restarted onto a state it set aside starts cold at version 0: deciding again is what counts
        "deciding": deciding(dep, 0 if out.get("restored") is False else version0),
        "seconds": round(seconds, 1),
        **out,
    }


# --------------------------------------------------------------------------- request families


def oversized_cases(model: str, max_model_len: int, budget: int, max_body: int) -> list[Case]:
    """50 requests past a limit: output length past the context, output budget (prompts x n x tokens x
    (1 + logprobs)) past ``budget`` with every factor modest, prompts past the context, bodies past ``max_body``."""
    cases: list[Case] = []
    huge = [max_model_len + 1, 2 * max_model_len, 4096, 10**4, 10**5, 10**6, 2**31 - 1, 2**31, 2**40, 2**62]
    for v in huge:
        cases.append(
            (f"max_tokens {v}", "POST", "/v1/completions", {"model": model, "prompt": "hi", "max_tokens": v}, None)
        )
        cases.append((f"chat max_completion_tokens {v}", "POST", "/v1/chat/completions",
                      {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": v}, None))  # fmt: skip
    for i in range(10):  # each past the budget: prompts * n * 480 * 13 >= 24,960 > 20,000 (the deployment's)
        prompts, n = 1 + i % 3, 4 * (i + 1)
        asked = prompts * n * 480 * 13
        assert asked > budget, (asked, budget)
        cases.append((f"budget {prompts} prompts x n {n} x 480 x 13", "POST", "/v1/completions",
                      {"model": model, "prompt": ["hi"] * prompts, "n": n, "max_tokens": 480, "logprobs": 12}, None))  # fmt: skip
    for words in (600, 1000, 2000, 5000, 10_000, 20_000, 40_000):
        cases.append((f"prompt of {words} words", "POST", "/v1/completions", {"model": model, "prompt": "word " * words, "max_tokens": 2}, None))  # fmt: skip
    for ids in (max_model_len + 1, 1000, 4096):
        cases.append((f"prompt of {ids} token ids", "POST", "/v1/completions", {"model": model, "prompt": list(range(5, 5 + ids)), "max_tokens": 2}, None))  # fmt: skip
    for size in (max_body + 1, 2 * max_body, 1 << 20, 4 << 20, 16 << 20):
        body = b'{"model": "%s", "prompt": "' % model.encode() + b"a" * size + b'"}'
        cases.append((f"body of {size} bytes", "POST", "/v1/completions", body, "application/json"))
    for size in (max_body + 1, 2 * max_body, 1 << 20, 4 << 20, 16 << 20):  # no Content-Length: the server must count
        body = b'{"model": "%s", "prompt": "' % model.encode() + b"b" * size + b'"}'
        chunks = [body[i : i + 65536] for i in range(0, len(body), 65536)]
        cases.append((f"chunked body of {size} bytes", "POST", "/v1/completions", chunks, "application/json"))
    assert len(cases) == 50, len(cases)
    return cases


def malformed_cases(model: str) -> list[Case]:
    """50 malformed bodies and headers: JSON cut at 10 places, wrong top-level types, JSON extensions, deep nesting;
    wrong content types and encodings, broken credentials, oversized and numerous headers."""
    good = json.dumps({"model": model, "prompt": "hello there", "max_tokens": 2}).encode()
    cases: list[Case] = []
    for cut in range(1, len(good), max(1, len(good) // 10)):
        if len(cases) < 10:
            cases.append((f"JSON cut at byte {cut}", "POST", "/v1/completions", good[:cut], "application/json"))
    for top in (b"null", b"true", b"1", b'"s"', b"[]", b"{}"):
        cases.append((f"top-level {top.decode()}", "POST", "/v1/completions", top, "application/json"))
    extras = {
        "trailing garbage": good + b"}}}",
        "two documents": good + good,
        "single quotes": good.replace(b'"', b"'"),
        "comment": b"/* hi */" + good,
        "duplicate keys": good[:-1] + b', "max_tokens": 3, "max_tokens": -1}',
        "Infinity literal": good[:-1] + b', "temperature": Infinity}',
        "nested 100 deep": b'{"prompt": ' + b"[" * 100 + b"]" * 100 + b"}",
        "nested 100000 deep": b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        "string escapes broken": b'{"model": "' + model.encode() + b'", "prompt": "\\x41"}',
    }
    cases += [(name, "POST", "/v1/completions", body, "application/json") for name, body in extras.items()]
    for ctype in ("text/plain", "application/xml", "multipart/form-data", "application/json; charset=latin-1",
                  "application/json; charset=utf-16", "application/jsonx", "", "*/*", ";;;", "application/octet-stream"):  # fmt: skip
        cases.append(
            (f"content-type {ctype!r}", "POST", "/v1/completions", good, ctype or None, {"content-type": ctype})
        )
    for enc in ("gzip", "br", "deflate"):
        cases.append((f"content-encoding {enc} on a plain body", "POST", "/v1/completions", good, "application/json",
                      {"content-encoding": enc}))  # fmt: skip
    for label, value in (("Bearer alone", "Bearer"), ("Bearer and two words", "Bearer a b"), ("Basic", "Basic dXNlcjpwYXNz"),
                         ("Token scheme", "Token abc"), ("8 KiB token", "Bearer " + "k" * 8192), ("two tokens", "Bearer a, Bearer b"),
                         ("non-ASCII token", "Bearer jet\u00e9")):  # fmt: skip
        cases.append((f"authorization: {label}", "POST", "/v1/completions", good, "application/json",
                      {"authorization": value}))  # fmt: skip
    cases.append(("a 32 KiB header", "POST", "/v1/completions", good, "application/json", {"x-pad": "p" * 32768}))
    cases.append(
        ("200 headers", "POST", "/v1/completions", good, "application/json", {f"x-h{i}": str(i) for i in range(200)})
    )
    cases.append(
        ("expect: 100-continue", "POST", "/v1/completions", good, "application/json", {"expect": "100-continue"})
    )
    cases.append(("admin: malformed JSON", "PUT", "/admin/overrides", b'{"replica": "*", "k": ', "application/json"))
    cases.append(("admin: body a list", "PUT", "/admin/overrides", b"[1, 2]", "application/json"))
    assert len(cases) == 50, len(cases)
    return cases


def unicode_cases(model: str) -> list[Case]:
    """30 unicode and encoding cases: 15 valid texts a model must take (emoji, scripts, combining marks, controls,
    NUL, BOM, the last code point) and 15 encodings a parser must refuse or read (invalid, overlong, surrogates,
    UTF-16/32 and Latin-1 bodies, non-ASCII keys and model names)."""
    texts = {
        "emoji": "\U0001f600\U0001f680 \U0001f469\u200d\U0001f469\u200d\U0001f467",
        "CJK": "\u4f60\u597d\uff0c\u4e16\u754c",
        "Arabic (RTL)": "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
        "bidi override": "abc\u202edcba\u202c",
        "1000 combining marks": "a" + "\u0301" * 1000,
        "zero-width characters": "a\u200bb\u200cc\u200dd\ufeffe",
        "NUL": "before\u0000after",
        "C0 controls": "".join(chr(c) for c in range(1, 32)),
        "BOM first": "\ufeffhello",
        "noncharacter U+FFFF": "x\uffffy",
        "last code point U+10FFFF": "x\U0010ffffy",
        "Devanagari": "\u0928\u092e\u0938\u094d\u0924\u0947",
        "mathematical alphanumerics": "\U0001d400\U0001d401\U0001d402",
        "line and paragraph separators": "a\u2028b\u2029c",
        "private use": "\ue000\uf8ff",
    }
    cases: list[Case] = []
    for i, (label, text) in enumerate(texts.items()):
        if i % 2:
            cases.append((f"chat: {label}", "POST", "/v1/chat/completions",
                          {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 2}, None))  # fmt: skip
        else:
            cases.append((f"prompt: {label}", "POST", "/v1/completions", {"model": model, "prompt": text, "max_tokens": 2}, None))  # fmt: skip
    m = model.encode()
    raw = {
        "invalid continuation byte": b'{"model": "M", "prompt": "a\x80b", "max_tokens": 2}',
        "overlong '/' (C0 AF)": b'{"model": "M", "prompt": "\xc0\xaf", "max_tokens": 2}',
        "5-byte sequence": b'{"model": "M", "prompt": "\xf8\x88\x80\x80\x80", "max_tokens": 2}',
        "surrogate as UTF-8 bytes (CESU)": b'{"model": "M", "prompt": "\xed\xa0\x80", "max_tokens": 2}',
        "truncated 3-byte sequence": b'{"model": "M", "prompt": "\xe4\xbd", "max_tokens": 2}',
        "escaped lone high surrogate": b'{"model": "M", "prompt": "\\ud83d", "max_tokens": 2}',
        "escaped lone low surrogate": b'{"model": "M", "prompt": "\\udfff", "max_tokens": 2}',
        "escaped surrogates reversed": b'{"model": "M", "prompt": "\\udc00\\ud800", "max_tokens": 2}',
        "truncated escape": b'{"model": "M", "prompt": "\\u12", "max_tokens": 2}',
        "escaped NUL in the model name": b'{"model": "M\\u0000", "prompt": "hi", "max_tokens": 2}',
        "non-ASCII model name": '{"model": "M\u00e9\U0001f600", "prompt": "hi", "max_tokens": 2}'.encode(),
        "non-ASCII field name": '{"model": "M", "pr\u00f6mpt": "hi", "max_tokens": 2}'.encode(),
    }
    cases += [
        (label, "POST", "/v1/completions", body.replace(b"M", m, 1), "application/json") for label, body in raw.items()
    ]
    doc = json.dumps({"model": model, "prompt": "caf\u00e9", "max_tokens": 2}, ensure_ascii=False)
    for label, codec in (("UTF-16 body", "utf-16"), ("UTF-32 body", "utf-32"), ("Latin-1 body", "latin-1")):
        cases.append((label, "POST", "/v1/completions", doc.encode(codec), "application/json"))
    assert len(cases) == 30, len(cases)
    return cases


def send_family(dep: Target, cases: list[Case]) -> dict:
    """:func:`send_cases` as a probe: the histogram, each case's status, and each 5xx or unanswered case in full."""
    sent = send_cases(dep, cases)
    answers = Counter(a["status"] for a in sent)
    return {"answers": answers, "cases": len(sent), "by_case": {a["case"]: a["status"] for a in sent},
            "server_errors": [a for a in sent if a["status"] >= 500 or a["status"] == 0]}  # fmt: skip


# --------------------------------------------------------------------------- connections that stall or leave


def _raw(dep: Target, kind: str, hold_s: float, max_tokens: int) -> str:
    """One raw TCP client of :func:`slow_loris` (``kind`` says how it misbehaves); returns what it saw."""
    url = urlsplit(dep.base_url)
    host, port = url.hostname, url.port
    auth = "".join(f"{k}: {v}\r\n" for k, v in dep.api_headers.items())
    stream = kind == "stream-then-leave"
    body = json.dumps({"model": dep.model, "prompt": f"{kind} tell me everything", "n": 4, "max_tokens": max_tokens,
                       "ignore_eos": True, "stream": stream}).encode()  # fmt: skip
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\n{auth}Content-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()  # fmt: skip
    t0 = time.monotonic()
    with socket.create_connection((host, port), timeout=hold_s) as s:
        s.settimeout(1.0)

        def answered() -> str | None:
            try:
                data = s.recv(4096)
            except TimeoutError:
                return None
            except ConnectionResetError:
                data = b""
            if not data:
                return f"closed by the server after {time.monotonic() - t0:.0f} s"
            return data.split(b"\r\n", 1)[0].decode(errors="replace")

        def then() -> str:
            """After an answer to a stalled request: whether the server also closed the connection."""
            while time.monotonic() - t0 < hold_s:
                try:
                    if not s.recv(4096):
                        break
                except TimeoutError:
                    continue
                except ConnectionResetError:
                    break
            else:
                return f"still open after {hold_s:.0f} s"
            return f"closed by the server after {time.monotonic() - t0:.0f} s"

        if kind in ("send-and-leave", "stream-then-leave"):
            s.sendall(head + body)
            if stream:  # read the first lines of the stream, then leave
                while (line := answered()) is None and time.monotonic() - t0 < hold_s:
                    pass
                return f"left after {line}"
            return "left after sending"
        if kind == "dribble-headers":
            for byte in head[:-2]:  # one byte a second, never the blank line
                if time.monotonic() - t0 > hold_s:
                    return f"still open after {hold_s:.0f} s"
                try:
                    s.sendall(bytes([byte]))
                except OSError:
                    return f"closed by the server after {time.monotonic() - t0:.0f} s"
                if (seen := answered()) is not None:
                    return seen if seen.startswith("closed") else f"{seen}, {then()}"
        elif kind == "body-never-sent":
            s.sendall(head)
        while time.monotonic() - t0 < hold_s:  # silent (or waiting for the body): what does the server do?
            if (seen := answered()) is not None:
                return seen if seen.startswith("closed") else f"{seen}, {then()}"
        return f"still open after {hold_s:.0f} s"


def slow_loris(dep: Target, hold_s: float = 20.0, max_tokens: int = 480) -> dict:
    """20 connections that stall or are abandoned, all at once: 5 dribble their headers a byte a second, 5 send
    headers and never the body, 3 connect and say nothing, 3 send a long request and close at once, 4 read the
    first line of a long stream and close. Each waits at most ``hold_s`` for the server to answer or close.
    Answers: the first line the server sent, or what became of the connection. ``stalled``: what became of the 13
    stalled ones (``closed by the server``, with or without an answer first, or ``open at the end``)."""
    kinds = ["dribble-headers"] * 5 + ["body-never-sent"] * 5 + ["silent"] * 3
    kinds += ["send-and-leave"] * 3 + ["stream-then-leave"] * 4
    with ThreadPoolExecutor(len(kinds)) as pool:
        seen = list(pool.map(lambda k: _raw(dep, k, hold_s, max_tokens), kinds))
    answers = Counter(_status_of(s) for s in seen)
    stalled = Counter(
        "open at the end" if "still open" in s else "closed by the server" if "closed by the server" in s else "other"
        for k, s in zip(kinds, seen, strict=True)
        if k in STALLED
    )
    return {
        "answers": answers,
        "cases": len(kinds),
        "stalled": dict(stalled),
        "outcomes": dict(Counter(f"{k}: {s}" for k, s in zip(kinds, seen, strict=True))),
    }


#: The kinds of :func:`slow_loris` connection that stall while sending their request.
STALLED = ("dribble-headers", "body-never-sent", "silent")


def _status_of(seen: str) -> str:
    """The status code in a first line the server sent, else what became of the connection."""
    match = re.search(r"HTTP/1\.[01] (\d{3})", seen)
    if match:
        return match.group(1)
    return {"left": "client left", "still": "open at the end", "closed": "closed by the server"}[seen.split(" ")[0]]


# --------------------------------------------------------------------------- floods of reads during load


def flood(dep: Target, seconds: float = 15.0, readers: int = 16, concurrency: int = 4) -> dict:
    """``readers`` threads scraping ``/metrics`` and ``/health`` and reading ``/admin`` as fast as they can while a
    closed-loop client load (``concurrency``) runs: answers of the reads, and the load's own failures (lost)."""
    from harness.load import BackgroundLoad

    paths = [
        "/metrics",
        "/health",
        "/admin/thresholds",
        "/admin/history?limit=50",
        "/admin/estimates",
        "/admin/routing",
    ]
    answers: Counter = Counter()
    lock = threading.Lock()
    stop = threading.Event()

    def reader(i: int) -> None:
        with httpx.Client(base_url=dep.base_url, timeout=60) as client:
            j = i
            while not stop.is_set():
                path = paths[j % len(paths)]
                j += 1
                try:
                    status = client.get(
                        path, headers=dep.admin_headers if path.startswith("/admin") else {}
                    ).status_code
                except httpx.HTTPError as exc:
                    status = type(exc).__name__
                with lock:
                    answers[status] += 1

    with BackgroundLoad(dep, duration_s=seconds, concurrency=concurrency, max_tokens=8) as load:
        threads = [threading.Thread(target=reader, args=(i,), daemon=True) for i in range(readers)]
        for t in threads:
            t.start()
        time.sleep(seconds)
        stop.set()
        for t in threads:
            t.join()
    result = load.join()
    return {"answers": answers, "reads_per_s": round(sum(answers.values()) / seconds), "load": result.summary(),
            "lost": len(result.failed)}  # fmt: skip


def busiest_replica_pid(cluster: Cluster, replicas: int) -> int:
    """The process of the model replica running the most requests (its actor's)."""
    status = cluster.replica_status(replicas, timeout_s=10.0)
    victim = max(sorted(status), key=lambda rid: status[rid]["running"])
    return cluster.actor_pid(cluster.replica_actors()[victim])


@contextlib.contextmanager
def engine_stopped(root: int) -> Iterator[list[int]]:
    """SIGSTOP the vLLM engine processes under ``root`` (the engine core and its workers: children of a model
    replica's actor process, or of ``vllm serve``) for the block; SIGCONT always follows. Yields the stopped pids."""
    import os
    import signal

    pids = [p.pid for p in process_tree(root)[1:] if re.search(r"EngineCore|VLLM::", " ".join(_cmdline(p)))]
    pids = pids or [root]  # an in-process engine: the replica itself wedges
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield pids
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def _cmdline(proc: object) -> list[str]:
    import psutil

    try:
        return proc.cmdline()  # type: ignore[attr-defined]
    except psutil.Error:
        return []
