"""README.md stays true to the code: metrics, config keys, routes, commands, layout, links.

Each test reads a fact from the code (``controller.exporter.METRICS``, the pydantic models
of ``deploy.config``, the admin router, the Makefile, ``ebplus.cli.COMMANDS``, the package
directories, the dashboards generator) and fails naming what README lacks or gets wrong.
Pure: imports neither vLLM nor Ray (``deploy.admin`` needs only FastAPI).
"""

from __future__ import annotations

import ast
import difflib
import enum
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from ebplus.controller.exporter import METRICS
from ebplus.deploy.config import ServeConfig

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
#: Directories whose every module must have a row in README's layout table.
PACKAGES = ("controller", "replicas", "deploy", "bench", "dashboards", "ebplus")

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6}) +(.+?)\s*#*\s*$")


def _lines_outside_code(text: str) -> list[tuple[int, str]]:
    """``(offset, line)`` of every line not inside a fenced code block."""
    out, offset, fenced = [], 0, False
    for line in text.splitlines(keepends=True):
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            out.append((offset, line))
        offset += len(line)
    return out


def _headings(text: str) -> list[tuple[int, int, str]]:
    """``(offset, level, title)`` of every Markdown heading outside code blocks."""
    found = []
    for offset, line in _lines_outside_code(text):
        m = _HEADING.match(line)
        if m:
            found.append((offset, len(m.group(1)), m.group(2)))
    return found


def section(title: str) -> str:
    """README's section under the heading ``title``, up to the next heading of its level or above."""
    heads = _headings(README)
    for i, (offset, level, name) in enumerate(heads):
        if name == title:
            end = next((o for o, lv, _ in heads[i + 1 :] if lv <= level), len(README))
            return README[offset:end]
    raise AssertionError(f"README has no section titled {title!r}")


def _cells(row: str) -> list[str]:
    """The cells of a Markdown table row (``\\|`` is a literal pipe, not a separator)."""
    return [c.strip() for c in re.split(r"(?<!\\)\|", row.strip())[1:-1]]


def _table_rows(text: str) -> list[list[str]]:
    return [_cells(line) for _, line in _lines_outside_code(text) if line.lstrip().startswith("| `")]


# --------------------------------------------------------------------------- metrics


def test_every_metric_has_a_row_with_its_type() -> None:
    text = section("Metrics")
    rows = {cells[0].strip("`"): cells for cells in _table_rows(text)}
    problems = []
    for spec in METRICS:
        cells = rows.get(spec.name)
        if cells is None:
            problems.append(f"{spec.name}: no row in README's Metrics table")
        elif cells[1] != spec.kind:
            problems.append(f"{spec.name}: README says {cells[1]!r}, exporter says {spec.kind!r}")
        elif sorted(re.findall(r"`(\w+)`", cells[2])) != sorted(spec.labels):
            problems.append(f"{spec.name}: README labels {cells[2]!r}, exporter labels {list(spec.labels)}")
    stale = {name for name in rows if name.startswith("ebplus_")} - {spec.name for spec in METRICS}
    problems += [f"{name}: in README's Metrics table but not in controller.exporter.METRICS" for name in sorted(stale)]
    assert not problems, "\n".join(problems)


# --------------------------------------------------------------------------- configuration


def config_fields(model: type[BaseModel] = ServeConfig, prefix: str = "") -> dict[str, Any]:
    """Every leaf key of the deployment config (``controller.planner.eps``...) and its default."""
    fields: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            fields.update(config_fields(ann, f"{prefix}{name}."))
        else:
            fields[prefix + name] = info.default_factory() if info.default_factory is not None else info.default
    return fields


def readme_default(value: Any) -> str:
    """How the reference table writes a default."""
    if isinstance(value, enum.Enum):
        value = value.value
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, tuple | list):  # as YAML/JSON writes it
        return f"`{json.dumps(value)}`"
    return f"`{value!r}`"


def test_every_config_key_is_documented_with_its_default() -> None:
    rows = {cells[0].strip("`"): cells for cells in _table_rows(section("Reference"))}
    fields = config_fields()
    problems = []
    for path, default in fields.items():
        cells = rows.get(path)
        if cells is None:
            problems.append(f"{path}: no row in README's configuration reference")
        elif cells[2] != readme_default(default):
            problems.append(f"{path}: README's default is {cells[2]}, the code's is {readme_default(default)}")
    problems += [f"{path}: documented but not a field of ServeConfig" for path in sorted(set(rows) - set(fields))]
    assert not problems, "\n".join(problems)


# --------------------------------------------------------------------------- HTTP routes


