"""Every recipe under recipes/ is read by the trainer's own config reader and is what its header says:
known keys and values, a launch command that names this very file, an accelerate config that exists,
as many processes as the GPUs it asks for, EAGLE-3 layers inside the target's depth ((2, L//2, L-3) for
the real targets); it is configuration (40 lines at most, in the sectioned form, no message on loading)
and trains what it trained before the sections (recipe_values.json: the values each file set then); and
every accelerate config parses as accelerate reads it, with its DeepSpeed file."""

import dataclasses
import json
import re
import warnings
from pathlib import Path

import pytest
import yaml

from specheads.builders.tiny_target import TinyTargetConfig
from specheads.methods import methods
from specheads.train.config import RecipeKeyMoved, common_fields, settings_class
from specheads.train.recipe import load_config

from helpers import REAL_RECIPE_FAMILIES, recipe_header

METHODS = tuple(methods())  # the built-in methods: a recipe each per real target family

REPO = Path(__file__).resolve().parents[2]
RECIPES = sorted(p for p in (REPO / "recipes").glob("*/*.yaml") if p.parent.name != "accelerate")
ACCELERATE = sorted((REPO / "recipes" / "accelerate").glob("*.yaml"))
# Decoder layers of each target a recipe names (num_hidden_layers of its config.json).
DEPTHS = {
    "tiny": TinyTargetConfig.num_layers,
    "meta-llama/Llama-3.1-8B-Instruct": 32,
    "meta-llama/Llama-3.3-70B-Instruct": 80,
    "Qwen/Qwen2.5-7B-Instruct": 28,
    "Qwen/Qwen3-8B": 36,
    "mistralai/Mistral-7B-Instruct-v0.3": 32,
    "smollm2": 30,
}
REAL = REAL_RECIPE_FAMILIES


