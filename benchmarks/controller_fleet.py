"""A synthetic fleet for the controller benchmark, and the measurements made on it.

One measurement round (:func:`measure`) builds a fleet of simulated replicas, warms the
controller up to a steady state (full step windows, an estimate, plans), then times:

* ``update``: one estimator update + one plan on a window of 500 lengths;
* ``recompute``: ``FleetController.recompute`` for the whole fleet, after every replica
  pushed one batch since the previous one (all of them have new data: the worst case);
* ``ingest``: saturated ingestion through ``ControllerActor.ingest`` (msgpack bytes in,
  thresholds out) with the periodic re-plans the actor schedules, persistence included;
* ``latency``: open-loop pushes (Poisson, at the rate of a busy fleet) while the harness asks
  for a fleet recompute every ``recompute_every_s``: each push's latency from its scheduled
  arrival to its reply, split by whether a recompute was running when it arrived, and in two
  parts: the *wait*, from the arrival until the event loop starts the push (the loop's thread
  waking and taking the interpreter lock: what a worker thread's re-plan can delay), and the
  *handling*, from there to the reply (what the actor does with the push);
* ``lock_free_latency`` (``--lock-free``, the current layout only): the same, with each recompute
  a sleep as long as the real ones took that holds no interpreter lock - a control for what
  the round's work costs the loop by sharing the process, apart from the round's structure;
* ``busy_latency`` (``--busy-elsewhere``, the current layout only): the same, with each recompute as
  long spent by *another process* spinning on a CPU (at the lowest priority), while the worker thread
  waits holding no lock - what a re-plan that shares only the machine with the actor costs a push;
* ``snapshot``, last: the whole fleet pickled, what a re-plan in another process fed a snapshot
  would cost the owner at every re-plan.

The actor runs in-process on one asyncio event loop, as a Ray async actor runs its methods:
they interleave only where one awaits, so what blocks the loop here blocks it under Ray too
(Ray's own RPC cost comes on top, and is the same for every version measured).

This module uses only what the controller offered before the fleet-scale work too
(``FleetController.register/ingest/recompute``, ``ControllerActor.ingest/recompute``), so
``controller_bench`` runs it, by path, under the interpreter of an older checkout as the
baseline.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import inspect
import multiprocessing
import os
import pickle
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np

from ebplus.controller import fleet as fleet_module
from ebplus.controller.actor import ControllerActor
from ebplus.controller.config import ControllerConfig, PlannerConfig
from ebplus.controller.cost_model import CostModel
from ebplus.controller.estimator import WorkloadEstimator
from ebplus.controller.fleet import FleetController
from ebplus.controller.messages import (
    CompletionRecord,
    EngineFacts,
    FinishReason,
    Mode,
    Registration,
    RunningRequest,
    StepRecord,
    TelemetryBatch,
    encode,
)
from ebplus.controller.planner import ThresholdPlanner

try:
    from ebplus.simulator import distributions as dist
except ModuleNotFoundError:  # a baseline checkout older than the simulator's own package (--baseline)
    from ebplus.bench import distributions as dist  # type: ignore[no-redef]

#: The busy control's spinner runs at the lowest priority: what it costs a push is then not the guest
#: scheduler preferring it to the actor's thread.
SPINNER_NICE = 19
H200 = CostModel(
    alpha_p=1.2786e-3, beta_p=2.4853e-5, alpha_d=8.921e-3, beta_d=4.586e-5, beta_mb=(2.494e-5, 5.193e-5, 1.478e-5)
)


@dataclass(frozen=True)
class FleetShape:
    """What the simulated fleet sends.

    Attributes:
        replicas: replicas registered with the controller.
        completions: completion records per push.
        steps: step records per push.
        running: running requests reported per push (an evenly spaced sample; the estimator
            weighs it up to ``concurrency``).
        concurrency: requests each replica runs.
        warm_steps: step records per kind each replica sends while warming up (the cost
            fitter keeps 2048 per kind: a long-running replica's windows are full).
    """

    replicas: int = 256
    completions: int = 64
    steps: int = 64
    running: int = 64
    concurrency: int = 256
    warm_steps: int = 2048


#: The threshold version every simulated replica reports running: the latest, always (so the controller
#: attributes each push's steps to a mode, the closed loop's per-step work, as for replicas that keep up).
APPLIED = 1 << 40


def _percentiles(samples: list[float]) -> dict[str, float]:
    ms = sorted(s * 1e3 for s in samples)
    if not ms:
        return {"n": 0}
    return {
        "n": len(ms),
        "median_ms": statistics.median(ms),
        "p99_ms": ms[min(len(ms) - 1, int(0.99 * len(ms)))],
        "max_ms": ms[-1],
    }


class Telemetry:
    """What each simulated replica reports: its own request stream, steps, and a sample of what it runs.

    Every replica keeps ``concurrency`` requests running (geometric outputs of mean 256 tokens,
    prompts 512 +- 50%), admitted in order; between two pushes the ``completions`` closest to
    their end finish and as many are admitted. Requests finish out of admission order, as on a
    real engine, so the estimator's admission-ordered windows see old long-running requests as
    well as young ones. A push reports an evenly spaced sample of ``running`` of them.
    """

    def __init__(self, shape: FleetShape, seed: int) -> None:
        self.shape = shape
        self.rng = np.random.default_rng(seed)
        c = shape.concurrency
        self.seq = np.tile(np.arange(c, dtype=np.int64), (shape.replicas, 1))
        self.length = dist.geometric(self.rng, 256, shape.replicas * c).reshape(shape.replicas, c)
        self.age = (self.rng.random((shape.replicas, c)) * self.length).astype(np.int64)
        self.prompt = dist.uniform_jitter(self.rng, 512, 0.5, shape.replicas * c).reshape(shape.replicas, c)
        self.next_seq = [c] * shape.replicas
        self.pushes = 0

    def advance(self, replica: int) -> tuple[list[CompletionRecord], list[RunningRequest]]:
        """Run ``replica`` until ``completions`` requests finish: those, and the running sample after."""
        n, rng = self.shape.completions, self.rng
        seq, length, age, prompt = self.seq[replica], self.length[replica], self.age[replica], self.prompt[replica]
        left = length - age
        done = np.argsort(left, kind="stable")[:n]  # in the order they finish
        age += int(left[done[-1]])
        comps = [
            CompletionRecord(i, o, FinishReason.STOP, q)
            for i, o, q in zip(prompt[done].tolist(), length[done].tolist(), seq[done].tolist(), strict=True)
        ]
        first = self.next_seq[replica]
        self.next_seq[replica] = first + n
        seq[done] = np.arange(first, first + n)
        length[done] = dist.geometric(rng, 256, n)
        prompt[done] = dist.uniform_jitter(rng, 512, 0.5, n)
        age[done] = 0
        order = np.argsort(seq)
        pick = order[np.linspace(0, order.size - 1, min(self.shape.running, order.size)).astype(np.int64)]
        running = [
            RunningRequest(seq=q, input_len=i, age=a)
            for q, i, a in zip(seq[pick].tolist(), prompt[pick].tolist(), age[pick].tolist(), strict=True)
        ]
        return comps, running

    def steps(self, kinds: np.ndarray) -> list[StepRecord]:
        """Steps of the given kinds (0 prefill only, 1 mixed, else decode only), timed by the H200 model with noise."""
        rng, n = self.rng, kinds.size
        running = rng.integers(200, 1024, n)
        prompt = rng.integers(256, 8192, n)
        p = np.where(kinds <= 1, prompt, 0)
        d = np.where(kinds >= 1, running, 0)
        seconds = [H200.step_seconds(int(a), int(b)) for a, b in zip(p.tolist(), d.tolist(), strict=True)]
        noisy = (np.asarray(seconds) * rng.lognormal(0.0, 0.05, n)).tolist()
        return [
            StepRecord(a, b, c, 300, s)
            for a, b, c, s in zip(p.tolist(), d.tolist(), running.tolist(), noisy, strict=True)
        ]

    def batch(self, replica: int, warm_kind: int | None = None) -> TelemetryBatch:
        """The next push of ``replica``: a realistic step mix (1/8 prefill, 1/8 mixed, the rest decode),
        or, while warming up, steps of one kind only (``warm_kind``) and nothing else, to fill that window fast."""
        shape = self.shape
        self.pushes += 1
        if warm_kind is not None:
            steps = self.steps(np.full(shape.steps, warm_kind))
            return TelemetryBatch(replica_id=f"replica-{replica}", steps=steps)
        comps, running = self.advance(replica)
        return TelemetryBatch(
            replica_id=f"replica-{replica}",
            completions=comps,
            steps=self.steps(np.arange(shape.steps) % 8),
            running=running,
            running_total=shape.concurrency,
            applied_version=APPLIED,
        )


#: This checkout's ``FleetController.ingest`` takes the wire form (a baseline checkout's may take the batch itself).
_WIRE_INGEST = "payload" in inspect.signature(FleetController.ingest).parameters


def _push(fc: FleetController, batch: TelemetryBatch) -> None:
    fc.ingest(encode(batch) if _WIRE_INGEST else batch)  # type: ignore[arg-type]


def register_fleet(fc: FleetController, replicas: int) -> None:
    facts = EngineFacts(kv_capacity_tokens=2_000_000, max_num_seqs=1024, device="H200")
    for r in range(replicas):
        fc.register(Registration(replica_id=f"replica-{r}", mode=Mode.AUTO, facts=facts, prior=H200))


def warm_fleet(shape: FleetShape, seed: int, state_dir: str | None = None) -> tuple[FleetController, Telemetry]:
    """A controller in steady state: every replica's step windows full, one estimate, every replica planned.

    Warming up happens with no periodic update due (``first_update`` out of reach); after
    one manual recompute the configured ``update_every`` (100) applies.
    """
    config = ControllerConfig(first_update=10**9, state_dir=state_dir)
    fc = FleetController(config)
    register_fleet(fc, shape.replicas)
    tel = Telemetry(shape, seed)
    per_kind = max(1, shape.warm_steps // shape.steps)
    for kind in (0, 1, 2):
        for _ in range(per_kind):
            for r in range(shape.replicas):
                _push(fc, tel.batch(r, warm_kind=kind))
    for _ in range(4):  # finished and running requests in every replica's window
        for r in range(shape.replicas):
            _push(fc, tel.batch(r))
    fc.recompute("warm")
    return fc, tel


def bench_update(repeats: int, seed: int = 0) -> dict[str, float]:
    """Estimator update + plan on a full window of 500 linear-hazard lengths (what one replica does every M)."""
    rng = np.random.default_rng(seed)
    est = WorkloadEstimator(window=500, update_every=100, min_samples=30)
    planner = ThresholdPlanner(PlannerConfig(max_num_seqs=1024))
    outputs = dist.linear_hazard(rng, 0.004, 1e-5, 500 + repeats * 100)
    inputs = dist.uniform_jitter(rng, 512, 0.5, outputs.size)

    def observe(lo: int, hi: int) -> None:
        for i, o in zip(inputs[lo:hi].tolist(), outputs[lo:hi].tolist(), strict=True):
            est.observe(CompletionRecord(i, o, FinishReason.STOP))

    observe(0, 500)
    samples = []
    for i in range(repeats):
        observe(500 + i * 100, 600 + i * 100)
        t0 = time.perf_counter()
        e = est.update()
        planner.plan(e, H200, kv_capacity_tokens=2_000_000, n_obs=1500)
        samples.append(time.perf_counter() - t0)
    return _percentiles(samples)


def _no_periodic_updates(fc: FleetController) -> None:
    """Only the harness re-plans from here on: no periodic update, no concurrency-triggered re-plan."""
    fc.config = fc.config.model_copy(update={"replan_concurrency": None})
    fc.workload.update_every = 10**9


def bench_recompute(fc: FleetController, tel: Telemetry, repeats: int) -> dict[str, float]:
    """One full recompute after every replica pushed once since the previous one (all have new data)."""
    config, every = fc.config, fc.workload.update_every
    _no_periodic_updates(fc)
    samples = []
    for _ in range(repeats):
        for r in range(tel.shape.replicas):
            _push(fc, tel.batch(r))
        t0 = time.perf_counter()
        fc.recompute("bench")
        samples.append(time.perf_counter() - t0)
    fc.config, fc.workload.update_every = config, every
    return _percentiles(samples)


def bench_snapshot(fc: FleetController, repeats: int = 3) -> dict[str, float]:
    """The whole fleet pickled: what feeding a re-plan in another process a snapshot would cost the
    process that owns the fleet (with the interpreter lock held), each time it re-plans."""
    samples, size = [], 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        size = len(pickle.dumps(fc, protocol=pickle.HIGHEST_PROTOCOL))
        samples.append(time.perf_counter() - t0)
    return {**_percentiles(samples), "mb": size / 1e6}


def _actor(fc: FleetController) -> ControllerActor:
    """The actor around an already warm fleet (its state directory is the fleet's config's)."""
    actor = ControllerActor(fc.config, housekeeping=False)
    actor.fleet = fc
    actor._persisted_version = -1  # the first new version is persisted, as in service
    return actor


async def _idle(actor: ControllerActor) -> None:
    """Let background work the actor started (if it does) finish: one yield at a time."""
    for _ in range(100_000):
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        if not tasks:
            return
        await asyncio.sleep(0.001)


async def _ingest(actor: ControllerActor, payloads: list[bytes], seconds: float, outstanding: int) -> dict:
    fc = actor.fleet
    before = (fc.received["completions"], fc.updates)
    queue = iter(payloads)
    sent = 0
    start = time.perf_counter()
    deadline = start + seconds

    async def worker() -> None:
        nonlocal sent
        for payload in queue:
            if time.perf_counter() > deadline:
                return
            await actor.ingest(payload)
            sent += 1
            await asyncio.sleep(0)  # one push per turn of the loop, as separate Ray calls arrive

    await asyncio.gather(*(worker() for _ in range(outstanding)))
    elapsed = time.perf_counter() - start
    await _idle(actor)
    completions = fc.received["completions"] - before[0]
    return {
        "completions_per_s": completions / elapsed,
        "pushes": sent,
        "seconds": elapsed,
        "updates": fc.updates - before[1],
        "updates_per_s": (fc.updates - before[1]) / elapsed,
    }


def bench_ingest(fc: FleetController, tel: Telemetry, seconds: float, outstanding: int = 8) -> dict:
    """Saturated pushes through the actor for ``seconds`` (payloads pre-encoded: encoding is the replica's cost)."""
    shape = tel.shape
    count = max(shape.replicas, int(seconds * 2000))  # up to 2000 pushes/s: more than any version here takes
    payloads = [encode(tel.batch(i % shape.replicas)) for i in range(count)]
    actor = _actor(fc)
    return asyncio.run(_ingest(actor, payloads, seconds, outstanding))


async def _latency(
    actor: ControllerActor, payloads: list[bytes], rate: float, recompute_every_s: float, seed: int
) -> dict:
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, len(payloads))).tolist()
    loop = asyncio.get_running_loop()
    t0 = loop.time() + 0.05
    spans: list[tuple[float, float]] = []  # (start, end) of each recompute, loop time
    lat: list[tuple[float, float, float]] = []  # (arrival, latency, wait until the push started)
    stop = False

    async def recomputer() -> None:
        while not stop:
            await asyncio.sleep(recompute_every_s)
            if stop:
                return
            start = loop.time()
            await actor.recompute()
            spans.append((start, loop.time()))

    async def push(at: float, payload: bytes) -> None:
        started = loop.time()
        await actor.ingest(payload)
        lat.append((at, loop.time() - at, started - at))

    rec = asyncio.ensure_future(recomputer())
    tasks = []
    for offset, payload in zip(arrivals, payloads, strict=True):
        at = t0 + offset
        delay = at - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(push(at, payload)))
    await asyncio.gather(*tasks)
    stop = True
    await rec

    def during(at: float) -> bool:
        return any(s <= at <= e for s, e in spans)

    windows: dict[str, list[tuple[float, float, float]]] = {"idle": [], "during_recompute": []}
    for push in lat:
        windows["during_recompute" if during(push[0]) else "idle"].append(push)
    return {
        "rate_per_s": rate,
        **{name: _percentiles([total for _, total, _ in pushes]) for name, pushes in windows.items()},
        "wait": {name: _percentiles([wait for _, _, wait in pushes]) for name, pushes in windows.items()},
        "handling": {name: _percentiles([t - w for _, t, w in pushes]) for name, pushes in windows.items()},
        "recomputes": _percentiles([e - s for s, e in spans]),
    }


