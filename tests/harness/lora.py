"""LoRA adapters for the builtin tiny model: random weights in PEFT's layout, made without PEFT.

A served adapter has to change what the model says, or a test cannot tell that the
request reached it: each adapter here perturbs every layer's query and value
projections with rank-``rank`` updates large enough to move the greedy tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

#: The tiny model's shape (``ebplus.deploy.models.tiny_llama_config``): hidden 128, 4 query / 2 KV heads, 2 layers.
HIDDEN, HEADS, KV_HEADS, LAYERS = 128, 4, 2, 2


def write_tiny_adapter(dest: Path, seed: int, rank: int = 8) -> Path:
    """``dest``: an adapter folder (``adapter_config.json`` + ``adapter_model.safetensors``) for ``builtin:tiny``."""
    import torch
    from safetensors.torch import save_file

    kv = KV_HEADS * HIDDEN // HEADS
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(LAYERS):
        for name, out in (("q_proj", HIDDEN), ("v_proj", kv)):
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{name}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, HIDDEN, generator=generator) * 0.5
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(out, rank, generator=generator) * 0.5
    dest.mkdir(parents=True, exist_ok=True)
    save_file(tensors, dest / "adapter_model.safetensors")
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": 2 * rank,
        "lora_dropout": 0.0,
        "target_modules": ["q_proj", "v_proj"],
        "bias": "none",
        "fan_in_fan_out": False,
        "base_model_name_or_path": "builtin:tiny",
    }
    (dest / "adapter_config.json").write_text(json.dumps(config, indent=1))
    return dest