def admin_routes() -> set[tuple[str, str]]:
    """``(method, path)`` of every route of ``deploy.admin.router``."""
    try:
        from ebplus.deploy import admin
    except ImportError:  # no FastAPI in this environment: read the route decorators instead
        tree = ast.parse((REPO / "deploy" / "admin.py").read_text())
        return {
            (dec.func.attr.upper(), dec.args[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            for dec in node.decorator_list
            if isinstance(dec, ast.Call)
            and isinstance(dec.func, ast.Attribute)
            and isinstance(dec.func.value, ast.Name)
            and dec.func.value.id == "router"
            and dec.args
            and isinstance(dec.args[0], ast.Constant)
        }
    return {(method, route.path) for route in admin.router.routes for method in route.methods}


def test_every_admin_route_is_documented() -> None:
    routes = admin_routes()
    assert len(routes) >= 8, routes
    text = section("HTTP API")
    missing = sorted(f"{method} {path}" for method, path in routes if f"`{method} {path}`" not in text)
    assert not missing, "routes of deploy/admin.py missing from README's HTTP API section: " + ", ".join(missing)


# --------------------------------------------------------------------------- commands


def makefile_targets() -> set[str]:
    return set(re.findall(r"^([A-Za-z][\w.-]*)\s*:(?!=)", (REPO / "Makefile").read_text(), re.M))


def test_quick_start_is_two_make_commands_that_exist() -> None:
    text = section("Quick start")
    first_block = re.search(r"```\w*\n(.*?)```", text, re.S)
    assert first_block, "README's Quick start has no code block"
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines() if line.strip()]
    assert commands == ["make serve", "make test"], (
        f"Quick start's first block should be exactly make serve, make test: {commands}"
    )
    # in code: `make x`, a command line, or `VAR=value make x`
    named = set(re.findall(r"(?:`|^\s*|\S=\S* )make ([A-Za-z][\w-]*)", text, re.M))
    missing = sorted(named - makefile_targets())
    assert not missing, f"Quick start names make targets the Makefile lacks: {missing}"


def test_every_makefile_target_is_documented() -> None:
    missing = sorted(t for t in makefile_targets() if not re.search(rf"`make {re.escape(t)}`", README))
    assert not missing, f"Makefile targets README does not describe: {missing}"


def test_every_ebplus_subcommand_is_documented() -> None:
    from ebplus.cli import COMMANDS

    text = section("Command line")
    missing = sorted(name for name in COMMANDS if not re.search(rf"`ebplus {re.escape(name)}[\s`]", text))
    assert not missing, f"ebplus subcommands missing from README's Command line section: {missing}"


# --------------------------------------------------------------------------- layout and links


def test_layout_table_lists_every_module_and_only_existing_paths() -> None:
    listed = {token for cells in _table_rows(section("Layout")) for token in re.findall(r"`([^`]+)`", cells[0])}
    absent = sorted(path for path in listed if not (REPO / path).exists())
    modules = {
        str(p.relative_to(REPO)) for pkg in PACKAGES for p in (REPO / pkg).glob("*.py") if p.name != "__init__.py"
    }
    unlisted = sorted(modules - listed)
    assert not absent, f"README's layout table names paths that do not exist: {absent}"
    assert not unlisted, f"modules without a row in README's layout table: {unlisted}"


def test_observability_section_is_the_generated_one() -> None:
    from ebplus.dashboards.generate import DOCS_PAGE, outputs

    # The generated docs page is this section one heading level up, under its own title.
    body = outputs()[DOCS_PAGE].split("\n", 1)[1]
    generated = "## Observability\n" + re.sub(r"(?m)^(#+) ", r"#\1 ", body)
    if generated in README:
        return
    diff = difflib.unified_diff(
        generated.splitlines(), section("Observability").splitlines(), "generated", "README.md", lineterm="", n=0
    )
    raise AssertionError(
        "README's Observability section is not the generated one (`python -m ebplus.dashboards.generate`, then copy "
        "docs/reference/dashboards.md into README):\n" + "\n".join(list(diff)[:20])
    )


def slugs(text: str) -> set[str]:
    """GitHub's heading anchors of a Markdown document (repeats get -1, -2, ...)."""
    seen: Counter[str] = Counter()
    out = set()
    for _, _, title in _headings(text):
        slug = re.sub(r"[^\w\- ]", "", title.replace("`", "").lower()).replace(" ", "-")
        out.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
        seen[slug] += 1
    return out


def test_relative_links_resolve() -> None:
    prose = "".join(line for _, line in _lines_outside_code(README))
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", prose):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = REPO / path if path else REPO / "README.md"
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in slugs(file.read_text()):
            broken.append(f"{target}: no heading with anchor #{anchor} in {file.relative_to(REPO)}")
    assert not broken, "broken links in README:\n" + "\n".join(broken)
