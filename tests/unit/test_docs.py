"""The docs site and README stay true to the code: reference pages, routes, commands, layout, links.

Each test reads a fact from the code (``ebplus.controller.exporter.METRICS``, the pydantic models of
``ebplus.deploy.config`` and ``docgen.helm_values``, the admin router, the Makefile,
``ebplus.cli``, the package directories, the generators) and fails naming what the docs lack or get
wrong. The generated reference pages make several facts true by construction, so for those the test
checks the generator against an independent walk of the code, and that the committed page is current.
``mkdocs build --strict`` (``make docs``, part of ``make test``) adds the site's own link checks.
Pure: imports neither vLLM nor Ray (``ebplus.deploy.admin`` needs only FastAPI).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import unicodedata
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from docgen import reference
from ebplus.controller.exporter import METRICS
from ebplus.deploy.config import ServeConfig

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
README = REPO / "README.md"
#: Source folders (each installs as ``ebplus.<name>``, ``ebplus/`` as ``ebplus``) whose every module
#: must have a row in the layout table.
PACKAGES = ("controller", "replicas", "deploy", "dashboards", "ebplus", "simulator", "profiler", "benchmarks", "docgen")
README_MAX_BYTES = 12 * 1024

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6}) +(.+?)\s*#*\s*$")


def pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def prose(text: str) -> str:
    """The text outside fenced code blocks."""
    out, fenced = [], False
    for line in text.splitlines(keepends=True):
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            out.append(line)
    return "".join(out)


def cells(row: str) -> list[str]:
    """The cells of a table row, split as Python-Markdown does: not at ``\\|``, not inside a code span."""
    out, current, in_code, prev = [], [], False, ""
    for ch in row.strip():
        if ch == "`":
            in_code = not in_code
        if ch == "|" and not in_code and prev != "\\":
            out.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
        prev = ch
    return out[1:]


def table_rows(text: str) -> list[list[str]]:
    """Cells of every table row starting with a code span or a link on one."""
    return [cells(line) for line in prose(text).splitlines() if re.match(r"\s*\| \[?`", line)]


def first_code(cell: str) -> str:
    return re.search(r"`([^`]+)`", cell).group(1)


# --------------------------------------------------------------------------- generated reference pages


def test_reference_pages_are_current() -> None:
    stale = [str(p.relative_to(REPO)) for p in reference.stale_pages()]
    assert not stale, f"stale generated pages {stale}: run `python -m docgen.reference`"


def test_dashboards_page_is_current() -> None:
    from docgen.dashboards.generate import DOCS_PAGE, outputs

    assert DOCS_PAGE == DOCS / "reference" / "dashboards.md"
    current = DOCS_PAGE.read_text() if DOCS_PAGE.exists() else ""
    assert current == outputs()[DOCS_PAGE], (
        "docs/reference/dashboards.md is stale: run `python -m docgen.dashboards.generate`"
    )


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


def yaml_default(value: Any) -> str:
    """How a default reads in a YAML file, in a code span."""
    value = getattr(value, "value", value)  # an enum member
    return "`" + json.dumps(value, ensure_ascii=False) + "`"


def test_config_reference_has_every_key_with_its_default() -> None:
    rows = {first_code(cells[0]): cells for cells in table_rows(reference.render_config())}
    fields = config_fields()
    problems = []
    for path, default in fields.items():
        cells = rows.get(path)
        if cells is None:
            problems.append(f"{path}: no row in the configuration reference")
        elif cells[3] != yaml_default(default):
            problems.append(f"{path}: the page's default is {cells[3]}, the code's is {yaml_default(default)}")
    problems += [f"{path}: on the page but not a field of ServeConfig" for path in sorted(set(rows) - set(fields))]
    assert not problems, "\n".join(problems)


def test_config_reference_shows_bounds_and_descriptions() -> None:
    rows = {first_code(cells[0]): cells for cells in table_rows(reference.render_config())}
    assert rows["engine.max_num_seqs"][2] == "≥ 2"
    assert rows["http.port"][2] == "≥ 1, ≤ 65535"
    assert rows["controller.planner.eps"][2] == "> 0, < 1"
    assert rows["scheduler.mode"][1] == '"mb", "eb", "v0", "auto", "shadow"'
    assert rows["engine.max_num_batched_tokens"][1] == "int or null"
    undescribed = sorted(path for path, cells in rows.items() if not cells[4])
    assert not undescribed, f"config keys without a description (add description= to the Field): {undescribed}"


def test_metrics_reference_has_every_metric_with_type_and_labels() -> None:
    rows = {first_code(cells[0]): cells for cells in table_rows(reference.render_metrics())}
    problems = []
    for spec in METRICS:
        cells = rows.get(spec.name)
        if cells is None:
            problems.append(f"{spec.name}: no row in the metrics reference")
        elif cells[1] != spec.kind:
            problems.append(f"{spec.name}: the page says {cells[1]!r}, the exporter {spec.kind!r}")
        elif sorted(re.findall(r"`(\w+)`", cells[2])) != sorted(spec.labels):
            problems.append(f"{spec.name}: page labels {cells[2]!r}, exporter labels {list(spec.labels)}")
    stale = set(rows) - {spec.name for spec in METRICS}
    problems += [f"{name}: on the page but not in METRICS" for name in sorted(stale)]
    assert not problems, "\n".join(problems)


def test_cli_reference_has_every_subcommand_and_option() -> None:
    from ebplus.cli import build_parser, help_order

    text = reference.render_cli()
    sections = dict(re.findall(r"^## `ebplus ([\w -]+)`\n(.*?)(?=^## |\Z)", text, re.M | re.S))
    assert list(sections) == help_order(), "subcommands on the page differ from ebplus.cli.COMMANDS"
    problems = []
    for name, sub in reference._subcommands(build_parser()).items():
        for action in reference.documented(sub):  # not -h/--help, not a renamed flag kept one release
            for option in action.option_strings or [action.metavar or action.dest]:
                if not re.search(rf"^\| `[^`]*{re.escape(option)}\b", sections[name], re.M):
                    problems.append(f"ebplus {name} {option}: no row in the CLI reference")
    assert not problems, "\n".join(problems)


def chart_paths(model: type[BaseModel], prefix: str = "") -> set[str]:
    """Leaf value paths of the chart (``workerGroups[].name``); the ``config`` block is one entry."""
    from docgen.helm_values import ChartValues

    paths = set()
    for name, info in model.model_fields.items():
        name = info.alias or name  # the key as written in values (`global`)
        ann, suffix = info.annotation, ""
        if getattr(ann, "__origin__", None) is list and isinstance(ann.__args__[0], type):
            ann, suffix = ann.__args__[0], "[]"
        if isinstance(ann, type) and issubclass(ann, BaseModel) and ann is not ServeConfig:
            paths |= chart_paths(ann, f"{prefix}{name}{suffix}.")
        else:
            paths.add(prefix + name)
    assert model is not ChartValues or "config" in paths
    return paths


def test_helm_reference_has_every_value() -> None:
    from docgen.helm_values import ChartValues

    rows = {first_code(cells[0]) for cells in table_rows(reference.render_helm_values())}
    expected = chart_paths(ChartValues)
    assert rows == expected, f"missing {sorted(expected - rows)}, extra {sorted(rows - expected)}"


def test_helm_reference_reads_the_charts_defaults() -> None:
    rows = {first_code(cells[0]): cells for cells in table_rows(reference.render_helm_values())}
    values = yaml.safe_load((REPO / "helm" / "ebplus" / "values.yaml").read_text())
    assert rows["workerGroups[].gpus"][3] == f"`{values['workerGroups'][0]['gpus']}`"
    assert rows["monitoring.interval"][3] == json.dumps(values["monitoring"]["interval"]).join("``")


# --------------------------------------------------------------------------- hand-written pages against the code


def admin_routes() -> set[tuple[str, str]]:
    """``(method, path)`` of every route of ``ebplus.deploy.admin.router``."""
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
    text = (DOCS / "http" / "admin.md").read_text()
    missing = sorted(f"{method} {path}" for method, path in routes if f"`{method} {path}`" not in text)
    assert not missing, "routes of ebplus.deploy.admin missing from docs/http/admin.md: " + ", ".join(missing)


def makefile_targets() -> set[str]:
    return set(re.findall(r"^([A-Za-z][\w.-]*)\s*:(?!=)", (REPO / "Makefile").read_text(), re.M))


def test_every_makefile_target_is_documented() -> None:
    text = (DOCS / "cli.md").read_text()
    missing = sorted(t for t in makefile_targets() if f"`make {t}`" not in text)
    assert not missing, f"Makefile targets docs/cli.md does not describe: {missing}"


def test_every_ebplus_subcommand_is_in_the_cli_guide() -> None:
    from ebplus.cli import COMMANDS

    text = (DOCS / "cli.md").read_text()
    missing = sorted(name for name in COMMANDS if f"`ebplus {name}`" not in text)
    assert not missing, f"ebplus subcommands missing from docs/cli.md: {missing}"


def test_every_python_module_command_exists() -> None:
    texts = {p: p.read_text() for p in [README, *pages()]}
    named = {(p, m) for p, text in texts.items() for m in re.findall(r"python -m (ebplus(?:\.\w+)+)", text)}
    assert named, "no `python -m ebplus...` command found in the docs"
    missing = sorted(f"{p.relative_to(REPO)}: {m}" for p, m in named if importlib.util.find_spec(m) is None)
    assert not missing, "docs run modules that do not exist:\n" + "\n".join(missing)


def test_no_doc_names_a_path_that_moved() -> None:
    moved = {
        "bench/profiles": "controller/profiles",
        "bench/RESULTS.md": "docs/benchmarks/simulator.md",
        "dashboards/README-section.md": "docs/reference/dashboards.md",
        "scheduler_cls=\"replicas.": "ebplus.replicas...",
        "--scheduler-cls replicas.": "ebplus.replicas...",
        "`deploy.app:build_app`": "ebplus.deploy.app:build_app",
    }
    found = [
        f"{p.relative_to(REPO)}: {old!r} (now {new})"
        for p in [README, *pages()]
        for old, new in moved.items()
        if old in p.read_text() and not p.is_relative_to(DOCS / "reference")
    ]
    assert not found, "docs name paths that moved:\n" + "\n".join(found)


# --------------------------------------------------------------------------- README


def test_readme_is_short() -> None:
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes, over {README_MAX_BYTES}: move detail into docs/"


def test_quick_start_is_two_make_commands_that_exist() -> None:
    text = README.read_text()
    block = re.search(r"## Quick start\n.*?```\w*\n(.*?)```", text, re.S)
    assert block, "README has no Quick start code block"
    commands = [line.split("#")[0].strip() for line in block.group(1).splitlines() if line.strip()]
    assert commands == ["make serve", "make test"], f"Quick start's block should be make serve, make test: {commands}"
    named = set(re.findall(r"(?:`|^\s*|\S=\S* )make ([A-Za-z][\w-]*)", text, re.M))
    missing = sorted(named - makefile_targets())
    assert not missing, f"README names make targets the Makefile lacks: {missing}"


# --------------------------------------------------------------------------- site structure


def test_layout_table_lists_every_module_and_only_existing_paths() -> None:
    text = (DOCS / "development" / "layout.md").read_text()
    listed = {token for cells in table_rows(text) for token in re.findall(r"`([^`]+)`", cells[0])}
    absent = sorted(path for path in listed if not (REPO / path).exists())
    modules = {
        str(p.relative_to(REPO)) for pkg in PACKAGES for p in (REPO / pkg).glob("*.py") if p.name != "__init__.py"
    }
    unlisted = sorted(modules - listed)
    assert not absent, f"the layout table names paths that do not exist: {absent}"
    assert not unlisted, f"modules without a row in docs/development/layout.md: {unlisted}"


def nav_files(node: Any) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, list):
        return [f for item in node for f in nav_files(item)]
    if isinstance(node, dict):
        return [f for value in node.values() for f in nav_files(value)]
    return []


def test_every_page_is_in_the_navigation() -> None:
    nav = nav_files(yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"])
    on_disk = {str(p.relative_to(DOCS)) for p in pages()}
    assert not (dup := [f for f, n in Counter(nav).items() if n > 1]), f"pages twice in mkdocs.yml's nav: {dup}"
    assert set(nav) == on_disk, f"not in the nav: {sorted(on_disk - set(nav))}; missing files: {sorted(set(nav) - on_disk)}"


BENCHMARK_PAGES = ("simulator", "calibration", "engine", "e2e", "overhead", "controller", "reliability")


@pytest.mark.parametrize("name", BENCHMARK_PAGES)
def test_benchmark_page_states_its_command(name: str) -> None:
    blocks = re.findall(r"```bash\n(.*?)```", (DOCS / "benchmarks" / f"{name}.md").read_text(), re.S)
    commands = [line for block in blocks for line in block.splitlines() if re.search(r"ebplus|python -m|make ", line)]
    assert commands, f"docs/benchmarks/{name}.md states no command that makes its figures"


def test_every_plot_is_shown_and_every_summary_linked() -> None:
    text = "".join(p.read_text() for p in (DOCS / "benchmarks").glob("*.md"))
    results = DOCS / "benchmarks" / "results"
    unshown = sorted(p.name for p in results.glob("*.png") if f"](results/{p.name})" not in text)
    unlinked = sorted(p.name for p in results.glob("*.md") if f"(results/{p.name})" not in text)
    assert not unshown, f"plots no benchmark page shows: {unshown}"
    assert not unlinked, f"generated tables no benchmark page links: {unlinked}"
    assert not list(results.glob("*.json")), "raw JSON belongs in the ignored benchmarks/results/ (benchmarks/outputs.py)"


# --------------------------------------------------------------------------- links


def github_slugs(text: str) -> set[str]:
    """GitHub's heading anchors (README is read on GitHub); repeats get -1, -2, ..."""
    seen: Counter[str] = Counter()
    out = set()
    for line in prose(text).splitlines():
        m = _HEADING.match(line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(2).replace("`", "").lower()).replace(" ", "-")
            out.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
            seen[slug] += 1
    return out


