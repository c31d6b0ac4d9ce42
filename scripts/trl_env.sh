#!/usr/bin/env bash
# Builds (or refreshes) a virtual environment with this project's dependencies but another TRL release, for CI's
# older-TRL stage (docs/trl-upgrade.md):
#
#   bash scripts/trl_env.sh VERSION [VENV]    # VENV: ~/.cache/trl-groupopt/trl-VERSION
#   VENV/bin/python -m pytest -q -p tests.trl_cpu_kernel tests/trainers    # as .ci/run's TRL 1.15.0 stage does
#
# The venv sees the calling python3's packages (`--system-site-packages`) and holds only what differs: `trl==VERSION`
# and this checkout, installed editable. pip reuses every other dependency it finds there that satisfies the project's
# and that TRL's requirements (transformers, accelerate, datasets, torch), so nothing large is downloaded; torch is
# asked for as 2.13.0 so that a missing torch resolves to the machine's local CPU build, never to the CUDA wheels.
# Rerunning it on an existing venv is cheap (pip finds everything satisfied) and picks up changed requirements.
set -euo pipefail
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: bash scripts/trl_env.sh VERSION [VENV]   (e.g. 1.15.0)" >&2
  exit 2
fi
version="$1"
repo="$(cd "$(dirname "$0")/.." && pwd)"
venv="${2:-$HOME/.cache/trl-groupopt/trl-$version}"
python="${PYTHON:-python3}"
export PIP_DISABLE_PIP_VERSION_CHECK=1

if [ -e "$venv" ] && [ ! -f "$venv/pyvenv.cfg" ]; then
  echo "$venv exists and is not a virtual environment: refusing to replace it" >&2
  exit 1
fi
if ! "$venv/bin/python" -c "" 2>/dev/null; then  # none yet, or its interpreter is gone
  echo "trl $version venv: building $venv on $("$python" -c 'import sys; print(sys.prefix)')"
  rm -rf "$venv"
  "$python" -m venv --system-site-packages "$venv"
  # A calling venv's own packages (python3 itself in a venv) are not the system site: list them on the new venv's path,
  # after its own site-packages, so its TRL and this checkout come first.
  "$python" - "$venv" <<'EOF'
import pathlib, site, sys
if sys.prefix != sys.base_prefix:
    new = pathlib.Path(sys.argv[1])
    target = next(new.glob("lib*/python*/site-packages"), None) or new / "Lib" / "site-packages"
    lines = [f"import site; site.addsitedir({p!r})" for p in site.getsitepackages() if p.startswith(sys.prefix)]
    (target / "_trl_groupopt_parent.pth").write_text("\n".join(lines) + "\n")
EOF
else
  echo "trl $version venv: refreshing $venv"
fi
"$venv/bin/python" -m pip install -q "torch==2.13.0" "trl==$version" -e "$repo[dev]"
"$venv/bin/python" - "$version" <<'EOF'
import importlib.metadata as m
import sys

import trl

want = sys.argv[1]
if trl.__version__ != want:
    sys.exit(f"trl {want} venv: `import trl` gives {trl.__version__} from {trl.__file__}, not {want}")
print(f"trl {want} venv:", ", ".join(f"{p} {m.version(p)}" for p in ("trl", "torch", "transformers", "accelerate")))
EOF
