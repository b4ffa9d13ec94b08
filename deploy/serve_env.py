"""Ray Serve's own settings for the Ray cluster ``ebplus serve`` starts: its throughput mode and HAProxy
(and Ray's node health checks, :data:`NODE_HEALTH_ENV`, which only the chart sets: a multi-node cluster's).

Ray Serve reads these from the environment of its processes (the Serve controller,
the proxies, every replica), so they are set in the driver before it starts the local
Ray cluster, which every Ray process inherits. A variable already set in the
environment wins, so each one can be turned back (``RAY_SERVE_ENABLE_HA_PROXY=0
ebplus serve ...``). A cluster ``ebplus serve`` joins (``ray.address``, KubeRay) keeps
the environment its pods were started with.

Why (measured with ``ebplus bench overhead``, docs/benchmarks/overhead.md): on the
2-core CPU deployment every CPU second the serving plane spends is taken from the
engine. With Ray Serve's defaults each streamed chunk crosses the Python HTTP proxy
and two replica event loops in threads of their own; these settings halve the serving
plane's CPU per output token (2.0 -> 0.93 CPU-s per 1,000 output tokens with HAProxy, with Ray
Serve LLM's own app as the baseline), and no behaviour of the API changes.

A client that leaves ends its work on the engine: Serve's proxy sees the disconnect and
cancels the request it made to the ingress replica, which cancels its own request to the model
replica, which aborts the engine's sequences. Between the proxy and the ingress that cancel
travels as the gRPC stream's own reset (``RAY_SERVE_PROXY_USE_GRPC``). Measured with the
reliability tier's abandoned-clients probe (``harness.hostile.scenario_abandoned``, 4 clients
of 16 sequences each): with the proxy on Ray actor calls, 7 of 26 runs left one or two requests
generated in full for nobody, once a stream whose client had left on time; with gRPC, 2 of 24,
both runs where the probe's clients themselves left seconds late, none of the 15 where they left
before the answer could be done (docs/benchmarks/overhead.md).

Throughput mode makes each ingress replica serve HTTP itself ("direct ingress"), and Ray holds
a stopping one open for 30 s so that a load balancer in front of it can deregister it. On
Kubernetes that wait is kept (the chart sets :data:`SERVE_ENV` only); on the cluster
``ebplus serve`` starts nothing stands in front, and :data:`LOCAL_ENV` cuts it to a second
(an idle stop took 37 s, 30 of them that wait).

HAProxy (``RAY_SERVE_ENABLE_HA_PROXY=1``) is off. In front of the ingress replica it saves
Ray Serve's Python proxy about 0.8 CPU-s per 1,000 output tokens on this machine, with no
throughput difference to measure (3 rounds: 1.07, 0.94-1.10, docs/benchmarks/overhead.md);
what it costs instead: a client that gives up on a non-streamed request does not end the
work (HAProxy does not pass the client's abort on, so Serve never sees the disconnect and the
engine generates the whole answer for nobody), two more listeners on every interface, and an
admin socket. An operator who wants it sets the variable; then:

HAProxy adds two listening ports on every interface, its stats page and its metrics, which
Ray Serve fixes at 8404 and 9101: a second ``ebplus serve`` on the host, or an HAProxy a killed
deployment left behind, made the next start fail (``cannot bind socket ... 0.0.0.0:9101``, the
e2e tier's second deployment). Unless ``RAY_SERVE_HAPROXY_STATS_PORT`` /
``RAY_SERVE_HAPROXY_METRICS_PORT`` are set, each start takes free ports for them. Ray 2.60's
template binds both on every interface (``bind *:``), with no setting to change it.

HAProxy's files are private to the deployment. Ray Serve puts its admin socket (``mode 666
level admin``: any local user could redirect traffic, ``Authorization`` headers included), its
config and its server state under ``/tmp/haproxy-serve``, shared by every deployment and left
behind by each. Each start makes a directory of its own (mode 0700, so the socket inside is
out of other users' reach) and points Ray's path settings there; :func:`cleanup`, at the stop,
ends any HAProxy still running from it (Ray lets an old one drain for ``hard-stop-after``;
one held by an abandoned request once outlived ``make serve`` and its port) and removes it.
HAProxy's client timeout drops from Ray's 3,600 s to Ray Serve LLM's own request timeout.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import MutableMapping
from pathlib import Path

#: Ray's health checks of its nodes (the GCS asks every raylet; these are read on the head). Until
#: a lost node is declared dead, a request held by an actor there (the ingress replica under the
#: default placement, where it may share a worker with a model replica) gets neither an answer
#: nor an error: Serve's proxies wait on it, and Serve starts no replacement. Ray's defaults (a
#: check every 3 s, 10 s to answer, 5 failures) took 13.5 s on a node whose processes are gone
#: (measured, docs/benchmarks/scaleout.md) and allow 65 s for one that went silent (a machine off
#: the network), too long for the 30 s a request in flight is given to end. These: 7.2 s measured,
#: 20 s at most for a silent node (5 checks 1 s apart, 3 s to answer); a raylet must leave 5
#: checks in a row unanswered (15 s and more) to be declared dead.
#: Part of SERVE_ENV, so the chart renders them; :func:`apply` leaves them out: the cluster
#: ``ebplus serve`` starts has one node, which no check can lose, and its GCS keeps Ray's.
NODE_HEALTH_ENV: dict[str, str] = {
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "3000",
    "RAY_health_check_failure_threshold": "5",
}

#: Variable -> value; see the module docstring for how they are applied.
SERVE_ENV: dict[str, str] = {
    # Ray Serve's throughput mode: replicas run user code and request routing on their main
    # event loop (no thread hop per chunk), replicas call each other over gRPC, ingress replicas
    # serve HTTP themselves, access logs are buffered.
    "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
    # Serve's proxy reaches the ingress replica over gRPC too. Throughput mode turns gRPC on for
    # replica-to-replica calls only: Ray 2.60 reads the proxy's setting before that mode sets its
    # default, so the proxy made Ray actor calls and cancelled a stream its client left with
    # ray.cancel, which now and then never reached the ingress replica while it was seconds behind
    # relaying the stream; the engine then generated the rest for nobody (see the module docstring).
    "RAY_SERVE_PROXY_USE_GRPC": "1",
    # HAProxy (the binary ships with ray[serve]) stays off: see the module docstring.
    "RAY_SERVE_ENABLE_HA_PROXY": "0",
    # The Serve controller reconciles once a second instead of ten times; replica health checks
    # keep their own period.
    "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "1",
    # Serve's metrics are exported from their cache once a second (default 100 ms).
    "RAY_SERVE_METRICS_EXPORT_INTERVAL_MS": "1000",
    # How soon Ray declares a lost node dead (read by the GCS, on the head): see NODE_HEALTH_ENV.
    **NODE_HEALTH_ENV,
}

#: Only for the cluster ``ebplus serve`` starts (the chart's pods keep Ray's value, see the
#: module docstring).
LOCAL_ENV: dict[str, str] = {
    # An ingress replica that stops keeps serving this long so that load balancers in front of
    # it deregister it (Ray: 30 s). Nothing stands in front of a local deployment: every stop
    # waited the 30 s for nobody. In-flight requests are still waited for.
    "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "1",
}


#: HAProxy's own listeners, fixed by Ray Serve unless set (see the module docstring).
HAPROXY_PORTS = ("RAY_SERVE_HAPROXY_STATS_PORT", "RAY_SERVE_HAPROXY_METRICS_PORT")

#: Ray Serve's HAProxy path settings -> the name in the deployment's private directory ("": the directory).
HAPROXY_PATHS = {
    "RAY_SERVE_HAPROXY_SOCKET_PATH": "admin.sock",
    "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH": "metrics.sock",
    "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": "haproxy.cfg",
    "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": "",
    "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": "server-state",
}

#: HAProxy limits (seconds): a client idle this long is dropped (Ray: 3,600; Ray Serve LLM ends any
#: request at 600 anyway), and an old HAProxy drains its connections this long after a reload or stop
#: (Ray: 120).
HAPROXY_LIMITS = {"RAY_SERVE_HAPROXY_TIMEOUT_CLIENT_S": "600", "RAY_SERVE_HAPROXY_HARD_STOP_AFTER_S": "10"}

#: Set by :func:`apply` to the private directory it made (read by :func:`cleanup`).
PRIVATE_DIR = "EBPLUS_HAPROXY_DIR"
PRIVATE_PREFIX = "ebplus-hap-"

#: HAProxy refuses a log socket path longer than this; Ray puts a 56-character node id between the
#: directory and the file name (``<dir>/<node id>/metrics.sock``).
HAPROXY_SOCKET_PATH_MAX = 97
NODE_ID_CHARS = 56


def free_port() -> int:
    """A TCP port free on every interface now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("0.0.0.0", 0))
        return int(sock.getsockname()[1])


