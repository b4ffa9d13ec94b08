"""The fault probes of the hostile campaign (``make bench-hostile``): each returns what :func:`.campaign.measure`
takes (``answers`` plus its own figures). Every fault is real: a process killed or stopped, a file system full,
a state file overwritten, telemetry sent to the live controller actor.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
from factories import registration

from ebplus.controller.messages import CompletionRecord, FinishReason, TelemetryBatch, encode
from ebplus.controller.state_store import STATE_FILE, STATE_KEY
from harness.campaign import engine_stopped
from harness.cluster import Cluster
from harness.deployment import Deployment
from harness.faults import scenario_replica_kill
from harness.load import BackgroundLoad
from harness.plugin import PluginServer, restart_plugin_server, stop_plugin_server


def replica_kill(dep: Deployment, cluster: Cluster) -> dict:
    """SIGKILL the busiest model replica mid-stream (:func:`.faults.scenario_replica_kill`); lost: the non-streamed
    requests that failed despite the client's retries (broken streams are the fault's own, reported apart)."""
    out = scenario_replica_kill(dep, cluster)
    load = out["load"]
    return {"answers": load["http_attempts"], "cases": load["sent"], "lost": out["failed_non_streamed"],
            "streams_broken": out["failed_streams"], "silently_truncated": out["silently_truncated"],
            "replaced_and_registered_s": out["replaced_and_registered_s"]}  # fmt: skip


def engine_wedge(dep: Deployment | PluginServer, root: Callable[[], int], wedge_s: float = 10.0,
                 base_s: float = 4.0) -> dict:  # fmt: skip
    """SIGSTOP the engine under the process ``root()`` names (the busiest replica's, :func:`.campaign.busiest_replica_pid`,
    or ``vllm serve``'s) for ``wedge_s`` under load, then SIGCONT: what the clients saw."""
    with BackgroundLoad(dep, duration_s=base_s + wedge_s + base_s, concurrency=4, max_tokens=16, max_retries=2) as load:
        time.sleep(base_s)
        with engine_stopped(root()) as pids:
            time.sleep(wedge_s)
    result = load.join(timeout_s=600)
    return {"answers": result.summary()["http_attempts"], "cases": result.sent, "lost": len(result.failed),
            "stopped_pids": len(pids), "errors": result.summary()["errors"],
            "longest_request_s": result.longest_s()}  # fmt: skip


def _fill(directory: Path) -> Path:
    """Fill the file system of ``directory`` until a write fails with ENOSPC; returns the filler file (absent if
    the file system was full already)."""
    filler = directory / "filler"
    try:
        with open(filler, "wb") as fh:
            while True:
                fh.write(b"\0" * 4096)
                fh.flush()
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
    return filler


def disk_full(dep: Deployment | PluginServer, state_dir: Path, persist_error: Callable[[], str | None] | None = None,
              logs: list[Path] | None = None, load_s: float = 8.0) -> dict:  # fmt: skip
    """The controller's ``state_dir`` file system filled up under load, then freed: decisions go on and are said
    not persisted (``/admin/recompute`` answers ``persisted: false`` with the reason), the failure is logged once,
    no temporary file is left, and the state is persisted again once space is back. ``persist_error`` reads the
    controller's own report while the disk is full (``ebplus serve``: its snapshot; the plugin has none beyond the
    answer's message). The log lines are those written during the probe to ``logs`` (where the controller logs:
    :func:`controller_logs`; default ``dep.log_path``, the plugin's server)."""
    state = state_dir / STATE_FILE
    state_bytes = state.stat().st_size if state.exists() else 0
    logged = log_from(*(logs or [dep.log_path]))
    filler = _fill(state_dir)
    answers: Counter = Counter()
    try:
        with BackgroundLoad(dep, duration_s=load_s, concurrency=4, max_tokens=8) as load:
            time.sleep(load_s / 2)
            full = httpx.post(f"{dep.base_url}/admin/recompute", headers=dep.admin_headers, timeout=60)
        result = load.join()
        answers.update(result.summary()["http_attempts"])
        answers[full.status_code] += 1
        error = {} if persist_error is None else {"persist_error": persist_error()}
    finally:
        filler.unlink(missing_ok=True)
    freed = httpx.post(f"{dep.base_url}/admin/recompute", headers=dep.admin_headers, timeout=60)
    answers[freed.status_code] += 1
    lines = logged()
    return {"answers": answers, "lost": len(result.failed), "state_bytes": state_bytes, "while_full": _decision(full),
            **error, "after_freed": _decision(freed),
            "tmp_files_left": sorted(p.name for p in state_dir.glob(".controller-state.*")),
            "log_lines": {"not persisted": sum(NOT_PERSISTED in x for x in lines),
                          "persisted again": sum(PERSISTED_AGAIN in x for x in lines)},
            "logged": [x[-240:] for x in lines if NOT_PERSISTED in x or PERSISTED_AGAIN in x][:4]}  # fmt: skip


#: The controller's log lines when its store starts failing and when it recovers (:meth:`ControllerActor.persist`),
#: and when it sets a corrupt state aside (:meth:`StateStore.load`)
NOT_PERSISTED = "controller state not persisted"
PERSISTED_AGAIN = "controller state persisted again"
CORRUPT = "controller state is corrupt"

#: A state file cut short (what a crash mid-write of a non-atomic writer, or a damaged volume, leaves)
CUT_SHORT = b'{"schema_version": 3, "fleet": {"replic'


def log_from(*paths: Path) -> Callable[[], list[str]]:
    """The lines the files ``paths`` get from now on: call the result to read them."""
    offsets = {path: path.stat().st_size if path.exists() else 0 for path in paths}

    def lines() -> list[str]:
        out = []
        for path, offset in offsets.items():
            with open(path, "rb") as fh:
                fh.seek(offset)
                out += fh.read().decode(errors="replace").splitlines()
        return out

    return lines


def controller_logs(cluster: Cluster) -> list[Path]:
    """The controller actor's output in Ray's session logs (``worker-*-<pid>.out`` and ``.err``): ``ebplus serve``
    runs Ray with ``log_to_driver=False``, so its lines are there, not in the deployment's log."""
    return sorted(cluster.session_logs().glob(f"worker-*-{cluster.ping()['pid']}.*"))


def set_aside(state_dir: Path) -> list[str]:
    """The corrupt states the store moved aside in ``state_dir``."""
    return sorted(p.name for p in state_dir.glob("controller-state.corrupt-*"))


def _decision(r: httpx.Response) -> dict:
    body = r.json() if r.status_code == 200 else {}
    return {"status": r.status_code, "version": body.get("version"), "persisted": body.get("persisted"),
            "message": body.get("message")}  # fmt: skip


def corrupt_state(dep: Deployment, cluster: Cluster, state_dir: Path | None) -> dict:
    """The controller restarted onto a corrupt state (a file cut short: ``state_dir``'s file, else the Ray KV key):
    it must set the state aside, start cold and decide again. The controller is stopped while the state is
    overwritten, so it cannot write a good one over it before the kill."""
    from ray.experimental.internal_kv import _internal_kv_get, _internal_kv_put

    with cluster.controller_stopped() as pid:
        if state_dir is not None:
            (state_dir / STATE_FILE).write_bytes(CUT_SHORT)
        else:
            _internal_kv_put(STATE_KEY, CUT_SHORT, overwrite=True)
        os.kill(pid, signal.SIGKILL)  # a crash: Ray restarts the actor, which reads the state
    ping = cluster.wait_controller(timeout_s=120, pid_not=pid)
    if state_dir is not None:
        aside = set_aside(state_dir)
    else:
        aside = ["Ray internal KV"] if _internal_kv_get(STATE_KEY + b".corrupt") == CUT_SHORT else []
    replicas = dep.config.replicas.num_replicas
    t0 = time.monotonic()
    while len(cluster.snapshot()["replicas"]) < replicas and time.monotonic() - t0 < 60:
        time.sleep(0.5)
    return {"answers": {"restarted": 1}, "restored": ping["restored"], "set_aside": aside,
            "replicas_registered_again_s": round(time.monotonic() - t0, 1)}  # fmt: skip


def plugin_corrupt_state(srv: PluginServer, state_dir: Path) -> dict:
    """``vllm serve`` stopped (SIGTERM: the plugin persists its controller's state on the way out), the state
    file cut short, the server started again: one error line, the file set aside, a cold start (no "resumed"
    line), and serving again. ``srv`` is the restarted server afterwards."""
    stop_plugin_server(srv)
    state = state_dir / STATE_FILE
    state_bytes = state.stat().st_size if state.exists() else 0
    state.write_bytes(CUT_SHORT)
    t0 = time.monotonic()
    restart_plugin_server(srv, srv.log_path.with_name(f"vllm-restart-{int(time.time())}.log"))
    lines = srv.log_path.read_text(errors="replace").splitlines()
    resumed = [x for x in lines if "controller resumed" in x]
    return {"answers": {"restarted": 1}, "restored": bool(resumed), "state_bytes_before": state_bytes,
            "set_aside": set_aside(state_dir), "restart_s": round(time.monotonic() - t0, 1),
            "log_lines": {"corrupt": [x[-300:] for x in lines if CORRUPT in x], "resumed": len(resumed)}}  # fmt: skip


def cursor_jump(dep: Deployment, cluster: Cluster) -> dict:
    """A batch from a live replica id whose completions claim to start at index 2**61: rejected as
    ``cursor_jump`` and the replica's cursor stays (its next real batch is still counted)."""
    import ray

    rid = sorted(cluster.snapshot()["replicas"])[0]
    records = [CompletionRecord(12, 4, FinishReason.STOP) for _ in range(5)]
    jump = encode(TelemetryBatch(replica_id=rid, completions=records, completions_from=2**61))
    before = cluster.snapshot()["rejected"].get("cursor_jump", 0)
    reply = ray.get(cluster.controller().ingest.remote(jump), timeout=10)
    time.sleep(0.5)  # past the snapshot's time-to-live
    after = cluster.snapshot()["rejected"].get("cursor_jump", 0)
    return {"answers": {"thresholds" if reply is not None else "none": 1}, "rejected_cursor_jump": after - before}


def replica_churn(dep: Deployment, cluster: Cluster, ids: int = 1000, batch: int = 50) -> dict:
    """``ids`` replica ids that register, push one batch and leave, ``batch`` at a time: every call answered,
    and the controller ends with the replicas it had (no departed id kept)."""
    import ray

    ctl = cluster.controller()
    known = set(cluster.snapshot()["replicas"])
    answers: Counter = Counter()
    for start in range(0, ids, batch):
        names = [f"churn-{i}" for i in range(start, min(ids, start + batch))]
        regs = ray.get([ctl.register.remote(encode(registration(n, model=dep.model))) for n in names], timeout=60)
        records = [CompletionRecord(12, 4, FinishReason.STOP)]
        pushes = ray.get([ctl.ingest.remote(encode(TelemetryBatch(replica_id=n, completions=records, completions_from=0)))
                          for n in names], timeout=60)  # fmt: skip
        left = ray.get([ctl.leave.remote(n) for n in names], timeout=60)
        answers["registered" if all(r is not None for r in regs) else "refused"] += len(names)
        answers.update("answered" if p is not None else "unknown" for p in pushes)
        answers.update("left" if x else "not left" for x in left)
    time.sleep(0.5)
    remaining = set(cluster.snapshot()["replicas"])
    return {"answers": answers, "cases": ids, "churn_ids_kept": len(remaining - known),
            "replicas_kept": sorted(known & remaining) == sorted(known)}  # fmt: skip


#: The size of the state_dir file system of the disk-full probe: room for the state, filled on purpose
TMPFS_KIB = 8192


@contextlib.contextmanager
def tmpfs_or_none(path: Path) -> Iterator[str | None]:
    """A :data:`TMPFS_KIB` tmpfs mounted at ``path`` for the block (a file system that fills up for real); yields
    ``None``, or why none could be mounted (not root, no mount permission: ``path`` is then a plain directory)."""
    import subprocess

    path.mkdir(parents=True, exist_ok=True)
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_KIB}k", "tmpfs", str(path)], check=True,
                       capture_output=True, text=True)  # fmt: skip
    except (OSError, subprocess.CalledProcessError) as exc:
        yield f"no tmpfs could be mounted: {getattr(exc, 'stderr', '') or exc}".strip()
        return
    try:
        yield None
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)
