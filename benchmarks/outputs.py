"""Where benchmark outputs go: summaries into the docs site, raw data into an ignored folder.

The summaries (Markdown tables, PNG plots) are committed under ``docs/benchmarks/results/``,
so each benchmark page of the documentation site shows the figures it quotes. The raw JSON
(per run, per step, per seed; ``bench_sim.json`` alone is 30k lines) goes to
``benchmarks/results/``, which git ignores: rerun the benchmark to get it back.

Paths are relative to the working directory, the repository root for every command the
docs give.
"""

from __future__ import annotations

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
