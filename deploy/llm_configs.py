"""Ray Serve LLM's own config, read as EB+ deployment configs: one :class:`ServeConfig` per model.

A Ray Serve LLM user already has a config: ``llm_configs`` (``LLMConfig`` fields:
``model_loading_config``, ``engine_kwargs``, ``deployment_config``, ``runtime_env``...),
alone (the ``args`` of ``build_openai_app``) or inside a Serve config file
(``applications: [{args: {llm_configs: ...}}]``, with ``http_options`` and
``proxy_location``). EB+ Serve reads that file as it is, plus an ``ebplus:`` section
for what is ours (``scheduler``, ``controller``, ``auth``, the EB+ keys of ``replicas``
and ``http``, ``ray``; ``models.<model_id>`` for one model's own). Each Ray field is
mapped by the tables below onto the schema's key, and the result is validated by
:func:`ebplus.deploy.config.validate` like a file in EB+ form: one validation, with
errors spelled the way the file spells the field (:class:`Origin`).

Every Ray field is honoured or refused with the reason (:data:`REFUSED`); none is
dropped. :func:`to_llm_form` is the reverse (``ebplus config migrate``).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ebplus import keys
from ebplus.deploy.config import SHARED_SECTIONS, ConfigError, ServeConfig, read_yaml, validate
from ebplus.replicas.config import EngineSection

#: One ``LLMConfig``'s fields (dotted) -> the schema's keys. A longer path wins over its prefix.
MODEL_KEYS: dict[str, str] = {
    "model_loading_config.model_id": "model.id",
    "model_loading_config.model_source": "model.source",
    "model_loading_config.tokenizer_source": "engine.extra.tokenizer",
    "accelerator_type": "replicas.accelerator_type",
    "accelerator_config.kind": "replicas.accelerator",
    "deployment_config.num_replicas": "replicas.num_replicas",
    "deployment_config.autoscaling_config": "replicas.autoscaling",
    "deployment_config.max_ongoing_requests": "replicas.max_ongoing_requests",
    "deployment_config.max_queued_requests": "replicas.max_queued_requests",
    "deployment_config.graceful_shutdown_timeout_s": "replicas.graceful_shutdown_timeout_s",
    "deployment_config.graceful_shutdown_wait_loop_s": "replicas.graceful_shutdown_wait_loop_s",
    "deployment_config.ray_actor_options.num_cpus": "replicas.num_cpus",
    "deployment_config.ray_actor_options.resources": "replicas.resources",
    "runtime_env.env_vars.VLLM_CPU_KVCACHE_SPACE": "engine.cpu_kv_cache_gib",
    "runtime_env": "replicas.runtime_env",
    "placement_group_config": "replicas.placement_group_config",
    "lora_config": "model.lora",
}
#: The application's own fields (``build_openai_app``'s ``LLMServingArgs``).
APP_KEYS: dict[str, str] = {
    "ingress_deployment_config.num_replicas": "http.ingress_replicas",
    "ingress_deployment_config.ray_actor_options.num_cpus": "http.ingress_num_cpus",
    "ingress_deployment_config.ray_actor_options.resources": "http.ingress_resources",
}
#: A Serve config file's own fields (the ``applications:`` form).
SERVE_KEYS: dict[str, str] = {
    "http_options.host": "http.host",
    "http_options.port": "http.port",
    "proxy_location": "http.proxy_location",
}
#: ``LLMConfig`` fields EB+ Serve cannot honour, with the reason.
REFUSED: dict[str, str] = {
    "server_cls": "EB+ Serve runs its own LLMServer subclass (the replica side of the EB+ scheduler)",
    "experimental_configs": "EB+ Serve sets Ray Serve LLM's experimental options itself (stream batching on CPU)",
    "callback_config": "EB+ Serve does not run Ray Serve LLM's model-initialisation callbacks",
}
#: ``LLMConfig`` fields EB+ Serve accepts only with the value it uses.
FIXED: dict[str, Any] = {"llm_engine": "vLLM", "log_engine_metrics": True}
#: What an ``applications[]`` entry may say (EB+ Serve builds and names its one application itself).
APPLICATION_FIXED: dict[str, Any] = {"name": "ebplus", "route_prefix": "/"}
BUILDERS = ("ray.serve.llm:build_openai_app", "ebplus.deploy.app:build_app")
#: Schema keys the ``ebplus:`` section takes per model (the rest of a model is Ray's).
PER_MODEL_SECTIONS = ("model", "scheduler", "replicas")
#: Engine keys of the schema that are vLLM engine arguments (``engine_kwargs`` carries them).
ENGINE_ARGS = tuple(name for name in EngineSection.model_fields if name not in ("extra", "cpu_kv_cache_gib"))


def is_llm_form(data: Mapping[str, Any]) -> bool:
    """Whether a parsed file is in Ray Serve LLM's form rather than EB+'s."""
    return "llm_configs" in data or "applications" in data


# --------------------------------------------------------------------------- where a key is spelled


@dataclass(frozen=True)
class Origin:
    """How one model's schema keys are spelled in the llm_configs file (for error messages).

    Args:
        index: the model's position in ``llm_configs``.
        model_id: its ``model_loading_config.model_id``.
        args: the path of the application's args (``applications[0].args.`` or ``""``).
        serve_file: whether the file is a Serve config (``http_options``, ``proxy_location``).
        overridden: schema paths this model sets in ``ebplus.models.<model_id>``.
    """

    index: int
    model_id: str
    args: str = ""
    serve_file: bool = False
    overridden: frozenset[tuple[str, ...]] = frozenset()

    def where(self, path: tuple[str, ...], any_model: bool = False) -> str:
        """The file's spelling of the schema path ``path`` (``any_model``: in whichever llm_configs entry)."""
        dotted = ".".join(path)
        model = f"{self.args}llm_configs[{'' if any_model else self.index}]"
        if path[:1] == ("engine",) and (path[1:2] == ("extra",) or (path[1:2] and path[1] in ENGINE_ARGS)):
            rest = path[2:] if path[1:2] == ("extra",) else path[1:]
            return ".".join((f"{model}.engine_kwargs", *rest))
        if path == ("engine",) or path == ("engine", "extra"):
            return f"{model}.engine_kwargs"
        tables = [(MODEL_KEYS, f"{model}."), (APP_KEYS, self.args)] + [(SERVE_KEYS, "")] * self.serve_file
        for table, prefix in tables:
            for ray, ours in sorted(table.items(), key=lambda item: -len(item[1])):
                if dotted == ours or dotted.startswith(ours + "."):
                    return prefix + ray + dotted[len(ours) :]
        for n in range(len(path), 0, -1):
            if path[:n] in self.overridden:
                return f"ebplus.models.{self.model_id}.{dotted}"
        return f"ebplus.{dotted}" if path else "ebplus"

    def anywhere(self, path: tuple[str, ...]) -> str:
        """Where a key belongs, in no model in particular (a shared ``ebplus`` key is every model's)."""
        return self.where(path, any_model=True)

    def rename(self, text: str) -> str:
        """``text`` with the schema's key names in it spelled as the file spells them."""
        pattern = r"\b(?:" + "|".join(ServeConfig.model_fields) + r")(?:\.\w+)+"
        return re.sub(pattern, lambda m: self.where(tuple(m.group(0).split("."))), text)