def bench_latency(fc: FleetController, tel: Telemetry, seconds: float, rate: float, recompute_every_s: float,
                  lock_free_s: float | None = None, busy_s: float | None = None) -> dict:  # fmt: skip
    """Open-loop pushes at ``rate``/s while a fleet recompute is asked for every ``recompute_every_s``.

    Only the harness triggers recomputes here (periodic updates and concurrency re-plans
    off), so both versions re-plan equally often.

    With ``lock_free_s``, each recompute is a wait of that long that holds no interpreter lock
    and changes nothing (:func:`_lock_free_recomputes`): the round is held and published as
    usual, but its work costs this process nothing. With ``busy_s``, each is that long of a CPU
    kept busy by another process (:func:`_busy_elsewhere_recomputes`).
    """
    _no_periodic_updates(fc)
    shape = tel.shape
    payloads = [encode(tel.batch(i % shape.replicas)) for i in range(int(seconds * rate))]
    actor = _actor(fc)
    control: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if lock_free_s is not None:
        control = _lock_free_recomputes(fc, lock_free_s)
    elif busy_s is not None:
        control = _busy_elsewhere_recomputes(fc, busy_s)
    with control:
        return asyncio.run(_latency(actor, payloads, rate, recompute_every_s, seed=7))


@contextlib.contextmanager
def _substituted_recomputes(fc: FleetController, work: Callable[[], object]) -> Iterator[None]:
    """``fc.recompute`` replaced by ``work``, which changes nothing: the pushes are still held and the round
    published, but nothing is re-planned. The fleet's own ``recompute`` is back afterwards."""

    def recompute(cause: str = "manual") -> int:
        work()
        return fc.version

    fc.recompute = recompute  # type: ignore[method-assign]
    try:
        yield
    finally:
        del fc.recompute


