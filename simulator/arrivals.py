"""When requests reach the simulated engine: open-loop arrival processes and the issuer that replays them.

Open loop (``rate``): arrival times do not depend on the engine, as with real
users. Two processes, both renewal processes with mean inter-arrival ``1/rate``:

* Poisson: exponential gaps (coefficient of variation 1);
* Gamma (``burst_cv``): gamma-distributed gaps with shape ``1/cv^2``. With
  ``cv > 1`` most gaps are far shorter than the mean and a few far longer, so
  requests come in bursts separated by lulls - the traffic a queue and the
  concurrency estimate ``N_obs`` react to. ``cv = 1`` is Poisson again, ``cv < 1``
  more regular than Poisson.

Closed loop (``concurrency``) and saturated phases depend on completions; the
:class:`Arrivals` issuer handles all three, phase by phase.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # workloads imports the offset generators above at run time
    from ebplus.simulator.workloads import Requests


def poisson_offsets(rng: np.random.Generator, rate: float, size: int) -> np.ndarray:
    """Arrival times (s, from 0) of ``size`` Poisson arrivals at ``rate`` per second."""
    return np.cumsum(rng.exponential(1.0 / rate, size=size))


def gamma_offsets(rng: np.random.Generator, rate: float, cv: float, size: int) -> np.ndarray:
    """Arrival times of a Gamma renewal process: mean gap ``1/rate``, gaps' coefficient of variation ``cv``.

    A gamma law with shape ``a`` has CV ``1/sqrt(a)``, so ``a = 1/cv^2`` and the
    scale follows from the mean: ``scale = cv^2 / rate``.
    """
    if not (rate > 0 and cv > 0):
        raise ValueError(f"need rate > 0 and cv > 0, got rate={rate}, cv={cv}")
    shape = 1.0 / (cv * cv)
    return np.cumsum(rng.gamma(shape, cv * cv / rate, size=size))


def open_loop_offsets(rng: np.random.Generator, rate: float, size: int, burst_cv: float | None = None) -> np.ndarray:
    """Poisson arrivals, or Gamma ones when ``burst_cv`` is given (see the module docstring)."""
    if burst_cv is None:
        return poisson_offsets(rng, rate, size)
    return gamma_offsets(rng, rate, burst_cv, size)


class Arrivals:
    """Issues a run's requests phase by phase: closed loop, open loop or saturated.

    The simulator calls :meth:`poll` after each step (completions already
    reported in ``inflight``) and :meth:`next_time` when it needs to know how far it
    may advance without missing an arrival.
    """

    def __init__(self, reqs: Requests) -> None:
        self.phases = reqs.phases
        self.drain = reqs.drain
        self.arrival_s = np.full(len(reqs), np.nan)
        self.phase_start: list[float] = []
        self.idx = -1  # current phase
        self.next = 0  # next request to issue
        self.inflight = 0
        self._start_phase(0.0)

    def _start_phase(self, now: float) -> None:
        self.idx += 1
        if self.idx < len(self.phases):
            self.phase_start.append(now)

    def poll(self, now: float) -> list[int]:
        """Requests that arrive by ``now`` (call after completions were reported)."""
        issued: list[int] = []
        while self.idx < len(self.phases):
            ph = self.phases[self.idx]
            if self.next >= ph.stop:
                if self.drain and self.inflight > 0:
                    break
                last = now if self.drain or ph.offsets_s is None else self.phase_start[-1] + float(ph.offsets_s[-1])
                self._start_phase(last)
                continue
            t0 = self.phase_start[-1]
            if ph.offsets_s is not None:
                offs = ph.offsets_s
                hi = ph.start + int(np.searchsorted(offs, now - t0, side="right"))
                if hi == self.next < ph.stop and t0 + float(offs[self.next - ph.start]) <= now:
                    hi += 1  # the one next_time() named: (t0 + offset) - t0 can round below the offset
                stop = min(ph.stop, hi)
                if stop <= self.next:
                    break
                rng = range(self.next, stop)
                self.arrival_s[self.next : stop] = t0 + offs[self.next - ph.start : stop - ph.start]
            else:
                room = ph.stop - self.next if ph.concurrency is None else ph.concurrency - self.inflight
                if room <= 0:
                    break
                stop = min(ph.stop, self.next + room)
                rng = range(self.next, stop)
                self.arrival_s[self.next : stop] = now
            issued.extend(rng)
            self.inflight += stop - self.next
            self.next = stop
        return issued

    def next_time(self) -> float | None:
        """When the next open-loop request arrives (None: arrivals wait on completions)."""
        if self.idx >= len(self.phases):
            return None
        ph = self.phases[self.idx]
        if ph.offsets_s is None or self.next >= ph.stop:
            return None
        return self.phase_start[-1] + float(ph.offsets_s[self.next - ph.start])
