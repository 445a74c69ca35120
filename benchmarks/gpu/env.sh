# Sourced by benchmarks/gpu/*.sh on the GPU machine (bare, offline, its own python3 with torch and
# transformers): installs the carried wheels once into /tmp/site, puts the repository on the path as
# `specheads`, and keeps what later stages on the same machine need under /tmp/keep.
#   .gpu/c1/whl/{a,b,c}/   datasets + dill + multiprocess, newest first (a needs pyarrow >= 24, b >= 21, c >= 15)
#   .gpu/c1/whl/*.whl      gguf (the smollm2 builder)
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export SPECHEADS_CACHE=/tmp/keep/cache
ROOT=$(pwd)
mkdir -p /tmp/keep/cache /tmp/pkg /tmp/res
[ -e /tmp/pkg/specheads ] || ln -s "$ROOT" /tmp/pkg/specheads
export PYTHONPATH=/tmp/pkg:/tmp/site
if [ ! -e /tmp/site/.done ] && [ -d .gpu/c1/whl ]; then
    for set in a b c; do
        rm -rf /tmp/site
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
            .gpu/c1/whl/$set/*.whl .gpu/c1/whl/*.whl 2>&1 | tail -2
        if python3 -c "import datasets; from datasets import List" 2>/dev/null; then
            echo "wheels: set $set"; touch /tmp/site/.done; break
        fi
    done
fi
spec() { python3 -m specheads "$@"; }
# the newest heads of a run: its final folder, else its latest whole checkpoint
latest_heads() {
    if [ -f "$1/model.safetensors" ]; then echo "$1"; return; fi
    ls -d "$1"/checkpoints/step-* 2>/dev/null | sort -t- -k2 -n | tail -1
}
# H and TR: the newest heads of ROOT/{medusa,eagle,eagle3} that exist, and a tree each (medusa-63 for
# Medusa, EAGLE_TREE for the EAGLE heads), in that order
heads_and_trees() {  # ROOT EAGLE_TREE
    H=""; TR=""
    local m h
    for m in medusa eagle eagle3; do
        h=$(latest_heads "$1/$m"); [ -n "$h" ] || continue
        H="$H $h"; case $m in medusa) TR="$TR medusa-63";; *) TR="$TR $2";; esac
    done
}
# Model Optimizer's carried wheels (prepare.sh --trainers): PART/mo and PART/extra kept in /tmp/keep, where
# trainers.sh installs them
park_wheels() {
    local d
    for d in mo extra data; do
        [ -d "$1/$d" ] && mkdir -p /tmp/keep/$d && cp "$1"/$d/* /tmp/keep/$d/
    done
    return 0
}
