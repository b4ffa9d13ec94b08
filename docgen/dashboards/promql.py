"""The metric names a PromQL expression selects (a small tokenizer, enough for our dashboards).

Grafana variables (``$model``) and interval macros (``$__rate_interval``) may appear; they
sit inside label matchers and range brackets, which are dropped before names are read.
"""

from __future__ import annotations

import re

_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGES = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENT = re.compile(r"(?<![\w.$])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?")
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and", "or",
             "unless", "inf", "nan", "atan2", "start", "end"}  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """Names of the series an expression selects (function and aggregation names excluded)."""
    text = _STRINGS.sub('""', expr)
    text = _MATCHERS.sub("", text)
    text = _RANGES.sub("", text)
    text = _GROUPING.sub("", text)
    names = set()
    for match in _IDENT.finditer(text):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in _KEYWORDS:
            continue
        names.add(name)
    return names


def base_name(series: str, histogram_names: set[str]) -> str:
    """``x_bucket``/``x_sum``/``x_count`` -> ``x`` for a declared histogram ``x``; else unchanged."""
    for suffix in ("_bucket", "_sum", "_count"):
        if series.endswith(suffix) and series.removesuffix(suffix) in histogram_names:
            return series.removesuffix(suffix)
    return series
