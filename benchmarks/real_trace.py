"""What a real engine run served, as a simulator trace: the same requests, lengths and caps.

The sim-to-real benchmark (:mod:`benchmarks.sim_to_real`) prices each engine run
with the simulator on *that run's* requests: every prompt length, every output
length the model produced, every ``max_tokens`` cap, in the order the closed loop
issued them. The conversion goes through the simulator's own trace format
(:func:`ebplus.simulator.workloads.load_trace`'s JSONL, one line per request), so a
cell can be re-run by hand with ``ebplus sim run --workload FILE.jsonl``.

What a trace line says about a request the engine served:

* ``input_len``: its prompt tokens;
* ``max_tokens``: the cap it was sent with;
* ``output_len``: where it would have stopped on its own. For a natural stop
  (finish ``stop``) that is the output length. A request that ended at its cap
  (finish ``length``) would have gone on, by an unknown amount: the line says
  ``cap + 1`` ("beyond the cap"), which the simulator cuts back to the cap and
  reports with finish=length, as the engine did. Both the served lengths and the
  finish reasons the controller sees are therefore the engine's.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ebplus.controller.messages import FinishReason
from ebplus.simulator.workloads import Requests, Trace, build_requests, load_trace


@dataclass(frozen=True)
class ServedRequest:
    """One request as the engine served it.

    Attributes:
        input_len: prompt tokens.
        output_len: output tokens it produced.
        finish: ``stop`` (EOS) or ``length`` (it reached ``max_tokens``).
        max_tokens: the cap it was sent with.
    """

    input_len: int
    output_len: int
    finish: FinishReason
    max_tokens: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "finish", FinishReason(self.finish))
        for name in ("input_len", "output_len", "max_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.finish not in (FinishReason.STOP, FinishReason.LENGTH):
            raise ValueError(f"finish must be 'stop' or 'length', got {self.finish.value!r}")
        if self.output_len > self.max_tokens:
            raise ValueError(f"output_len {self.output_len} exceeds max_tokens {self.max_tokens}")
        if self.finish is FinishReason.LENGTH and self.output_len != self.max_tokens:
            raise ValueError(
                f"finish 'length' needs output_len == max_tokens, got {self.output_len} < {self.max_tokens}"
            )

    def trace_line(self) -> dict[str, int]:
        """The request's JSONL trace record (see the module docstring for ``output_len``)."""
        natural = self.output_len + 1 if self.finish is FinishReason.LENGTH else self.output_len
        return {"input_len": self.input_len, "output_len": natural, "max_tokens": self.max_tokens}


def write_trace(served: Sequence[ServedRequest], path: Path) -> Path:
    """Write ``served`` (in issue order) as a JSONL trace the simulator reads."""
    if not served:
        raise ValueError("no requests to write")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r.trace_line()) + "\n" for r in served))
    return path


def as_trace(served: Sequence[ServedRequest], path: Path) -> Trace:
    """``served`` as a simulator :class:`~ebplus.simulator.workloads.Trace`, through its file format."""
    return load_trace(write_trace(served, path))


def sim_requests(served: Sequence[ServedRequest], concurrency: int, path: Path) -> Requests:
    """The simulator's requests for an engine run: ``served`` in issue order, closed loop at ``concurrency``.

    The trace file is written to ``path`` (kept, so the cell can be simulated again).
    """
    return build_requests(as_trace(served, path), seed=0, concurrency=concurrency)


def check_same(served: Sequence[ServedRequest], requests: Requests) -> None:
    """Raise if the simulator's requests are not exactly what the engine served (lengths, caps, finishes)."""
    expect = np.asarray([(r.input_len, r.output_len, r.max_tokens) for r in served], np.int64).reshape(-1, 3)
    got = np.column_stack([requests.input_len, requests.output_len, requests.caps()])
    capped = np.asarray([r.finish is FinishReason.LENGTH for r in served], bool)
    if got.shape != expect.shape or not np.array_equal(got, expect) or not np.array_equal(requests.capped, capped):
        raise AssertionError("simulator trace differs from the engine run it was built from")