def mkdocs_slugs(text: str) -> set[str]:
    """Python-Markdown's toc anchors (the site's): ASCII-folded, repeats get _1, _2, ..."""
    seen: Counter[str] = Counter()
    out = set()
    for line in prose(text).splitlines():
        m = _HEADING.match(line)
        if m:
            title = re.sub(r"[`*\\]", "", m.group(2))
            title = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode()
            slug = re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", title).strip().lower())
            out.add(slug if not seen[slug] else f"{slug}_{seen[slug]}")
            seen[slug] += 1
    return out


def broken_links(source: Path, slugs) -> list[str]:
    broken = []
    text = re.sub(r"`[^`\n]*`", "", prose(source.read_text()))  # code spans hold no links
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (source.parent / path).resolve() if path else source
        where = f"{source.relative_to(REPO)}: {target}"
        if not file.exists():
            broken.append(f"{where}: no such file")
        elif source.is_relative_to(DOCS) and not file.is_relative_to(DOCS):
            broken.append(f"{where}: outside docs/, the site cannot serve it (name the file in a code span)")
        elif anchor and file.suffix == ".md" and anchor not in slugs(file.read_text()):
            broken.append(f"{where}: no heading with anchor #{anchor} in {file.relative_to(REPO)}")
    return broken


def test_relative_links_resolve() -> None:
    broken = broken_links(README, github_slugs)
    for page in pages():
        broken += broken_links(page, mkdocs_slugs)
    assert not broken, "broken links:\n" + "\n".join(broken)
