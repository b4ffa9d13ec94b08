"""Sending part of the telemetry, where one controller cannot take a whole fleet's: a known share, chosen so
that what the controller computes from it stays right.

A controller absorbs every record a replica sends (completions, steps, running
requests); at fleet scale that is the load that grows with the fleet. A replica
configured with a :class:`Sampling` below 1 sends a known share of it, chosen so
that what the controller computes from it stays right:

* **Requests** are chosen by admission number (a multiplicative hash: the same
  choice for a request while it runs and when it finishes). The controller's window
  is ordered by admission (:mod:`ebplus.controller.estimator`): it then holds a
  uniform thinning of the requests, finished and running alike, and censoring the
  running ones stays unbiased. The running sample keeps each request's weight (the
  reported running count is scaled with it), and the controller scales the
  completion count it relates preemptions to (``TelemetryBatch.request_rate``). What
  changes is how much time a window of 500 requests spans: 1/``requests`` times more.
* **Steps** are chosen by engine cycle, whole: a cycle runs from a step that starts a
  prefill phase to the next one (cut after :data:`CYCLE_STEPS` steps between two decode
  or mixed steps, for MB, which has no phases). The steps kept keep their phase structure:
  the closed loop's per-mode evidence (:mod:`ebplus.controller.evidence`) counts prefill
  phases from consecutive steps, and prices the steps a mode ran; every kept cycle
  starts one phase or none, exactly as it did on the engine. A batch's steps still all
  ran since the previous push, which is what attributes them to a mode.

Pure: no vLLM or Ray import.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ebplus.controller.messages import CompletionRecord, RunningRequest, StepRecord

#: Longest cycle (steps): a decode or mixed run is cut into cycles of at most this many steps.
CYCLE_STEPS = 64
_GOLDEN = 0x9E3779B97F4A7C15  # 2**64 / golden ratio: consecutive numbers spread evenly over [0, 2**64)
_MASK = (1 << 64) - 1


@dataclass(frozen=True)
class Sampling:
    """Shares of its telemetry a replica sends (1: all of it)."""

    requests: float = 1.0
    steps: float = 1.0

    def __post_init__(self) -> None:
        for name in ("requests", "steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
                raise ValueError(f"sampling.{name} must be a share in (0, 1], got {value!r}")


#: Everything reported (the default).
ALL = Sampling()


def kept(index: int, share: float) -> bool:
    """Whether item ``index`` of a sequence is among a ``share`` of them, spread evenly (Fibonacci hashing)."""
    return share >= 1.0 or ((index * _GOLDEN) & _MASK) < share * 2.0**64


class TelemetrySampler:
    """Applies a :class:`Sampling` to one replica's stream of drains (steps keep their cycle across drains)."""

    def __init__(self, sampling: Sampling) -> None:
        self.sampling = sampling
        self._unnumbered = 0  # completions without an admission number, chosen by their own count
        self._cycle = 0
        self._cycle_steps = 0
        self._keep_cycle = kept(0, sampling.steps)
        self._in_prefill = False

    def completions(self, records: Sequence[CompletionRecord]) -> list[CompletionRecord]:
        share = self.sampling.requests
        if share >= 1.0:
            return list(records)
        out = []
        for rec in records:
            if rec.seq >= 0:
                index = rec.seq
            else:
                index, self._unnumbered = self._unnumbered, self._unnumbered + 1
            if kept(index, share):
                out.append(rec)
        return out

    def running(self, records: Sequence[RunningRequest], total: int) -> tuple[list[RunningRequest], int]:
        """The running requests chosen, and the running count they stand for (each keeps its weight)."""
        share = self.sampling.requests
        if share >= 1.0 or not records:
            return list(records), total if share >= 1.0 else round(total * share)
        out = [r for r in records if kept(r.seq, share)]
        return out, round(total * len(out) / len(records))

    def steps(self, records: Sequence[StepRecord]) -> list[StepRecord]:
        share = self.sampling.steps
        if share >= 1.0:
            return list(records)
        out = []
        for rec in records:
            prefill_only = rec.decode_tokens == 0 and rec.prefill_tokens > 0
            starts_phase = prefill_only and not self._in_prefill
            # a cut falls between two decode or mixed steps: every cycle ends on one, so a kept cycle
            # that starts a phase is seen to start it wherever the previous kept cycle ended
            cut = self._cycle_steps >= CYCLE_STEPS and not prefill_only and not self._in_prefill
            if starts_phase or cut:
                self._cycle += 1
                self._cycle_steps = 0
                self._keep_cycle = kept(self._cycle, share)
            self._cycle_steps += 1
            self._in_prefill = prefill_only
            if self._keep_cycle:
                out.append(rec)
        return out
