"""The command line Ray and vLLM users know: the command tree, renamed names that warn once,
``--address`` / ``RAY_ADDRESS``, the packaged default config and overrides validated like the file.

In-process (``ebplus.cli.main``): nothing here starts Ray or imports vLLM; the checks that
``serve --check`` runs after validation are replaced by a recorder (tests/unit/test_check.py
runs the real ones, the packaged default from another directory included).
"""

from __future__ import annotations

import argparse
import fnmatch
import sys
import tomllib
import types
from pathlib import Path

import pytest
import yaml

from docgen import reference
from ebplus import cli
from ebplus.deploy import cli as deploy_cli
from ebplus.deploy.config import DEFAULT_CONFIG, ConfigError, load_config, with_overrides
from ebplus.profiler import cli as profiler_cli

REPO = Path(__file__).resolve().parents[2]
LOCAL = REPO / "deploy" / "local.yaml"


@pytest.fixture
def checked(monkeypatch) -> list[tuple[object, Path]]:
    """What ``ebplus serve --check`` validated: (config, path) per run; the offline checks are skipped."""
    seen: list[tuple[object, Path]] = []

    def report(cfg, path, check_only: bool) -> int:
        seen.append((cfg, path))
        return 0

    monkeypatch.setattr("ebplus.deploy.check.report", report)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return seen


# --------------------------------------------------------------------------- the tree


def test_help_lists_the_operations_then_the_tool_groups(capsys) -> None:
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    listed = [line.split()[0] for line in out.splitlines() if line.startswith("    ") and not line.startswith("     ")]
    assert listed == ["serve", "deploy", "status", "shutdown", "build-model", "config", "sim", "bench", "profile"]


def test_every_command_and_option_explains_itself() -> None:
    parser = cli.build_parser()
    commands = reference._subcommands(parser)
    assert list(commands) == cli.help_order()
    listed = {}  # what --help lists beside each command: the same words as cli.HELP (shown from a wheel too)
    for name, sub in {"": parser, **commands}.items():
        for action in sub._subparsers._group_actions[0]._choices_actions if sub._subparsers else []:
            listed[f"{name} {action.dest}".strip()] = action.help
    assert listed == cli.HELP
    for name, parser in commands.items():
        assert (parser.description or "").strip(), f"ebplus {name}: no description"
        for action in reference.documented(parser):
            assert (action.help or "").strip(), f"ebplus {name} {action.option_strings or action.dest}: no help"


@pytest.mark.parametrize(("group", "members"), [("sim", ["run", "theory", "estimate"]), ("bench", ["sim", "overhead"])])
def test_a_group_alone_prints_its_commands_and_exits_2(capsys, group: str, members: list[str]) -> None:
    assert cli.main([group]) == 2
    out = capsys.readouterr().out
    assert out.startswith(f"usage: ebplus {group} ") and all(f"    {m} " in out for m in members)


def test_the_benchmark_group_from_a_wheel_says_it_needs_a_checkout(monkeypatch, capsys) -> None:
    real = cli._available
    monkeypatch.setattr(cli, "_available", lambda module: not module.startswith("benchmarks.") and real(module))
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", "sim", "--quick"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "bench sim is a benchmark suite, not installed: run it from a checkout" in err


# --------------------------------------------------------------------------- renamed names


THEORY_ARGS = [
    "--p0", "0.0039", "--eta", "1e-5", "--alpha-p", "1.2786e-3", "--alpha-d", "8.921e-3",
    "--beta-p", "2.4853e-5", "--beta-d", "4.586e-5", "--mu-l", "512", "--n", "1024",
    "--kv-capacity", "2e6", "--eps", "0.01", "--json",
]  # fmt: skip


@pytest.mark.parametrize(("old", "new"), list(cli.RENAMED.items()))
def test_an_old_command_warns_once_then_runs_the_new_one(capsys, old: str, new: str) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main([old, "--help"])
    assert exc.value.code == 0
    out, err = capsys.readouterr()
    assert err == f"warning: 'ebplus {old}' is deprecated; use 'ebplus {new}'\n"
    assert out.startswith(f"usage: ebplus {new} ")


def test_an_old_command_does_exactly_what_the_new_one_does(capsys) -> None:
    assert cli.main(["sim", "theory", *THEORY_ARGS]) == 0
    new_out, new_err = capsys.readouterr()
    assert cli.main(["theory", *THEORY_ARGS]) == 0
    old_out, old_err = capsys.readouterr()
    assert old_out == new_out and new_err == ""
    assert old_err == "warning: 'ebplus theory' is deprecated; use 'ebplus sim theory'\n"


