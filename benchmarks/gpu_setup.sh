#!/usr/bin/env bash
# On the GPU machine, from the repository root, with .gpu/ carried (benchmarks/gpu_prepare.sh
# made it; benchmarks/GPU_RUNBOOK.md): install pydantic and CoMLRL without network, building
# comlrl-kernels' CUDA module for the H100/H200 (sm_90), then print what is installed.
set -euo pipefail
python -V
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
pip install -q --no-deps --no-index --find-links .gpu/wheels \
  pydantic pydantic-core annotated-types typing-inspection
COMLRL_WITH_CUDA=ON CMAKE_CUDA_ARCHITECTURES=90 \
  pip install -q --no-deps --no-build-isolation ./packages/comlrl-kernels
pip install -q --no-deps --no-index --force-reinstall .gpu/wheels/comlrl_*.whl
python - <<'PY'
import torch, transformers, peft
import comlrl.algos, comlrl.kernels
from comlrl.kernels import _dispatch
print("torch", torch.__version__, "cuda", torch.version.cuda, "| transformers", transformers.__version__,
      "| peft", peft.__version__, "| kernels CUDA module:", _dispatch._cuda is not None)
PY
