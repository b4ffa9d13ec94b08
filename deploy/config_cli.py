"""``ebplus config migrate``: a deployment config in Ray Serve LLM's form (or back in EB+'s)."""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from ebplus.deploy.config import ConfigError, load_config
from ebplus.errors import CommandError

HEADER = "# Ray Serve LLM's form of {path}, written by `ebplus config migrate` (see docs/configuration.md)\n"


def register(sub: argparse._SubParsersAction) -> None:
    """``migrate`` into the ``config`` group's subparsers (``ebplus config migrate``)."""
    m = sub.add_parser(
        "migrate",
        help="print a config in Ray Serve LLM's form (llm_configs plus an ebplus: section)",
        description=(
            "Read a deployment config (either form), validate it, and print it in Ray Serve LLM's form: a Serve "
            "config file whose llm_configs hold the models and whose ebplus: section holds EB+'s settings. It "
            "loads back into the same deployment; only values that differ from the defaults are written. "
            "--to ebplus prints EB+'s own form instead (one model only)."
        ),
    )
    m.add_argument("file", type=Path, help="deployment config (YAML)")
    m.add_argument("--to", choices=("llm_configs", "ebplus"), default="llm_configs", help="the form to print")
    m.set_defaults(run=run_migrate)


def run_migrate(args: argparse.Namespace) -> int:
    from ebplus.deploy.llm_configs import to_llm_form

    try:
        cfg = load_config(args.file)
    except ConfigError as exc:
        raise CommandError(str(exc).replace("\n", "; ")) from None
    if args.to == "ebplus":
        if len(cfg.models()) > 1:
            raise CommandError(f"{args.file}: holds {len(cfg.models())} models; EB+'s own form holds one")
        data = cfg.model_dump(mode="json", exclude_defaults=True)
        print(yaml.safe_dump(data, sort_keys=False), end="")
        return 0
    print(HEADER.format(path=args.file) + yaml.safe_dump(to_llm_form(cfg), sort_keys=False), end="")
    return 0