def test_ray_address_still_works_with_one_warning(checked, capsys) -> None:
    assert cli.main(["serve", "--check", "--config", str(LOCAL), "--ray-address", "10.0.0.5:6379"]) == 0
    assert checked[0][0].ray.address == "10.0.0.5:6379"
    assert (
        capsys.readouterr().err == "warning: 'ebplus serve --ray-address' is deprecated; use 'ebplus serve --address'\n"
    )
    args = cli.build_parser("deploy").parse_args(["deploy", "--config", str(LOCAL), "--ray-address", "h:1"])
    assert args.address == "h:1"
    assert (
        capsys.readouterr().err
        == "warning: 'ebplus deploy --ray-address' is deprecated; use 'ebplus deploy --address'\n"
    )


# --------------------------------------------------------------------------- overrides, validated


def test_port_70000_is_refused_naming_the_flag_and_the_field(checked, capsys) -> None:
    assert cli.main(["serve", "--check", "--config", str(LOCAL), "--port", "70000"]) == 2
    out, err = capsys.readouterr()
    assert err == "ebplus serve: --port 70000: http.port: Input should be less than or equal to 65535\n"
    assert out == "" and checked == []  # refused before the offline checks, nothing said ok


@pytest.mark.parametrize(
    ("argv", "field", "value"),
    [
        (["--port", "8001"], ("http", "port"), 8001),
        (["--host", "0.0.0.0"], ("http", "host"), "0.0.0.0"),
        (["--address", "10.0.0.5:6379"], ("ray", "address"), "10.0.0.5:6379"),
    ],
)
def test_every_serve_override_lands_in_its_field(checked, argv: list[str], field: tuple[str, str], value) -> None:
    assert cli.main(["serve", "--check", "--config", str(LOCAL), *argv]) == 0
    cfg = checked[0][0]
    assert getattr(getattr(cfg, field[0]), field[1]) == value
    untouched = load_config(LOCAL).model_dump()
    untouched[field[0]][field[1]] = value
    assert cfg.model_dump() == untouched  # nothing else moved


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--port", "0"], "--port 0: http.port: Input should be greater than or equal to 1"),
        (["--port", "-1"], "--port -1: http.port: Input should be greater than or equal to 1"),
    ],
)
def test_a_bad_override_is_one_line_exit_2(checked, capsys, argv: list[str], line: str) -> None:
    assert cli.main(["serve", "--check", "--config", str(LOCAL), *argv]) == 2
    assert capsys.readouterr().err == f"ebplus serve: {line}\n"


def test_a_cross_field_check_refuses_an_override_too() -> None:
    gpu = load_config(REPO / "deploy" / "gpu.yaml")
    with pytest.raises(ConfigError) as exc:
        with_overrides(gpu, {"replicas.accelerator": ("--accelerator", "cpu")})
    assert (
        str(exc.value)
        == "with --accelerator cpu: engine.cpu_kv_cache_gib is required when replicas.accelerator is 'cpu'"
    )


@pytest.mark.parametrize("path", sorted([*REPO.glob("deploy/*.yaml"), *REPO.glob("tests/e2e/*.yaml")]))
def test_an_override_keeps_everything_else_of_every_shipped_config(path: Path) -> None:
    cfg = load_config(path)
    same = with_overrides(cfg, {"http.port": ("--port", cfg.http.port)})
    assert same == cfg and same.model_fields_set == cfg.model_fields_set


def test_profile_model_override_is_validated_like_the_file(tmp_path) -> None:
    assert profiler_cli._load_config(None, "builtin:tiny").model.source == "builtin:tiny"
    with pytest.raises(ConfigError, match=r"^--model builtin:nope: model\.source: "):
        profiler_cli._load_config(LOCAL, "builtin:nope")


# --------------------------------------------------------------------------- the cluster's address


def test_address_flag_then_config_then_ray_address(checked, monkeypatch, tmp_path) -> None:
    joined = tmp_path / "joined.yaml"
    joined.write_text(yaml.safe_dump({**yaml.safe_load(LOCAL.read_text()), "ray": {"address": "file:1"}}))

    def address(*argv: str) -> str | None:
        checked.clear()
        assert cli.main(["serve", "--check", *argv]) == 0
        return checked[0][0].ray.address

    assert address("--config", str(LOCAL)) is None  # nothing anywhere: serve starts a local cluster
    monkeypatch.setenv("RAY_ADDRESS", "env:1")
    assert address("--config", str(LOCAL)) == "env:1"
    assert address("--config", str(joined)) == "file:1"  # an explicit address wins, as in ray.init
    assert address("--config", str(joined), "--address", "flag:1") == "flag:1"
    monkeypatch.setenv("RAY_ADDRESS", "  ")
    assert address("--config", str(LOCAL)) is None