# --------------------------------------------------------------------------- reading the file


def parse(data: dict[str, Any], source: str, base_dir: Path) -> ServeConfig:
    """Validate an llm_configs file: the first model's :class:`ServeConfig`, the others in its ``models()``."""
    problems: list[str] = []
    args, serve, prefix = _application(data, problems)
    ebplus = _ebplus(data, args, problems, prefix)
    entries = args.get("llm_configs")
    if not isinstance(entries, list) or not entries:
        problems.append(f"{prefix}llm_configs: a list of one LLMConfig per model is required")
        entries = []
    shared = {name: copy.deepcopy(ebplus.get(name, {})) for name in SHARED_SECTIONS if name in ebplus}
    _take(args, APP_KEYS, shared, prefix, problems, {"llm_configs", "ebplus"}, "the application's args")
    if serve:
        _take(serve, SERVE_KEYS, shared, "", problems, {"applications", "ebplus"}, "a Serve config")
    per_model = ebplus.get("models", {})
    configs: list[ServeConfig] = []
    ids: dict[str, int] = {}
    for i, entry in enumerate(entries):
        where = f"{prefix}llm_configs[{i}]"
        llm = _llm_config(entry, base_dir, where, problems)
        mapped: dict[str, Any] = {}
        before = len(problems)
        _take(llm, MODEL_KEYS, mapped, f"{where}.", problems, {"engine_kwargs", *REFUSED, *FIXED}, "an LLMConfig")
        _engine_kwargs(llm.get("engine_kwargs", {}), mapped, where, problems)
        _refused(llm, where, problems)
        model = mapped.setdefault("model", {})
        if "id" not in model:
            problems.append(f"{where}.model_loading_config.model_id: required (the name requests ask for)")
        model.setdefault("source", model.get("id"))  # as Ray: no model_source, the model_id is the source
        model_id = str(model.get("id", ""))
        if model_id in ids:
            problems.append(
                f"{where}.model_loading_config.model_id: {model_id!r} is also llm_configs[{ids[model_id]}]'s"
            )
        ids[model_id] = i
        own = per_model.get(model_id) if isinstance(per_model, dict) else None
        own = own if isinstance(own, dict) else {}
        data_i = _merge(_merge({k: ebplus[k] for k in PER_MODEL_SECTIONS if k in ebplus}, own), mapped)
        origin = Origin(i, model_id, prefix, bool(serve), frozenset(_leaves(own)))
        if len(problems) > before:
            continue
        try:
            configs.append(validate({**data_i, **copy.deepcopy(shared)}, source, origin))
        except ConfigError as exc:
            problems.extend(str(exc).splitlines())
    for model_id in per_model if isinstance(per_model, dict) else ():
        if model_id not in ids:
            problems.append(
                f"ebplus.models.{model_id}: no llm_configs entry has this model_id{keys.did_you_mean(model_id, ids)}"
            )
    if problems:
        lines = (p if p.startswith(f"{source}: ") else f"{source}: {p}" for p in problems)
        raise ConfigError("\n".join(dict.fromkeys(lines)))  # a shared key's problem once, not once per model
    first = configs[0]
    first._more = tuple(configs[1:])
    return first


