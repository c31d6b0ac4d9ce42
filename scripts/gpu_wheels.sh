#!/usr/bin/env bash
# Downloads into ./.whl (git-ignored) the Python packages a GPU machine without network lacks, for CPython 3.12 on
# manylinux x86-64: trl, datasets, math-verify, DeepSpeed and their pure-Python dependencies. Run it from the repo
# root where the package index is reachable; then carry .whl/ to the GPU machine and run scripts/gpu_check.sh there
# (docs/gpu.md). The GPU image this targets has torch 2.11 (CUDA 13), transformers 5.17, accelerate 1.15, peft 0.21,
# numpy, pyarrow, fsspec, psutil, tqdm and packaging; everything else is fetched here (a package the image already
# has is shadowed by the carried one, which is harmless for these pure-Python wheels).
# DeepSpeed ships only an sdist: its wheel is built here against the local torch with no ops compiled
# (DS_BUILD_OPS=0); ZeRO-2/3 with torch's AdamW needs none, and any other op is JIT-built at run time.
set -euo pipefail
cd "$(dirname "$0")/.."
DEEPSPEED_VERSION="${DEEPSPEED_VERSION:-0.19.8}"  # supports torch 2.x up to 2.13 (built and imported here)
mkdir -p .whl
grep -qx '/.whl/' .gitignore || echo "warning: .whl/ is not git-ignored" >&2

# Binary wheels for the GPU machine's interpreter (not this one's): --python-version/--platform, no dependencies
# resolved (the list is explicit, so nothing the image already has is pulled in).
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any -d .whl \
  trl==1.16.0 datasets==5.2.0 dill==0.4.0 multiprocess==0.70.18 xxhash==3.6.0 \
  math-verify==0.9.0 latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2 transformers==5.23.0 \
  hjson==3.1.0 py-cpuinfo==9.0.0 msgpack==1.1.2 ninja==1.13.0 einops==0.8.1 \
  pydantic==2.12.5 pydantic-core==2.41.5 annotated-types==0.7.0 typing-inspection==0.4.2 \
  typing-extensions==4.15.0 "$@"

# DeepSpeed from its sdist, against this machine's torch, with no compiled ops: a py3-none-any wheel.
if ! ls .whl/deepspeed-"$DEEPSPEED_VERSION"-*.whl >/dev/null 2>&1; then
  DS_BUILD_OPS=0 python3 -m pip wheel -q --no-deps --no-build-isolation -w .whl "deepspeed==$DEEPSPEED_VERSION"
fi
ls -1 .whl
