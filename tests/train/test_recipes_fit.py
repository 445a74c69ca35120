"""Every shipped recipe of a real target fits the GPUs its header names: the memory estimate the trainer
prints and checks before a run (train/memory.py), for each launch command of the header (its accelerate
config's ZeRO stage, its process count, its key=value overrides), with the target's published config
built in code, is at most FIT of the GPU's memory (the rest for the CUDA context, the allocator's
fragmentation and the communication buffers). The GPU is read from the header (`GPUs: 8× H100 80GB`),
so header and check cannot drift."""

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from specheads.methods import methods
from specheads.train.memory import estimate_memory, meta_target
from specheads.train.recipe import load_config

from helpers import REAL_RECIPE_FAMILIES, recipe_header

REPO = Path(__file__).resolve().parents[2]
FIT = 0.9
GIB = 2**30  # a card's "80GB" read as GiB: an H100 80GB shows CUDA 79.6 GiB, an H200 141GB 140.4

# The targets' published config.json values (the sizes the estimate reads): model_type, hidden_size,
# intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads, vocab_size,
# tie_word_embeddings, and any other key the architecture needs.
CONFIGS = {
    "meta-llama/Llama-3.1-8B-Instruct": ("llama", 4096, 14336, 32, 32, 8, 128256, False, {}),
    "meta-llama/Llama-3.3-70B-Instruct": ("llama", 8192, 28672, 80, 64, 8, 128256, False, {}),
    "Qwen/Qwen2.5-7B-Instruct": ("qwen2", 3584, 18944, 28, 28, 4, 152064, False, {}),
    "Qwen/Qwen3-8B": ("qwen3", 4096, 12288, 36, 32, 8, 151936, False, {"head_dim": 128}),
    "mistralai/Mistral-7B-Instruct-v0.3": ("mistral", 4096, 14336, 32, 32, 8, 32768, False, {}),
    "smollm2": ("llama", 576, 1536, 30, 9, 3, 49152, True, {}),  # HuggingFaceTB/SmolLM2-135M-Instruct
}
FAMILIES = REAL_RECIPE_FAMILIES
RECIPES = sorted(p for f in FAMILIES for p in (REPO / "recipes" / f).glob("*.yaml"))
LAUNCH = re.compile(
    r"^#\s+(?:accelerate launch (?P<accel>.*?) -m specheads\.train|specheads train) (?P<rest>\S+\.yaml.*)$"
)


def gpus(text: str) -> tuple[int, str, int]:
    """(count, name, bytes) of the header's `GPUs: N× NAME MEMGB`."""
    (found,) = re.findall(r"GPUs: (\d+)× (\S+) (\d+)GB\b", text)
    return int(found[0]), found[1], int(found[2]) * GIB


def zero_stage_of(accelerate_config: str) -> int:
    """0 for a DDP config, else its DeepSpeed file's ZeRO stage."""
    raw = yaml.safe_load((REPO / accelerate_config).read_text())
    if raw["distributed_type"] != "DEEPSPEED":
        return 0
    ds = json.loads((REPO / raw["deepspeed_config"]["deepspeed_config_file"]).read_text())
    return ds["zero_optimization"]["stage"]


def launches(text: str) -> list[tuple[int, int, list[str]]]:
    """(processes, ZeRO stage, key=value overrides) of every GPU launch command in the header: accelerate
    launches, and `specheads train` runs that are not the CPU's (--threads) on one process."""
    found = []
    for line in text.splitlines():
        m = LAUNCH.match(line)
        if not m:
            continue
        args = shlex.split(m["rest"])[1:]
        if "--threads" in args:
            continue  # the CPU run
        overrides = [a for a in args if "=" in a and not a.startswith("-")]
        if m["accel"] is None:
            found.append((1, 0, overrides))
            continue
        accel = shlex.split(m["accel"])
        config = accel[accel.index("--config_file") + 1]
        processes = int(accel[accel.index("--num_processes") + 1])
        found.append((processes, zero_stage_of(config), overrides))
    return found


@pytest.fixture(scope="module")
def targets():
    from transformers import AutoConfig

    cache = {}

    def target(name):
        if name not in cache:
            kind, hidden, inter, layers, heads, kv, vocab, tied, extra = CONFIGS[name]
            config = AutoConfig.for_model(
                kind, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=kv, vocab_size=vocab, tie_word_embeddings=tied,
                **extra,
            )  # fmt: skip
            cache[name] = (config, meta_target(config))
        return cache[name]

    return target


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_recipe_fits_the_gpus_its_header_names(path, targets):
    text = recipe_header(path)
    count, name, memory = gpus(text)
    runs = launches(text)
    assert runs, f"{path}: its header gives no GPU launch"
    table = methods()
    for processes, stage, overrides in runs:
        assert processes == count, (path, processes, count)
        cfg = load_config(path, overrides, methods=table)
        config, target = targets(cfg.target)
        estimate = estimate_memory(
            cfg, table[cfg.method], config, processes=processes, zero_stage=stage, device_type="cuda",
            target=target,
        )  # fmt: skip
        assert estimate.peak <= FIT * memory, (
            f"{path.name} {' '.join(overrides)} on {processes}× {name} (ZeRO-{stage}): "
            f"{estimate.peak / GIB:.1f} GiB a process, over {FIT:.0%} of {memory / GIB:.0f} GiB\n{estimate.table()}"
        )


def test_every_real_recipe_and_launch_is_checked():
    """Each family's four methods, each header's online launch and (where it gives one) offline launch."""
    assert [p.parent.name for p in RECIPES] == [f for f in sorted(FAMILIES) for _ in methods()]
    counts = {p.relative_to(REPO).as_posix(): len(launches(recipe_header(p))) for p in RECIPES}
    offline = {p for p, n in counts.items() if "medusa2" not in p and "smollm2" not in p}
    assert all(n == (2 if p in offline else 1) for p, n in counts.items()), counts


def test_a_recipe_too_large_for_its_gpus_is_caught(targets):
    """Llama-3.1-8B's Medusa-1 at 4 rows of 2,048 tokens a GPU: five heads of fp32 logits over 128,256
    tokens do not fit an H100 even under ZeRO-2 (2 rows do)."""
    path = REPO / "recipes" / "llama-3.1-8b" / "medusa.yaml"
    count, _, memory = gpus(recipe_header(path))
    config, target = targets("meta-llama/Llama-3.1-8B-Instruct")
    peaks = {}
    for rows in (4, 2):
        cfg = load_config(path, [f"batch_size={rows}"], methods=methods())
        peaks[rows] = estimate_memory(
            cfg, methods()["medusa"], config, processes=count, zero_stage=2, device_type="cuda", target=target
        ).peak
    assert peaks[4] > memory > FIT * memory >= peaks[2]