def _application(data: dict[str, Any], problems: list[str]) -> tuple[dict[str, Any], dict[str, Any], str]:
    """``(args, the Serve file's own fields, the args' path)``: a Serve file's one application, or the file itself."""
    if "applications" not in data:
        return data, {}, ""
    apps = data["applications"]
    if not isinstance(apps, list) or len(apps) != 1 or not isinstance(apps[0], dict):
        problems.append("applications: EB+ Serve runs one application (its models all in its llm_configs)")
        return {}, data, ""
    app = apps[0]
    for key, value in app.items():
        if key in APPLICATION_FIXED and value != APPLICATION_FIXED[key]:
            problems.append(
                f"applications[0].{key}: EB+ Serve deploys its application with {key} {APPLICATION_FIXED[key]!r} "
                f"(ebplus status and deploy find it by that); set it so or leave it out"
            )
        elif key == "import_path" and value not in BUILDERS:
            problems.append(f"applications[0].import_path: {value!r}: EB+ Serve builds {' or '.join(BUILDERS)}")
        elif key not in (*APPLICATION_FIXED, "import_path", "args"):
            problems.append(
                f"applications[0].{key}: not supported by EB+ Serve{keys.did_you_mean(key, ['args', 'import_path', *APPLICATION_FIXED])}"
            )
    args = app.get("args", {})
    if not isinstance(args, dict):
        problems.append("applications[0].args: must be a mapping (llm_configs: ...)")
        args = {}
    return args, data, "applications[0].args."


