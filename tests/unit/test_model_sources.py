"""``model.source``: builtin, local directory or Hugging Face Hub id, resolved offline (deploy/sources.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ebplus.deploy import sources
from ebplus.deploy.config import ConfigError, parse_config
from ebplus.deploy.sources import Kind

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def write_model(path: Path, **config: object) -> Path:
    """A directory laid out like a Hugging Face model (the files vLLM looks for, contents irrelevant here)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(
        json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"], **config})
    )
    (path / "model.safetensors").write_bytes(b"\0" * 8)
    (path / "tokenizer.json").write_text("{}")
    return path


def hub_snapshot(hf_home: Path, repo_id: str, **config: object) -> Path:
    """``repo_id`` in a Hub cache under ``hf_home``: ``models--org--name/{refs/main, snapshots/<commit>/...}``."""
    repo = hf_home / "hub" / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    return write_model(repo / "snapshots" / COMMIT, **config)


@pytest.mark.parametrize(
    ("source", "kind", "name"),
    [
        ("builtin:smollm2", Kind.BUILTIN, "smollm2"),
        ("builtin:tiny", Kind.BUILTIN, "tiny"),
        ("Qwen/Qwen2.5-7B-Instruct", Kind.HUB, "Qwen/Qwen2.5-7B-Instruct"),
        ("hf://Qwen/Qwen2.5-7B-Instruct", Kind.HUB, "Qwen/Qwen2.5-7B-Instruct"),
        ("gpt2", Kind.HUB, "gpt2"),
        ("/models/Qwen3-8B", Kind.LOCAL, "/models/Qwen3-8B"),
        ("./models/x", Kind.LOCAL, "./models/x"),
        ("~/models/x", Kind.LOCAL, "~/models/x"),
        ("a/b/c", Kind.LOCAL, "a/b/c"),  # too many parts for a Hub id
        ("org/bad--name", Kind.LOCAL, "org/bad--name"),
    ],
)
def test_source_kinds(source: str, kind: Kind, name: str) -> None:
    parsed = sources.parse(source)
    assert (parsed.kind, parsed.name) == (kind, name)


def test_an_existing_directory_wins_over_a_hub_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    write_model(tmp_path / "org" / "name")
    parsed = sources.parse("org/name")
    assert parsed.kind is Kind.LOCAL and parsed.for_vllm() == str(tmp_path / "org" / "name")


@pytest.mark.parametrize(
    ("repo", "ok"),
    [("Qwen/Qwen2.5-7B-Instruct", True), ("a" * 96, True), ("a" * 97, False), ("-org/x", False),
     ("org/x.", False), ("org/x..y", False), ("org/x.git", False), ("org/x y", False), ("", False)],
)  # fmt: skip
def test_hub_id_rules(repo: str, ok: bool) -> None:
    assert sources.is_hub_id(repo) is ok


@pytest.mark.parametrize(
    ("source", "message"),
    [("builtin:llama", "unknown builtin model 'builtin:llama'"), ("hf://not a repo", "is not a Hugging Face Hub id")],
)
def test_the_schema_refuses_malformed_sources_naming_the_field(source: str, message: str) -> None:
    with pytest.raises(ConfigError, match=rf"cfg: model.source: .*{message}"):
        parse_config({"model": {"source": source}}, "cfg")


def test_vllm_gets_the_hub_id_without_the_scheme() -> None:
    assert sources.parse("hf://org/name").for_vllm() == "org/name"


@pytest.mark.parametrize(
    ("env", "expected"),
    [({"HF_HUB_CACHE": "/c"}, "/c"), ({"HF_HOME": "/h"}, "/h/hub"), ({"HF_HOME": "/h", "HF_HUB_CACHE": "/c"}, "/c"),
     ({"XDG_CACHE_HOME": "/x"}, "/x/huggingface/hub")],
)  # fmt: skip
def test_the_cache_directory_follows_the_hub_clients_precedence(env: dict, expected: str) -> None:
    assert sources.hub_cache(env) == Path(expected)


def test_a_hub_id_resolves_offline_to_its_cached_snapshot(tmp_path: Path) -> None:
    snapshot = hub_snapshot(tmp_path, "ebplus-test/tiny-llama")
    env = {"HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    assert sources.cached_snapshot("ebplus-test/tiny-llama", env=env) == snapshot
    assert sources.cached_snapshot("ebplus-test/tiny-llama", revision=COMMIT, env=env) == snapshot
    assert sources.cached_snapshot("ebplus-test/other", env=env) is None
    assert sources.model_dir_problem(snapshot) is None


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda p: (p / "config.json").unlink(), "has no config.json"),
        (lambda p: (p / "config.json").write_text("{nope"), "is not readable JSON"),
        (lambda p: (p / "config.json").write_text("{}"), "names no model_type or architectures"),
        (lambda p: (p / "model.safetensors").unlink(), "holds no weights"),
        (lambda p: (p / "tokenizer.json").unlink(), "holds no tokenizer"),
    ],
)
def test_a_directory_that_is_not_a_model_says_why(tmp_path: Path, damage, problem: str) -> None:
    model = write_model(tmp_path / "m")
    damage(model)
    assert problem in (sources.model_dir_problem(model) or "")


def test_missing_and_non_directory_paths(tmp_path: Path) -> None:
    assert "does not exist" in (sources.model_dir_problem(tmp_path / "nope") or "")
    (tmp_path / "file").write_text("x")
    assert "is not a directory" in (sources.model_dir_problem(tmp_path / "file") or "")


def test_a_builtin_nobody_built_is_built_by_the_replicas_where_the_builder_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """KubeRay runs the app builder on the head and the replicas on other pods: a builtin the CLI did not
    build is handed to the replicas (name + absolute cache directory); a built one, a Hub id or a path is not."""
    from ebplus.deploy import app

    monkeypatch.chdir(tmp_path)
    base = {"replicas": {"accelerator": "cpu"}, "engine": {"cpu_kv_cache_gib": 1}}
    tiny = parse_config({**base, "model": {"id": "t", "source": "builtin:tiny", "cache_dir": "cache"}}, "args")
    hub = parse_config({**base, "model": {"id": "q", "source": "Qwen/Qwen3-8B"}}, "args")
    builds = app.replica_builds([tiny, hub], {})
    assert list(builds) == ["t"]
    assert builds["t"].args == ("tiny", tmp_path / "cache")  # absolute: resolved where the builder ran
    assert builds["t"].func.__name__ == "build_builtin"
    assert app.replica_builds([tiny], {"t": "/built/by/the/cli"}) == {}
    assert app.model_path(tiny) == str(tmp_path / "cache" / "tiny-llama-seed0")
    with pytest.raises(ValueError, match="unknown builtin model 'builtin:nope'"):
        from ebplus.deploy.models import build_builtin

        build_builtin("nope", tmp_path)
