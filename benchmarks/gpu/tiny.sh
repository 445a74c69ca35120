# Stage 1: the CUDA path on the tiny target. With TRAIN=1, training steps in bf16 with sdpa for each
# method; else the heads carried in .gpu/c1/tinyheads (the quickstart's, trained
# on the CPU). Then the decoder against generate() on the GPU in fp32 and bf16 (greedy: identical N/N), and
# the decoder-efficiency benchmark. Also parks .gpu/c1/partA (the first part of the smollm2 wheel) for
# benchmarks/gpu/smollm2.sh. Results: $OUT/tiny.tgz (everything) and a summary at the end of the output.
set -u
source benchmarks/gpu/env.sh
cp .gpu/c1/partA /tmp/keep/partA &
cp -r .gpu/c1/cache/. /tmp/keep/cache/
DEV=${DEV:-cuda}; TRAIN_EXTRA=${TRAIN_EXTRA:-}
R=/tmp/res/tiny; mkdir -p $R
save() { tar czf $OUT/tiny.tgz -C /tmp/res tiny 2>/dev/null; }  # after every step: a killed stage still returns
trap save EXIT
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $R/gpu.txt
python3 - <<'PY' | tee $R/versions.txt
import torch, transformers, datasets, accelerate, specheads.version as v
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))
print("transformers", transformers.__version__, "datasets", datasets.__version__, "accelerate", accelerate.__version__, "specheads", v.__version__)
PY
for m in $([ "${TRAIN:-0}" = 1 ] && echo medusa eagle eagle3 medusa2); do
    start=$(date +%s.%N); X=""; [ $m = medusa2 ] && X="max_steps=100 eval_every=100"
    timeout -k 15 60 python3 -m specheads train recipes/tiny/$m.yaml $X $TRAIN_EXTRA target_dtype=bfloat16 mixed_precision=bf16 \
        attn_implementation=sdpa report_to=none output_dir=/tmp/runs/tiny-$m eval_batches=4 --no-progress \
        > $R/train-$m.log 2>&1
    echo "train $m rc=$? wall=$(python3 -c "import time;print(round(time.time()-$start,1))")s" | tee -a $R/summary.txt
    tail -n 4 $R/train-$m.log
    cp /tmp/runs/tiny-$m/metrics.jsonl $R/metrics-$m.jsonl 2>/dev/null
    cp /tmp/runs/tiny-$m/train_summary.json $R/summary-$m.json 2>/dev/null; save
done
H=""; TR=""
for m in medusa eagle eagle3; do  # Medusa-2's adapted target is another model: it is timed on its own below
    h=$(latest_heads /tmp/runs/tiny-$m); [ -n "$h" ] || h=$(latest_heads .gpu/c1/tinyheads/$m); [ -n "$h" ] || continue
    H="$H $h"; case $m in medusa) TR="$TR medusa-63";; *) TR="$TR dynamic-32";; esac
done
for dt in ${COMPARE_DTYPES:-float32 bfloat16}; do  # bf16 decodes slower on this target (README "On a GPU"): 75 s fell 1 prompt short
    timeout $([ $dt = bfloat16 ] && echo 110 || echo 75) python3 -m specheads compare --target tiny --heads $H --tree $TR \
        --prompts heldout --num-prompts ${NP:-8} --max-new-tokens ${NEW:-128} --device $DEV --dtype $dt --no-plots \
        --no-progress --out $R/compare-$dt > $R/compare-$dt.log 2>&1
    echo "compare $dt rc=$?" | tee -a $R/summary.txt
    grep -E "^\|" $R/compare-$dt/report.md 2>/dev/null | head -12
    tail -n 3 $R/compare-$dt.log; save
done
# the GPU's decoder efficiency in bf16 (the bar: >= 0.85); fp32 beside it, for comparison
MED=$(echo $H | cut -d' ' -f1)
if [ -z "${EFF_VOCABS+x}" ] && [ -f "$MED/label_counts.safetensors" ] && [ $(echo $H | wc -w) = 3 ]; then
    EFF_EXTRA_HEADS=$MED; EFF_EXTRA_TREES=medusa-63; EFF_VOCABS="0 1024 0 1024"
fi
for dt in ${EFF_DTYPES:-float32 bfloat16}; do
    # Medusa twice, over the whole vocabulary and over the 1,024 tokens its training labelled most (as on the CPU)
    timeout 60 python3 scripts/bench_efficiency.py --target tiny --heads $H ${EFF_EXTRA_HEADS:-} --tree $TR ${EFF_EXTRA_TREES:-} \
        ${EFF_VOCABS:+--draft-vocab $EFF_VOCABS} \
        --num-prompts ${NPE:-4} --max-new-tokens ${NEW:-96} --device $DEV --dtype $dt --out $R/efficiency-$dt.json \
        > $R/efficiency-$dt.log 2>&1
    echo "efficiency $dt rc=$?" | tee -a $R/summary.txt; cat $R/efficiency-$dt.md 2>/dev/null | head -8; save
done
# A/B: bf16 with cuDNN's SDPA backend left on (SPECHEADS_CUDNN_SDPA=1), which decode/step.py turns off: with it
# on, bf16 decoding was 4-7x slower than fp32 here (README "On a GPU")
SPECHEADS_CUDNN_SDPA=1 timeout 60 python3 scripts/bench_efficiency.py --target tiny --heads $H --tree $TR \
    --num-prompts ${NPE:-4} --max-new-tokens ${NEW:-96} --device $DEV --dtype bfloat16 \
    --out $R/efficiency-bfloat16-cudnn.json > $R/efficiency-bfloat16-cudnn.log 2>&1
echo "efficiency bfloat16 with cuDNN SDPA rc=$?" | tee -a $R/summary.txt; cat $R/efficiency-bfloat16-cudnn.md 2>/dev/null | head -6; save
M2=$(latest_heads /tmp/runs/tiny-medusa2)
if [ -n "$M2" ]; then
    timeout 45 python3 scripts/bench_efficiency.py --target tiny --heads $M2 --tree medusa-63 \
        --num-prompts ${NPE:-4} --max-new-tokens ${NEW:-96} --device $DEV --dtype float32 \
        --out $R/efficiency-medusa2-fp32.json > $R/efficiency-medusa2.log 2>&1
    echo "efficiency medusa2 rc=$?" | tee -a $R/summary.txt; cat $R/efficiency-medusa2-fp32.md 2>/dev/null
fi
wait
ls -la /tmp/keep