def _ebplus(data: dict[str, Any], args: dict[str, Any], problems: list[str], prefix: str) -> dict[str, Any]:
    """The ``ebplus:`` section (in the args, or at the top of a Serve file), with Ray's keys refused in it."""
    if "ebplus" in data and "ebplus" in args and data is not args:
        problems.append(f"ebplus: given twice (at the top and in {prefix}ebplus); keep one")
    ours = copy.deepcopy(args.get("ebplus", data.get("ebplus"))) or {}
    if not isinstance(ours, dict):
        problems.append("ebplus: must be a mapping (scheduler:, controller:, ...)")
        return {}
    allowed = (*PER_MODEL_SECTIONS, *SHARED_SECTIONS, "models")
    for key in ours:
        if key not in (*allowed, "engine"):
            problems.append(
                f"ebplus.{key}: unknown key{keys.did_you_mean(key, allowed) or '; ebplus takes ' + ', '.join(allowed)}"
            )
    if "engine" in ours:
        problems.append(
            f"ebplus.engine: engine settings are Ray's: set them in {prefix}llm_configs[].engine_kwargs "
            "(the CPU KV cache in runtime_env.env_vars.VLLM_CPU_KVCACHE_SPACE)"
        )
    models = ours.get("models", {})
    if not isinstance(models, dict):
        problems.append("ebplus.models: must map a model_id to its own ebplus keys")
    else:
        for model_id, own in models.items():
            if not isinstance(own, dict):
                problems.append(f"ebplus.models.{model_id}: must be a mapping (scheduler:, replicas:, model:)")
            for name in own if isinstance(own, dict) else ():
                if name not in PER_MODEL_SECTIONS:
                    problems.append(
                        f"ebplus.models.{model_id}.{name}: not a per-model section (it takes "
                        f"{', '.join(PER_MODEL_SECTIONS)}){_shared_hint(name)}"
                    )
            _owned_by_ray(own if isinstance(own, dict) else {}, f"ebplus.models.{model_id}.", prefix, problems)
    _owned_by_ray(ours, "ebplus.", prefix, problems, serve_file=prefix != "")
    return {k: v for k, v in ours.items() if k in allowed}


def _shared_hint(name: str) -> str:
    return f"; {name} is shared by all models: set it in ebplus.{name}" if name in SHARED_SECTIONS else ""


def _owned_by_ray(section: dict[str, Any], at: str, prefix: str, problems: list[str], serve_file: bool = False) -> None:
    """Refuse the schema keys a Ray field sets, saying which field."""
    tables = [(MODEL_KEYS, f"{prefix}llm_configs[]."), (APP_KEYS, prefix)] + [(SERVE_KEYS, "")] * serve_file
    for table, ray_prefix in tables:
        for ray, ours in table.items():
            if ours.startswith("engine."):
                continue
            head, _, key = ours.partition(".")
            if isinstance(section.get(head), dict) and key.split(".")[0] in section[head]:
                del section[head][key.split(".")[0]]
                problems.append(f"{at}{ours}: set by Ray Serve LLM's field {ray_prefix}{ray}; set that instead")


def _llm_config(entry: Any, base_dir: Path, where: str, problems: list[str]) -> dict[str, Any]:
    """One ``llm_configs`` entry: a mapping, or (as Ray allows) the path of a YAML file holding one."""
    if isinstance(entry, str):
        path = Path(entry).expanduser()
        try:
            entry = read_yaml(path if path.is_absolute() else base_dir / path)
        except ConfigError as exc:
            problems.append(f"{where}: {exc}")
            return {}
    if not isinstance(entry, dict):
        problems.append(f"{where}: an LLMConfig must be a mapping (model_loading_config: ...) or a file's path")
        return {}
    return copy.deepcopy(entry)