def relative(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def test_every_family_has_every_method():
    found = {relative(p) for p in RECIPES}
    missing = [f"recipes/{f}/{m}.yaml" for f in REAL for m in METHODS if f"recipes/{f}/{m}.yaml" not in found]
    assert not missing
    assert "recipes/tiny/medusa2.yaml" in found


@pytest.mark.parametrize("path", RECIPES, ids=relative)
def test_recipe_loads_and_its_header_launches_it(path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no moved key, no key of another method
        cfg = load_config(path, methods=methods())  # unknown keys and bad values raise here
    assert cfg.method in METHODS and path.stem.split("-")[0] == cfg.method
    assert cfg.data and all(isinstance(d, str) and d for d in cfg.data)
    text = recipe_header(path)
    launches = re.findall(r"(?:specheads train|-m specheads\.train) (\S+\.yaml)", text)
    assert launches, f"{relative(path)}: its header gives no launch command"
    # every command in the header runs this file, not a neighbour it was copied from
    named = launches + re.findall(r"specheads cache (\S+\.yaml)", text)
    assert set(named) == {relative(path)}, named
    for config in re.findall(r"--config_file (\S+)", text):
        assert (REPO / config).is_file(), f"{relative(path)} launches with {config}, which does not exist"

    assert cfg.target in DEPTHS, f"{relative(path)}: add {cfg.target!r}'s depth to DEPTHS"
    depth = DEPTHS[cfg.target]
    if cfg.method == "eagle3":
        assert len(cfg.settings.layers) == 3 and all(0 <= i <= depth for i in cfg.settings.layers)
    if cfg.target == "tiny":
        return
    if cfg.target == "smollm2":
        check_smollm2(path, cfg, text)
        return
    # a real target: launched on the GPUs the header asks for, in bf16, EAGLE-3 on the default layers
    (gpus,) = re.findall(r"# GPUs: (\d+)× \S+", text)
    processes = re.findall(
        r"accelerate launch --config_file \S+ --num_processes (\d+) -m specheads\.train", text
    )
    assert processes and set(processes) == {gpus}, (gpus, processes)
    assert f"({depth} decoder layers" in text
    assert (cfg.target_dtype, cfg.mixed_precision, cfg.mode) == ("bfloat16", "bf16", "online")
    if cfg.method == "eagle3":
        assert cfg.settings.layers == [2, depth // 2, depth - 3] and cfg.settings.draft_vocab_size == 32000
    if cfg.method in ("medusa", "medusa2"):
        assert (cfg.settings.num_heads, cfg.settings.num_layers, cfg.lr) == (5, 1, 1e-3)
    if cfg.method in ("eagle", "eagle3"):
        assert 3e-5 <= cfg.lr <= 1e-4 and cfg.max_length == 2048
    if depth >= 80:  # a 70B target does not fit whole on one 80 GB GPU: it must be sharded
        assert "zero3-sharded-target.yaml --num_processes" in text


def check_smollm2(path, cfg, text):
    """The offline real target: a CPU launch on a thread count, and a one-GPU launch in bf16; its data made
    by the commands the header gives; EAGLE-3 on (2, 15, 27) over 8,192 tokens."""
    assert re.search(rf"specheads train {re.escape(relative(path))} --threads \d\n", text)
    assert f"specheads train {relative(path)} target_dtype=bfloat16 mixed_precision=bf16" in text
    assert "(30 decoder layers" in text and cfg.target_dtype == "float32"
    (made,) = set(re.findall(r"specheads distill .*--out (\S+)", text))
    assert cfg.data == [made]
    if cfg.method == "eagle3":
        assert cfg.settings.layers == [2, 15, 27] and cfg.settings.draft_vocab_size == 8192
    if cfg.method == "medusa":
        assert not cfg.settings.share_lm_head  # a projection a head, as in the paper and medusa-llm
    if cfg.method == "medusa2":
        assert (
            cfg.settings.share_lm_head
        )  # one copy of the tied 49152-row projection beside the target's adapter


@pytest.mark.parametrize("path", RECIPES, ids=relative)
def test_recipe_is_configuration(path):
    """40 lines at most; the method's keys in its section; no measured figure, dated run or history."""
    text = path.read_text()
    assert len(text.splitlines()) <= 40, f"{relative(path)}: {len(text.splitlines())} lines"
    raw = yaml.safe_load(text)
    assert set(raw) - {f.name for f in common_fields()} <= {raw["method"]}, "a method key outside its section"
    for pattern in (
        r"\btau\b",
        r"\d+(\.\d+)? s a step",
        r"\d{4}-\d{2}-\d{2}",
        r"[+-]\d+(\.\d+)?%",
        r"\bmeasured\b",
    ):
        assert not re.search(pattern, text), f"{relative(path)}: {pattern} belongs to the benchmark records"


EXPECTED = json.loads((Path(__file__).parent / "recipe_values.json").read_text())


def test_every_recipe_is_pinned():
    assert sorted(EXPECTED) == sorted(relative(p) for p in RECIPES)


@pytest.mark.parametrize("path", RECIPES, ids=relative)
def test_recipe_trains_what_it_trained_before_the_sections(path):
    """The values each file set before the sections (flat, read as then, keys moved into their section)
    give the very config the sectioned file gives now."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecipeKeyMoved)
        before = load_config(None, EXPECTED[relative(path)], methods=methods())
    assert load_config(path, methods=methods()) == before


def test_docs_list_every_recipe_key_as_the_code_defines_it():
    """docs/recipes.md is the page recipe_docs writes from the dataclasses: every key, default and meaning,
    so it cannot drift from the code (`python -m specheads.methods.recipe_docs > docs/recipes.md` renews it)."""
    from specheads.methods.recipe_docs import COMMAND, markdown

    assert (REPO / "docs" / "recipes.md").read_text() == markdown(), f"run: {COMMAND}"
    sections = [settings_class(m) for m in methods().values()]
    for f in [*common_fields(), *(f for cls in sections for f in dataclasses.fields(cls))]:
        assert f.metadata.get("help"), f"recipe key {f.name} has no help"
        assert f"| `{f.name}` |" in markdown()


def test_recipes_write_to_their_own_output_dirs():
    dirs = [load_config(p, methods=methods()).output_dir for p in RECIPES]
    assert len(set(dirs)) == len(dirs)


@pytest.mark.parametrize("path", ACCELERATE, ids=relative)
def test_accelerate_config_parses(path):
    from accelerate.commands.config.config_args import ClusterConfig
    from accelerate.utils import DistributedType

    config = ClusterConfig.from_yaml_file(str(path))  # what `accelerate launch --config_file` reads
    assert f"accelerate launch --config_file {relative(path)} " in recipe_header(path)
    raw = yaml.safe_load(path.read_text())
    if config.distributed_type == DistributedType.DEEPSPEED:
        ds_file = REPO / raw["deepspeed_config"]["deepspeed_config_file"]
        ds = json.loads(ds_file.read_text())
        stage = ds["zero_optimization"]["stage"]
        assert stage in (2, 3) and ds["train_micro_batch_size_per_gpu"] == "auto"
        # a ZeRO-3 target is loaded partitioned (never whole on one process) and its heads gathered to save
        assert raw["deepspeed_config"]["zero3_init_flag"] == (stage == 3)
        assert stage != 3 or ds["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"]
    else:
        assert config.distributed_type == DistributedType.MULTI_GPU
