#!/usr/bin/env bash
# On the build machine (network, the dev venv active), from the repository root: fill the
# ignored folder .gpu/ with what a GPU machine without network needs (benchmarks/GPU_RUNBOOK.md):
#   .gpu/qwen2_tokenizer/  the Qwen2 tokenizer (../shared does not travel)
#   .gpu/wheels/           pydantic and its needs (cp311 and cp312), our five pure-Python packages
#   .gpu/site143/          comlrl==1.4.3 installed into a plain folder (its PYTHONPATH side)
# and check that it stays under the 64 MiB a device call carries.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .gpu && mkdir -p .gpu/wheels .gpu/site143
cp -r ../shared/data/qwen2_tokenizer .gpu/qwen2_tokenizer
for py in 3.11 3.12; do
  pip download -q --no-deps --only-binary=:all: --python-version "$py" \
    --platform manylinux2014_x86_64 -d .gpu/wheels \
    pydantic pydantic-core annotated-types typing-inspection
done
pip wheel -q --no-deps -w .gpu/wheels packages/comlrl-core packages/comlrl-estimators \
  packages/comlrl-algos packages/comlrl-envs packages/comlrl-compat
pip install -q --no-deps --target .gpu/site143 comlrl==1.4.3
du -sh .gpu
test "$(du -sm .gpu | cut -f1)" -lt 64