def _take(
    src: dict[str, Any],
    table: dict[str, str],
    dst: dict[str, Any],
    prefix: str,
    problems: list[str],
    elsewhere: set[str],
    what: str,
) -> None:
    """Move the fields of ``table`` from ``src`` into ``dst`` (at the schema's keys); anything left is refused."""
    src = copy.deepcopy(src)
    for ray, ours in sorted(table.items(), key=lambda item: -item[0].count(".")):
        found, value = _pop(src, ray.split("."))
        if found:
            if ours == "engine.cpu_kv_cache_gib" and isinstance(value, str):
                value = _number(value)
            _set(dst, ours.split("."), _pruned(value))
    reported: set[tuple[str, ...]] = set()
    for leaf in _leaves(src):
        if leaf[0] in elsewhere:
            continue
        depth = next(d for d in range(len(leaf)) if leaf[d] not in _children(table, leaf[:d]) or d == len(leaf) - 1)
        path = leaf[: depth + 1]
        if path in reported:
            continue
        reported.add(path)
        known = _children(table, path[:-1]) + (sorted(elsewhere) if not depth else [])
        close = keys.did_you_mean(path[-1], known)
        parent = ".".join(path[:-1]) or what
        problems.append(
            f"{prefix}{'.'.join(path)}: "
            + (f"unknown key{close}" if close else f"not supported by EB+ Serve ({parent} takes {', '.join(known)})")
            + _ours_hint(path[-1])
        )


def _children(table: dict[str, str], parent: tuple[str, ...]) -> list[str]:
    """The keys ``table`` knows right below ``parent``."""
    depth = len(parent)
    return sorted(
        {r.split(".")[depth] for r in table if tuple(r.split(".")[:depth]) == parent and r.count(".") >= depth}
    )


def _ours_hint(key: str) -> str:
    """Where an EB+ key that was put among Ray's fields belongs."""
    paths = keys.index(ServeConfig).get(key, [])
    places = [p for p in paths if p[0] in (*SHARED_SECTIONS, *PER_MODEL_SECTIONS)]
    return f"; an EB+ key: it belongs in {' or '.join('ebplus.' + '.'.join(p) for p in places)}" if places else ""


def _engine_kwargs(kwargs: Any, mapped: dict[str, Any], where: str, problems: list[str]) -> None:
    """``engine_kwargs`` onto ``engine``: the schema's typed keys, the rest in ``engine.extra``
    (checked against vLLM's ``EngineArgs`` by ``ebplus serve``, see :mod:`ebplus.deploy.check`)."""
    if not isinstance(kwargs, dict):
        problems.append(f"{where}.engine_kwargs: must be a mapping of vLLM engine arguments")
        return
    engine = mapped.setdefault("engine", {})
    for key, value in kwargs.items():
        if key in ENGINE_ARGS:
            engine[key] = value
        elif key in ("cpu_kv_cache_gib", "extra"):
            problems.append(
                f"{where}.engine_kwargs.{key}: not a vLLM engine argument"
                + ("; the CPU KV cache goes in runtime_env.env_vars.VLLM_CPU_KVCACHE_SPACE" if key != "extra" else "")
            )
        else:
            engine.setdefault("extra", {})[key] = value


def _refused(llm: dict[str, Any], where: str, problems: list[str]) -> None:
    for key, reason in REFUSED.items():
        if llm.get(key) is not None:
            problems.append(f"{where}.{key}: {reason}")
    for key, value in FIXED.items():
        if key in llm and llm[key] != value:
            problems.append(f"{where}.{key}: EB+ Serve runs with {value!r} only")


# --------------------------------------------------------------------------- dict helpers


def _pop(src: dict[str, Any], path: list[str]) -> tuple[bool, Any]:
    node = src
    for name in path[:-1]:
        node = node.get(name) if isinstance(node, dict) else None
    if not isinstance(node, dict) or path[-1] not in node:
        return False, None
    return True, node.pop(path[-1])