def _lock_free_recomputes(fc: FleetController, seconds: float) -> contextlib.AbstractContextManager[None]:
    """Each recompute a sleep of ``seconds``: what a push would wait if the re-plan ran in another process at
    no cost to this one, and at no cost to the machine.

    The control separates the latency the round's *structure* adds (held telemetry, the round's
    hand-over on the loop) from what its work adds. Only the current layout runs its re-plan through
    ``fc.recompute`` in a worker round, so only it is measured this way (and by the busy control).
    """
    return _substituted_recomputes(fc, functools.partial(time.sleep, seconds))


def _spin(conn: Connection) -> None:
    """The busy control's other process, at the lowest priority: for each duration it receives, a pure Python
    spin that long (no I/O, no memory traffic to speak of), then an answer."""
    with contextlib.suppress(OSError, AttributeError):  # AttributeError: no os.nice (not POSIX)
        os.nice(SPINNER_NICE)
    while (seconds := conn.recv()) is not None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass
        conn.send(True)


@contextlib.contextmanager
def _busy_elsewhere_recomputes(fc: FleetController, seconds: float) -> Iterator[None]:
    """Each recompute ``seconds`` of a CPU kept busy by *another process* (:func:`_spin`), while the worker
    thread waits for it holding no interpreter lock: what a re-plan that shares nothing with the actor's
    process but the machine costs a push (no lock, no copies, no messages but one each way)."""
    context = multiprocessing.get_context("spawn")  # not fork: this process has threads
    ours, theirs = context.Pipe()
    spinner = context.Process(target=_spin, args=(theirs,), daemon=True, name="ebplus-bench-spinner")
    spinner.start()

    def busy() -> None:
        ours.send(seconds)
        ours.recv()

    try:
        with _substituted_recomputes(fc, busy):
            yield
    finally:
        ours.send(None)
        spinner.join(10)


