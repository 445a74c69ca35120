# Stage 3, on the machine benchmarks/gpu/smollm2.sh left warm: the bf16 table on SmolLM2 with the heads and
# the assisted draft it trained (/tmp/sm): `compare` against generate(), prompt lookup and assisted generation,
# one MT-Bench question a category (first turns), NEW new tokens (default 128); first (AB=1, default) EAGLE-3's
# decoder efficiency with and without EAGLE-2's early stop. Results: $OUT/table.tgz.
set -u
source benchmarks/gpu/env.sh
DEV=${DEV:-cuda}; R=/tmp/res/table; mkdir -p $R
save() { tar czf $OUT/table.tgz -C /tmp/res table 2>/dev/null; }
trap save EXIT
[ -d /tmp/sm ] || { echo "fresh machine: /tmp/sm is gone (benchmarks/gpu/smollm2.sh first)"; exit 3; }
heads_and_trees /tmp/sm dynamic-60
DM=""; [ -f /tmp/sm/draft/config.json ] && DM="--draft-model /tmp/sm/draft"
# where a forward's time goes (generate() ran at about 30 tokens/s on this 135M model on an H100, 29-35 ms a
# one-token forward): the device's busy share of the baseline's step and of the tree forwards
timeout ${PROF_S:-60} python3 benchmarks/profile_forward.py --target smollm2 --device $DEV --dtype bfloat16 \
    --out $R/profile-bf16.json > $R/profile-bf16.log 2>&1
echo "profile bf16 rc=$?"; cat $R/profile-bf16.md 2>/dev/null; save
# A/B, EAGLE-3 alone (its bf16 efficiency): EAGLE-2's exact early stop reads each level's values back
# (a GPU sync a level); SPECHEADS_EAGLE_EARLY_STOP=0 grows every level instead (the same trees). Off is the
# default on CUDA (off was faster in 3 of 4 pairs on an H100); AB_S seconds a run
E3=$(latest_heads /tmp/sm/eagle3)
for stop in 1 0; do
    [ -n "$E3" ] && [ "${AB:-1}" = 1 ] || break
    SPECHEADS_EAGLE_EARLY_STOP=$stop timeout ${AB_S:-60} python3 scripts/bench_efficiency.py --target smollm2 --heads $E3 \
        --tree dynamic-60 --prompts /tmp/keep/mt-bench-8.jsonl --num-prompts 2 --max-new-tokens 64 --device $DEV \
        --dtype bfloat16 --out $R/efficiency-eagle3-stop$stop.json > $R/efficiency-eagle3-stop$stop.log 2>&1
    echo "efficiency eagle3 early stop=$stop rc=$?"; cat $R/efficiency-eagle3-stop$stop.md 2>/dev/null | tail -1; save
done
timeout ${CMP_S:-240} python3 -m specheads compare --target smollm2 --heads $H --tree $TR $DM \
    --prompts /tmp/keep/mt-bench-8.jsonl --max-turns 1 --max-new-tokens ${NEW:-128} --warmup 1 \
    --device $DEV --dtype bfloat16 --no-plots --no-progress --out $R/compare-bf16 > $R/compare-bf16.log 2>&1
echo "compare bf16 rc=$?"
grep -E "^\|" $R/compare-bf16/report.md 2>/dev/null | head -9; tail -n 3 $R/compare-bf16.log
