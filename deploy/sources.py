"""Where a model comes from: ``model.source`` as a builtin, a local directory or a Hugging Face Hub id.

Accepted forms (the ways vLLM and Ray Serve LLM users name a model):

* ``builtin:smollm2`` / ``builtin:tiny`` - built locally by :mod:`ebplus.deploy.models`;
* ``Qwen/Qwen2.5-7B-Instruct`` - a Hub id, as ``vllm serve`` takes it;
* ``hf://Qwen/Qwen2.5-7B-Instruct`` - the same, explicitly a Hub id;
* a local Hugging Face directory (``/models/qwen``, ``./models/qwen``, ``~/qwen``).

A bare ``org/name`` is a local directory if one exists there, else a Hub id - the
rule vLLM and transformers apply. Hub models are downloaded by vLLM into the
Hugging Face cache (``HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
``~/.cache/huggingface/hub``); gated models need ``HF_TOKEN``; with
``HF_HUB_OFFLINE=1`` they must already be there.

Everything here is offline: syntax, the file system and the cache layout. Imports
neither vLLM nor the Hub client.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

BUILTIN_PREFIX = "builtin:"
HUB_PREFIX = "hf://"
BUILTINS = ("smollm2", "tiny")

# one part of a Hub id: letters, digits, '-', '_', '.'; at most 96; no leading or trailing
# '-' or '.'; no '--' or '..' (the Hub's naming rules)
_PART = r"(?!.*(?:--|\.\.))[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"
_HUB_ID = re.compile(rf"^(?:{_PART}/)?{_PART}$")
_LOCAL_PREFIXES = ("/", "./", "../", "~", ".")

#: Files that hold weights in a Hugging Face model directory.
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf")
#: Files any of which provides a tokenizer.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tiktoken.model", "tokenizer_config.json")


class Kind(StrEnum):
    BUILTIN = "builtin"
    LOCAL = "local"
    HUB = "hub"


@dataclass(frozen=True)
class ModelSource:
    """A parsed ``model.source``.

    Attributes:
        kind: builtin, local directory or Hub id.
        name: the builtin's name, the directory (as written) or the Hub id (without ``hf://``).
    """

    kind: Kind
    name: str

    def for_vllm(self) -> str:
        """What vLLM's ``model`` argument takes: an absolute directory or a Hub id."""
        if self.kind is Kind.LOCAL:
            return str(Path(self.name).expanduser().resolve())
        if self.kind is Kind.HUB:
            return self.name
        raise ValueError(f"builtin model {self.name!r} has no path until it is built")


def is_hub_id(text: str) -> bool:
    """Whether ``text`` is a well-formed Hub id (``name`` or ``org/name``)."""
    return bool(_HUB_ID.match(text)) and not text.endswith(".git")


def parse(source: str) -> ModelSource:
    """The kind of ``source`` from its syntax and whether a directory of that name exists.

    Raises:
        ValueError: an unknown builtin, a malformed ``hf://`` id, or a string that is
            neither an existing directory nor a Hub id.
    """
    if source.startswith(BUILTIN_PREFIX):
        name = source.removeprefix(BUILTIN_PREFIX)
        if name not in BUILTINS:
            raise ValueError(
                f"unknown builtin model {source!r}; choose one of {', '.join(BUILTIN_PREFIX + b for b in BUILTINS)}"
            )
        return ModelSource(Kind.BUILTIN, name)
    if source.startswith(HUB_PREFIX):
        repo = source.removeprefix(HUB_PREFIX)
        if not is_hub_id(repo):
            raise ValueError(f"{source!r} is not a Hugging Face Hub id (hf://org/name)")
        return ModelSource(Kind.HUB, repo)
    if source.startswith(_LOCAL_PREFIXES) or Path(source).expanduser().exists() or not is_hub_id(source):
        return ModelSource(Kind.LOCAL, source)
    return ModelSource(Kind.HUB, source)


def hub_cache(env: Mapping[str, str] | None = None) -> Path:
    """The Hugging Face Hub cache directory the engine will use (same precedence as the Hub client)."""
    env = os.environ if env is None else env
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    cache = Path(env["XDG_CACHE_HOME"]).expanduser() if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return cache / "huggingface" / "hub"


def offline(env: Mapping[str, str] | None = None) -> bool:
    """Whether ``HF_HUB_OFFLINE`` forbids downloads."""
    env = os.environ if env is None else env
    return env.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def cached_snapshot(repo_id: str, revision: str = "main", env: Mapping[str, str] | None = None) -> Path | None:
    """The cached snapshot directory of a Hub model, or ``None`` if it is not in the cache.

    The cache layout: ``models--{org}--{name}/refs/{revision}`` holds a commit hash and
    ``snapshots/{hash}/`` the files (a revision may also be a commit hash itself).
    """
    repo = hub_cache(env) / ("models--" + repo_id.replace("/", "--"))
    ref = repo / "refs" / revision
    try:
        commit = ref.read_text().strip() if ref.is_file() else revision
    except OSError:
        return None
    snapshot = repo / "snapshots" / commit
    return snapshot if snapshot.is_dir() else None


def model_dir_problem(path: Path, need_tokenizer: bool = True) -> str | None:
    """Why ``path`` is not a loadable Hugging Face model directory, or ``None`` if it looks like one."""
    if not path.exists():
        return f"{path} does not exist"
    if not path.is_dir():
        return f"{path} is not a directory"
    config = path / "config.json"
    try:
        data = json.loads(config.read_text())
    except FileNotFoundError:
        return f"{path} has no config.json (not a Hugging Face model directory)"
    except (OSError, ValueError) as exc:
        return f"{config} is not readable JSON ({exc})"
    if not isinstance(data, dict) or not ("model_type" in data or "architectures" in data):
        return f"{config} names no model_type or architectures"
    if not any(next(path.glob(pattern), None) for pattern in WEIGHT_PATTERNS):
        return f"{path} holds no weights ({', '.join(WEIGHT_PATTERNS)})"
    if need_tokenizer and not any((path / name).is_file() for name in TOKENIZER_FILES):
        return f"{path} holds no tokenizer ({', '.join(TOKENIZER_FILES)}); set engine.extra.tokenizer"
    return None


def model_config(path: Path) -> dict:
    """The model's ``config.json`` (``{}`` if unreadable: :func:`model_dir_problem` reports that)."""
    try:
        data = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
