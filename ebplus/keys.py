"""What to tell a user about a key a config schema does not know.

Shared by the deployment config (:mod:`ebplus.deploy.config`) and the plugin's
settings (:mod:`ebplus.replicas.settings`), so that every unknown key, at any
level, is answered the same way: where it belongs when it is valid elsewhere in
the schema (or is one of vLLM's engine arguments), else the closest key of its
own section ("did you mean"), else the keys that section has.

It lives apart from the layers (like :mod:`ebplus.errors`) because both the
deployment and the replica side use it; it imports pydantic only, never vLLM:
vLLM's argument names are passed in by the caller.
"""

from __future__ import annotations

import difflib
import typing
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

from pydantic import BaseModel


def did_you_mean(word: str, choices: Iterable[str], prefix: str = "") -> str:
    """`` (did you mean X?)`` for the closest of ``choices``, or ``""`` when none is close."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {prefix}{close[0]}?)" if close else ""


def _submodel(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model a field holds (``X``, ``X | None``), or ``None`` for a plain value."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _submodel(arg)
        if found is not None:
            return found
    return None


def section(root: type[BaseModel], path: Sequence[str]) -> type[BaseModel] | None:
    """The model class at ``path`` below ``root`` (``()``: root itself), or ``None`` past a plain value."""
    model: type[BaseModel] | None = root
    for name in path:
        field = model.model_fields.get(name) if model is not None else None
        model = _submodel(field.annotation) if field is not None else None
    return model


def index(root: type[BaseModel], prefix: tuple[str, ...] = ()) -> dict[str, list[tuple[str, ...]]]:
    """Every key of the schema by name: ``{"profile": [("replicas", "profile")], ...}``."""
    found: dict[str, list[tuple[str, ...]]] = {}
    for name, field in root.model_fields.items():
        found.setdefault(name, []).append((*prefix, name))
        sub = _submodel(field.annotation)
        if sub is not None:
            for key, paths in index(sub, (*prefix, name)).items():
                found.setdefault(key, []).extend(paths)
    return found


def unknown_key(
    root: type[BaseModel],
    loc: Sequence[str],
    *,
    engine_args: Collection[str] = (),
    engine_home: str = "engine.extra",
    name: Callable[[tuple[str, ...]], str] = ".".join,
) -> str:
    """The message for the unknown key at ``loc`` (its section's path, then the key).

    Args:
        root: the schema the key was validated against.
        loc: where the key was found, as pydantic reports it.
        engine_args: vLLM's engine argument names (empty: vLLM is not installed here).
        engine_home: where vLLM engine arguments go in this config's form.
        name: how a schema path where the key belongs is spelled in this user's form.
    """
    *parent, key = (str(p) for p in loc)
    model = section(root, parent)
    own = list(model.model_fields if model is not None else ())
    where = f"not an EB+ {'.'.join(parent)} key" if parent else "not an EB+ top-level key"
    elsewhere = [path for path in index(root).get(key, []) if path[:-1] != tuple(parent)]
    if elsewhere:
        return f"{where}; it belongs in {' or '.join(name(path) for path in elsewhere)}"
    if key in engine_args:
        return f"{where}; vLLM engine arguments go in {engine_home}"
    close = did_you_mean(key, own)
    if close:
        return f"unknown key{close}"
    if parent == ["engine"] and engine_args:
        close = did_you_mean(key, engine_args, f"{engine_home.split(' ')[0]}.")
        if close:
            return f"{where} nor a vLLM engine argument{close}"
    return f"unknown key; {name(tuple(parent)) if parent else 'the top level'} has {', '.join(own)}"