def test_deploy_without_any_address_names_all_three(capsys, monkeypatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert cli.main(["deploy", "--config", str(LOCAL)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"ebplus deploy: {LOCAL}: ray.address: deploy needs a running Ray cluster (--address, RAY_ADDRESS or ray.address"
    )
    assert err.count("\n") == 1


# --------------------------------------------------------------------------- the packaged default


def test_the_default_config_is_the_packaged_local_yaml_from_any_directory(checked, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert cli.main(["serve", "--check"]) == 0
    cfg, path = checked[0]
    assert path == DEFAULT_CONFIG == LOCAL and cfg == load_config(LOCAL)


def test_the_default_config_ships_in_the_wheel_and_the_image() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["ebplus.deploy"]
    assert pyproject["tool"]["setuptools"]["package-dir"]["ebplus.deploy"] == DEFAULT_CONFIG.parent.name
    assert any(fnmatch.fnmatch(DEFAULT_CONFIG.name, pattern) for pattern in patterns)
    assert "COPY --chown=ray:users deploy/ deploy/" in (REPO / "deploy" / "Dockerfile").read_text()


# --------------------------------------------------------------------------- shutdown


def test_shutdown_needs_an_address(capsys, monkeypatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert cli.main(["shutdown", "--yes"]) == 2
    assert capsys.readouterr().err == (
        "ebplus shutdown: error: which Ray cluster? pass --address HOST:PORT or set RAY_ADDRESS "
        "(ebplus serve prints the address)\n"
    )


def test_shutdown_without_a_terminal_needs_yes(capsys, monkeypatch) -> None:
    monkeypatch.setattr(sys, "stdin", types.SimpleNamespace(isatty=lambda: False))
    assert cli.main(["shutdown", "--address", "h:1"]) == 2
    assert capsys.readouterr().err.endswith("needs confirmation: pass --yes (stdin is not a terminal)\n")


@pytest.fixture
def cluster(monkeypatch) -> types.SimpleNamespace:
    """A Ray cluster as far as ``ebplus shutdown`` sees it: its apps and its controller, recorded."""
    pytest.importorskip("ray.serve")
    import ray
    from ray import serve

    state = types.SimpleNamespace(apps={"ebplus": object(), "other": object()}, controller=object(), calls=[])
    monkeypatch.setattr(deploy_cli, "start_ray", lambda section: state.calls.append(("init", section.address)))
    monkeypatch.setattr(ray, "shutdown", lambda: state.calls.append(("shutdown",)))
    monkeypatch.setattr(serve, "status", lambda: types.SimpleNamespace(applications=dict(state.apps)))
    monkeypatch.setattr(serve, "delete", lambda name: (state.calls.append(("delete", name)), state.apps.pop(name)))
    monkeypatch.setattr("ebplus.controller.actor.get_controller", lambda: state.controller)

    def stop(handle) -> int:
        state.calls.append(("stop", handle))
        state.controller = None
        return 42

    monkeypatch.setattr("ebplus.controller.lifecycle.stop_controller", stop)
    return state


def test_shutdown_removes_the_app_and_the_controller_and_nothing_else(cluster, capsys, monkeypatch) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "env:1")
    handle = cluster.controller
    assert cli.main(["shutdown", "--yes"]) == 0
    assert cluster.calls == [("init", "env:1"), ("delete", "ebplus"), ("stop", handle), ("shutdown",)]
    assert list(cluster.apps) == ["other"]
    assert capsys.readouterr().out.splitlines() == [
        "[shutdown] application 'ebplus' deleted from the Ray cluster at env:1",
        "[shutdown] controller 'ebplus-controller' stopped; its state at version 42 stays persisted for the next "
        "ebplus serve or deploy",
        "[shutdown] done; Ray and Ray Serve still run (Ray's `serve shutdown` and `ray stop` remove them)",
    ]
    # twice is not an error: nothing left to remove
    assert cli.main(["shutdown", "--yes", "--address", "flag:1"]) == 0
    out = capsys.readouterr().out
    assert "no application 'ebplus' on the Ray cluster at flag:1" in out and "no controller 'ebplus-controller'" in out


def test_shutdown_asks_on_a_terminal(cluster, capsys, monkeypatch) -> None:
    monkeypatch.setattr(sys, "stdin", types.SimpleNamespace(isatty=lambda: True))
    monkeypatch.setattr("builtins.input", lambda prompt: "n")
    assert cli.main(["shutdown", "--address", "h:1"]) == 1
    assert cluster.calls == [] and "[shutdown] nothing changed" in capsys.readouterr().out


def test_deploy_delete_still_leaves_the_controller() -> None:
    args = cli.build_parser("deploy").parse_args(["deploy", "--config", str(LOCAL), "--delete"])
    assert isinstance(args, argparse.Namespace) and args.delete and args.run is deploy_cli.run_deploy
