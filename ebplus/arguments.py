"""What every subcommand's arguments share: one wording for one kind of bad value, one for a renamed name."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from typing import Any


def deprecated(old: str, new: str) -> None:
    """The one line a renamed command or flag prints (stderr) before doing what the new name does."""
    print(f"warning: {old!r} is deprecated; use {new!r}", file=sys.stderr)


class _RenamedFlag(argparse.Action):
    def __init__(self, option_strings: Sequence[str], dest: str, new: str, **kwargs: Any) -> None:
        self.new = new
        super().__init__(option_strings, dest, **kwargs)

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: str | None = None
    ) -> None:
        deprecated(f"{parser.prog} {option}", f"{parser.prog} {self.new}")
        setattr(namespace, self.dest, values)


def renamed_flag(parser: argparse.ArgumentParser, old: str, new: str) -> None:
    """Accept ``old`` as a hidden alias of the (already added) option ``new`` for one release, with a warning."""
    target = next(a for a in parser._actions if new in a.option_strings)
    parser.add_argument(
        old, dest=target.dest, type=target.type, metavar=target.metavar, help=argparse.SUPPRESS, action=_RenamedFlag,
        new=new,
    )  # fmt: skip


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}")
    return value