def apply(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set :data:`SERVE_ENV` (but :data:`NODE_HEALTH_ENV`) and :data:`LOCAL_ENV` in ``environ`` (default
    ``os.environ``) where not set; returns what is in effect.

    With HAProxy on, its stats and metrics ports are set to free ones where not set.
    """
    environ = os.environ if environ is None else environ
    wanted = {**{k: v for k, v in SERVE_ENV.items() if k not in NODE_HEALTH_ENV}, **LOCAL_ENV}
    for key, value in wanted.items():
        environ.setdefault(key, value)
    applied = {key: environ[key] for key in wanted}
    if environ["RAY_SERVE_ENABLE_HA_PROXY"] == "1":
        for key in HAPROXY_PORTS:
            environ.setdefault(key, str(free_port()))
            applied[key] = environ[key]
        private = _private_dir()
        environ[PRIVATE_DIR] = applied[PRIVATE_DIR] = str(private)
        for key, name in {**HAPROXY_PATHS, **HAPROXY_LIMITS}.items():
            default = str(private / name) if key in HAPROXY_PATHS else name
            environ.setdefault(key, default)
            applied[key] = environ[key]
    return applied


def _private_dir() -> Path:
    """A new 0700 directory for HAProxy's files, in the temporary directory unless its path would make
    HAProxy's socket paths too long (then in ``/tmp``)."""
    longest = max(len(name) for name in HAPROXY_PATHS.values()) + NODE_ID_CHARS + 2
    base = tempfile.gettempdir()
    if len(base) + len(PRIVATE_PREFIX) + 9 + longest > HAPROXY_SOCKET_PATH_MAX:
        base = "/tmp"
    return Path(tempfile.mkdtemp(prefix=PRIVATE_PREFIX, dir=base))


def cleanup(environ: MutableMapping[str, str] | None = None) -> list[int]:
    """At the stop: end what still runs from :func:`apply`'s private directory and remove it.

    Returns the pids that had to be ended (an HAProxy that outlived Ray's shutdown).
    """
    environ = os.environ if environ is None else environ
    where = environ.pop(PRIVATE_DIR, None)
    if not where or not Path(where).name.startswith(PRIVATE_PREFIX):
        return []
    ended = _end_processes_using(where)
    shutil.rmtree(where, ignore_errors=True)
    return ended


def _end_processes_using(directory: str, grace_s: float = 2.0) -> list[int]:
    """SIGTERM, then after ``grace_s`` SIGKILL, every process of this user whose command line names ``directory``."""
    pids = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            mine = entry.stat().st_uid == os.getuid()
        except OSError:  # gone, or not ours to read
            continue
        if mine and int(entry.name) != os.getpid() and any(directory.encode() in arg for arg in argv):
            pids.append(int(entry.name))
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = [pid for pid in pids if _signal(pid, sig)]
        deadline = time.monotonic() + grace_s
        while alive and time.monotonic() < deadline:
            time.sleep(0.05)
            alive = [pid for pid in alive if _alive(pid)]
        if not alive:
            break
    return pids


def _signal(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def _alive(pid: int) -> bool:
    try:
        reaped, _ = os.waitpid(pid, os.WNOHANG)  # our own child: reap it, or it lingers as a zombie
        if reaped:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text(errors="replace").rsplit(")", 1)[-1].split()[:1]
    except OSError:
        return False
    return state != ["Z"]  # a zombie (another's child) is gone for our purpose