def measure(shape: FleetShape, seed: int, ingest_s: float, latency_s: float, rate: float, recompute_every_s: float,
            recompute_repeats: int, lock_free: bool = False, busy_elsewhere: bool = False) -> dict:  # fmt: skip
    """One round of every measurement on a freshly warmed fleet (persistence to a temporary directory).

    With ``lock_free``, the latency is measured again with recomputes that hold no interpreter lock,
    each as long as the real ones took in service (``lock_free_latency``); with ``busy_elsewhere``, again
    with each recompute as long spent busy in another process (``busy_latency``)."""
    with tempfile.TemporaryDirectory(prefix="ebplus-bench-") as state_dir:
        started = time.perf_counter()
        fc, tel = warm_fleet(shape, seed, state_dir)
        warm_s = time.perf_counter() - started
        # what the controller's Ray actor does at start (ControllerActor under Ray, from the
        # fleet-scale change on), done here for every version measured alike
        gc.collect()
        gc.freeze()
        out = {
            "code": str(Path(fleet_module.__file__).resolve().parents[1]),  # which checkout was measured
            "shape": dict(shape.__dict__),
            "warm_s": warm_s,
            "update": bench_update(100, seed),
            "recompute": bench_recompute(fc, tel, recompute_repeats),
        }
        out["ingest"] = bench_ingest(fc, tel, ingest_s)
        out["latency"] = bench_latency(fc, tel, latency_s, rate, recompute_every_s)
        held_s = out["latency"]["recomputes"]["median_ms"] / 1e3  # each control's round, as long as the real ones
        if lock_free:
            out["lock_free_latency"] = bench_latency(fc, tel, latency_s, rate, recompute_every_s, lock_free_s=held_s)
        if busy_elsewhere:
            out["busy_latency"] = bench_latency(fc, tel, latency_s, rate, recompute_every_s, busy_s=held_s)
        out["snapshot"] = bench_snapshot(fc)  # last: its ~100 MB of garbage must not touch the timings above
    return out


def main(argv: list[str] | None = None) -> int:
    """One round, as a worker process of ``controller_bench``: prints one JSON object."""
    import argparse
    import json

    parser = argparse.ArgumentParser(description="one round of the controller benchmark (a worker)")
    parser.add_argument("--replicas", type=int, default=256)
    parser.add_argument("--running", type=int, default=64)
    parser.add_argument("--warm-steps", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ingest-s", type=float, default=5.0)
    parser.add_argument("--latency-s", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--recompute-every-s", type=float, default=0.3)
    parser.add_argument("--recompute-repeats", type=int, default=5)
    control = "measure the latency again with recomputes that hold no interpreter lock (a control)"
    parser.add_argument("--lock-free", action="store_true", help=control)
    busy = "measure it again with each recompute as long spent busy in another process (a control)"
    parser.add_argument("--busy-elsewhere", action="store_true", help=busy)
    args = parser.parse_args(argv)
    shape = FleetShape(replicas=args.replicas, running=args.running, warm_steps=args.warm_steps)
    out = measure(shape, args.seed, args.ingest_s, args.latency_s, args.rate, args.recompute_every_s,
                  args.recompute_repeats, args.lock_free, args.busy_elsewhere)  # fmt: skip
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