def _set(dst: dict[str, Any], path: list[str], value: Any) -> None:
    for name in path[:-1]:
        dst = dst.setdefault(name, {})
    dst[path[-1]] = value


def _leaves(tree: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The paths of the non-mapping values in ``tree`` (an empty mapping has none)."""
    if not isinstance(tree, dict):
        return [prefix] if prefix else []
    return [leaf for key, value in tree.items() for leaf in _leaves(value, (*prefix, str(key)))]


def _pruned(value: Any) -> Any:
    """``value`` without its empty mappings (what is left of a section whose fields moved elsewhere)."""
    if not isinstance(value, dict):
        return value
    return {k: _pruned(v) for k, v in value.items() if not (isinstance(v, dict) and not _pruned(v))}


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in over.items():
        out[key] = (
            _merge(out[key], value)
            if isinstance(value, dict) and isinstance(out.get(key), dict)
            else copy.deepcopy(value)
        )
    return out


def _number(text: str) -> Any:
    try:
        return float(text)
    except ValueError:
        return text  # the schema names it


# --------------------------------------------------------------------------- writing the file


def to_llm_form(cfg: ServeConfig) -> dict[str, Any]:
    """A Serve config file (``applications:`` form) that loads back into ``cfg``'s models.

    Only what differs from the schema's defaults is written; a field left out of an
    llm_configs file takes EB+ Serve's default, as in EB+'s own form.
    """
    shared = _dump(cfg, SHARED_SECTIONS)
    top: dict[str, Any] = {}
    args: dict[str, Any] = {}
    _give(shared, SERVE_KEYS, top)
    _give(shared, APP_KEYS, args)
    entries, remainders = [], []
    for model in cfg.models():
        ours = _dump(model, (*PER_MODEL_SECTIONS, "engine"))
        ours.setdefault("model", {}).update(id=model.model.id, source=model.model.source)
        entry: dict[str, Any] = {}
        _give(ours, MODEL_KEYS, entry)
        env = entry.get("runtime_env", {}).get("env_vars", {})
        if "VLLM_CPU_KVCACHE_SPACE" in env:  # Ray's env_vars are strings
            env["VLLM_CPU_KVCACHE_SPACE"] = f"{env['VLLM_CPU_KVCACHE_SPACE']:g}"
        engine = ours.pop("engine", {})
        kwargs = {**{k: v for k, v in engine.items() if k != "extra"}, **engine.get("extra", {})}
        if kwargs:
            entry["engine_kwargs"] = kwargs
        entries.append(entry)
        remainders.append(_pruned(ours))
    args["llm_configs"] = entries
    ebplus = {**(remainders[0] if all(r == remainders[0] for r in remainders) else {}), **_pruned(shared)}
    if any(r != remainders[0] for r in remainders):
        ebplus["models"] = {m.model.id: r for m, r in zip(cfg.models(), remainders, strict=True) if r}
    if ebplus:
        args["ebplus"] = ebplus
    app = {"name": APPLICATION_FIXED["name"], "route_prefix": "/", "import_path": BUILDERS[1], "args": args}
    return {**top, "applications": [app]}


def _dump(cfg: ServeConfig, sections: tuple[str, ...]) -> dict[str, Any]:
    return cfg.model_dump(mode="json", exclude_defaults=True, include=set(sections))


def _give(ours: dict[str, Any], table: dict[str, str], dst: dict[str, Any]) -> None:
    """Move the schema keys of ``table`` from ``ours`` to Ray's fields in ``dst`` (a section before its fields)."""
    for ray, key in sorted(table.items(), key=lambda item: item[0].count(".")):
        found, value = _pop(ours, key.split("."))
        if found:
            node = dst
            for name in ray.split(".")[:-1]:
                node = node.setdefault(name, {})
            last = ray.split(".")[-1]
            node[last] = _merge(node[last], value) if isinstance(node.get(last), dict) else value
