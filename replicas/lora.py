"""LoRA adapters of a Ray Serve LLM deployment, from object storage (Ray's loader) or a local directory.

Ray Serve LLM serves a model's adapters as ``<base model id>:<adapter>``: the ingress
routes such a request with Serve's model multiplexing, and the replica loads the
adapter into vLLM on first use (``lora_config.dynamic_lora_loading_path``, one
subdirectory per adapter, each with ``adapter_config.json``). Ray reads adapters from
S3, GCS or Azure only. On a cluster the natural home of adapters is also a mounted
volume (a PersistentVolumeClaim, an NFS share, the image), and on a laptop a folder:
a *local* loading path (absolute, or ``file://``) is read where it is, by the three
functions Ray lets a deployment replace, below; a remote one goes to Ray's own code.

* :class:`AdapterLoader` - the replica's loader (``LLMServer(model_downloader=...)``);
* :func:`adapter_metadata` - the ingress' ``/v1/models`` card of one adapter
  (``OpenAiIngress(_get_lora_model_metadata_func=...)``);
* :func:`adapter_ids` - the adapters ``/v1/models`` lists.

Ray's ``LoraConfig`` validates its path as remote; a local path is set on it after
validation (:func:`ray_lora_config`), which Ray's code then never reads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fastapi import HTTPException

# NOTE: Ray Serve LLM's LoRA types are private in ray 2.60 (pinned); the injection points are public
# arguments of LLMServer and OpenAiIngress.
from ray.llm._internal.common.models import global_id_manager
from ray.llm._internal.common.utils.lora_utils import get_base_model_id, get_lora_id, get_lora_model_ids
from ray.llm._internal.serve.core.configs.llm_config import DiskMultiplexConfig, LoraConfig
from ray.llm._internal.serve.utils.lora_serve_utils import LoraModelLoader, get_lora_model_metadata

from ebplus.replicas.config import LORA_ADAPTER_CONFIG, lora_local_adapters, lora_local_dir


def ray_lora_config(fields: dict[str, Any]) -> LoraConfig:
    """Ray's ``LoraConfig`` of ``fields`` (its own names), a local loading path kept as given."""
    path = fields.get("dynamic_lora_loading_path")
    if path is None or lora_local_dir(path) is None:
        return LoraConfig(**fields)
    validated = LoraConfig(**{**fields, "dynamic_lora_loading_path": None})
    return validated.model_copy(update={"dynamic_lora_loading_path": path.rstrip("/")})


def _adapter_config(folder: Path, model_id: str) -> dict[str, Any]:
    """The adapter's ``adapter_config.json``, or the 404 Ray answers for an adapter it cannot find."""
    config = folder / LORA_ADAPTER_CONFIG
    try:
        return json.loads(config.read_text())
    except FileNotFoundError:
        raise HTTPException(404, f"no LoRA adapter {get_lora_id(model_id)!r}: {config} does not exist") from None
    except (OSError, ValueError) as exc:
        raise HTTPException(404, f"LoRA adapter {get_lora_id(model_id)!r}: cannot read {config}: {exc}") from None


def _folder(base: Path, model_id: str) -> Path:
    """The adapter's folder under ``base``; an id that would leave ``base`` is not an adapter."""
    lora_id = get_lora_id(model_id)
    folder = base / lora_id
    if not lora_id or "/" in lora_id or lora_id in (".", ".."):
        raise HTTPException(404, f"no LoRA adapter {lora_id!r}: adapter names are folder names under {base}")
    return folder


async def adapter_metadata(model_id: str, base_path: str) -> dict[str, Any]:
    """What ``/v1/models`` says of adapter ``model_id`` (``base:adapter``), as Ray's own function does."""
    base = lora_local_dir(base_path)
    if base is None:
        return await get_lora_model_metadata(model_id, base_path)
    folder = _folder(base, model_id)
    config = _adapter_config(folder, model_id)
    return {
        "model_id": model_id,
        "base_model_id": get_base_model_id(model_id),
        "max_request_context_length": config.get("max_length"),
        "bucket_uri": str(folder),
    }


def adapter_ids(base_path: str, base_model_id: str) -> list[str]:
    """Every adapter under ``base_path`` as ``base_model_id:adapter`` (folders with an adapter config)."""
    base = lora_local_dir(base_path)
    if base is None:
        return get_lora_model_ids(dynamic_lora_loading_path=base_path, base_model_id=base_model_id)
    return [f"{base_model_id}:{name}" for name in lora_local_adapters(base)]


class AdapterLoader(LoraModelLoader):
    """Ray's adapter loader, reading a local loading path in place (no copy: it is already on this node)."""

    async def load_model_from_config(self, lora_model_id: str, llm_config: Any) -> DiskMultiplexConfig:
        base = lora_local_dir(llm_config.lora_config.dynamic_lora_loading_path)
        if base is None:
            return await super().load_model_from_config(lora_model_id, llm_config)
        if lora_model_id in self.disk_cache:
            return self.disk_cache[lora_model_id]
        folder = _folder(base, lora_model_id)
        config = _adapter_config(folder, lora_model_id)
        loaded = DiskMultiplexConfig(
            model_id=lora_model_id,
            max_total_tokens=config.get("max_length"),
            local_path=str(folder),
            lora_assigned_int_id=global_id_manager.next(),
        )
        self.disk_cache[lora_model_id] = loaded
        return loaded
