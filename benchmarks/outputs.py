"""Where benchmark outputs go: summaries into the docs site, raw data into an ignored folder; and the
interleaved order of rounds that makes the figures one summary compares comparable.

The summaries (Markdown tables, PNG plots) are committed under ``docs/benchmarks/results/``,
so each benchmark page of the documentation site shows the figures it quotes. The raw JSON
(per run, per step, per seed; ``bench_sim.json`` alone is 30k lines) goes to
``benchmarks/results/``, which git ignores: rerun the benchmark to get it back.

Paths are relative to the working directory, the repository root for every command the
docs give.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

#: Committed: the tables and plots the benchmark pages show.
SUMMARY_DIR = Path("docs/benchmarks/results")
#: Ignored by git: the raw JSON beside each summary.
RAW_DIR = Path("benchmarks/results")


def raw_path(summary: Path) -> Path:
    """The JSON file of a summary: in :data:`RAW_DIR` for a summary in :data:`SUMMARY_DIR`
    (the default), else beside the summary, so an explicit ``--out`` keeps both together."""
    summary = Path(summary)
    if summary.parent.resolve() == SUMMARY_DIR.resolve():
        path = RAW_DIR / summary.with_suffix(".json").name
    else:
        path = summary.with_suffix(".json")
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def save_plot(fig: object, path: Path) -> None:
    """Write a matplotlib figure as the benchmark pages show them (tight layout, 120 dpi) and free it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()  # type: ignore[attr-defined]
    fig.savefig(path, dpi=120)  # type: ignore[attr-defined]
    plt.close(fig)  # type: ignore[arg-type]


def write_summary(out: Path, title: str, lines: list[str], raw: list[dict], name: str) -> None:
    """A benchmark's page (``# title`` and its lines) at ``out`` and its raw JSON at :func:`raw_path`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(f"# {title}\n\n" + "\n".join(lines) + "\n")
    raw_path(out).write_text(json.dumps(raw, indent=1))
    print(f"{name}: wrote {out}", file=sys.stderr)


def command_line(module: str, argv: Sequence[str] | None) -> str:
    """``python -m module`` with the arguments it ran with (``sys.argv``'s when ``argv`` is None): what a page
    quotes as the command that made it."""
    return " ".join(["python -m", module, *(sys.argv[1:] if argv is None else argv)])


def publish(out: Path, title: str, lines: list[str], raw: list[dict], name: str) -> None:
    """:func:`write_summary`, then the summary's lines on stdout, as a run ends."""
    write_summary(out, title, lines, raw, name)
    print("\n".join(lines))


def interleaved(rounds: int, arms: Sequence[str]) -> Iterator[tuple[int, str]]:
    """``(round, arm)`` for ``rounds`` rounds (from 1) of every arm, the order reversed every other round, so
    that a drift of the machine over a run falls on every arm alike (the figures a summary compares)."""
    for round_ in range(1, rounds + 1):
        for arm in arms if round_ % 2 else list(reversed(arms)):
            yield round_, arm


def spread(values: Sequence[float], fmt: str) -> str:
    """``median (min–max)`` of ``values``, each formatted with ``fmt`` (``format``'s spec): how the summaries
    quote repeated rounds or seeds."""
    return f"{format(statistics.median(values), fmt)} ({format(min(values), fmt)}–{format(max(values), fmt)})"
