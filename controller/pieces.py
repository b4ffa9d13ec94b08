"""Work done a piece at a time: a generator that yields between pieces and returns its result.

A fleet's re-plan (the estimate, each replica's cost refit and plan) is tens of
milliseconds at 256 replicas. The controller actor interleaves it with telemetry pushes
on one event loop, so every long computation of the re-plan is written as such a
generator: the actor runs a piece, serves pushes, runs the next. In-process callers (the
simulator, tests) call the plain function, which runs the same generator to its end -
one implementation of each computation, whichever way it is driven.

A piece yields ``None`` (or a marker its driver understands, see
:class:`~ebplus.controller.fleet.Stage`); sub-computations compose with ``yield from``.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, TypeVar

T = TypeVar("T")

#: A computation in pieces that returns a ``T``.
Pieces = Generator[Any, None, T]


def run(pieces: Pieces[T]) -> T:
    """Run ``pieces`` to its end, without pausing; its result."""
    while True:
        try:
            next(pieces)
        except StopIteration as done:
            return done.value
