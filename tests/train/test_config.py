"""Recipes: YAML + key=value overrides, typed, unknown keys rejected."""

import inspect

import pytest
import torch

from specheads.methods import methods
from specheads.train.config import TrainConfig, load_config, parse_overrides
from specheads.train.objective import LOSS_SETTINGS, HeadsWithLoss, loss_settings


def test_yaml_and_overrides(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("method: medusa\nnum_heads: 3\nlr: 0.002\ndata: [a.jsonl, b.jsonl]\n")
    cfg = load_config(
        recipe, ["lr=3e-4", "share_lm_head=true", "max_steps=7", "data=c.jsonl"], methods=methods()
    )
    assert cfg.num_heads == 3 and cfg.lr == 3e-4 and cfg.share_lm_head is True and cfg.max_steps == 7
    assert cfg.data == ["c.jsonl"]
    assert load_config(recipe, methods=methods()).data == ["a.jsonl", "b.jsonl"]
    assert load_config(None, methods=methods()) == TrainConfig()


def test_unknown_keys_are_rejected_with_a_suggestion(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("num_head: 3\n")
    with pytest.raises(
        ValueError, match=r"unknown recipe key in .*r.yaml: 'num_head' \(did you mean 'num_heads'\?\)"
    ):
        load_config(recipe, methods=methods())
    with pytest.raises(ValueError, match="unknown recipe keys on the command line: 'lr_rate'.*'zzz'"):
        load_config(None, ["lr_rate=1", "zzz=2"], methods=methods())


@pytest.mark.parametrize(
    "override, message",
    [
        ("num_heads=two", "'num_heads' takes int, got 'two'"),
        ("num_heads=2.5", "'num_heads' takes int"),
        ("packing=maybe", "'packing' takes true/false"),
        ("num_heads=0", "num_heads must be >= 1"),
        ("method=hydra", "method must be one of"),
        ("labels=gold", "labels must be one of data, target, target-top1, got 'gold'"),
        ("mode=cached", "mode must be one of .'online', 'offline'., got 'cached'"),
        ("mode=offline", "mode 'offline' reads the hidden-state cache: set cache_dir"),
        (
            "report_to=tensorbord",
            "report_to names an unknown tracker 'tensorbord': the trackers are .*tensorboard",
        ),
        (
            "report_to=none,wandb",
            "report_to 'none' turns tracking off and cannot be given with other trackers",
        ),
        ("keep_checkpoints=-1", "keep_checkpoints must be >= 0"),
        ("save_every=-5", "save_every must be >= 0"),
        ("lambda0_schedule=cosine", "lambda0_schedule must be one of .'sine', 'linear', 'constant'."),
        ("lambda0_warmup=0", r"lambda0_warmup must be in \(0, 1\], got 0.0"),
        ("lora_r=0", "lora_r must be >= 1"),
        ("lr_schedule=step", r"lr_schedule must be one of \('cosine', 'linear'\), got 'step'"),
        ("data_seed=-2", "data_seed must be >= 0, or -1 for seed's, got -2"),
        ("lora_dropout=1", r"lora_dropout must be in \[0, 1\)"),
        ("max_bad_rows=2.5", r"a float max_bad_rows is a fraction of the rows, in \[0, 1\]; got 2.5"),
        ("max_bad_rows=-1", "max_bad_rows must be a count"),
        ("draft_arch=qwen3", "draft_arch must be 'llama' or 'target', got 'qwen3'"),
    ],
)
def test_bad_values_are_clear_errors(override, message):
    with pytest.raises(ValueError, match=message):
        load_config(None, [override], methods=methods())


def test_max_bad_rows_keeps_a_count_a_count():
    # 5 rows, not a fraction 5.0
    assert load_config(None, ["max_bad_rows=5"], methods=methods()).max_bad_rows == 5
    assert isinstance(load_config(None, ["max_bad_rows=5"], methods=methods()).max_bad_rows, int)
    assert load_config(None, ["max_bad_rows=0.1"], methods=methods()).max_bad_rows == 0.1
    assert TrainConfig().max_bad_rows == 0.01


def test_bad_recipe_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="recipe .*nope.yaml not found"):
        load_config(tmp_path / "nope.yaml", methods=methods())
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(ValueError, match="must be a mapping"):
        load_config(tmp_path / "list.yaml", methods=methods())
    with pytest.raises(ValueError, match="is not key=value"):
        parse_overrides(["lr"])


def test_run_keys_default_and_parse():
    cfg = load_config(None, methods=methods())
    assert (cfg.mode, cfg.cache_dir, cfg.resume, cfg.report_to, cfg.keep_checkpoints) == (
        "online",
        "",
        "",
        ["wandb"],
        0,
    )
    cfg = load_config(
        None, ["mode=offline", "cache_dir=/data/cache", "resume=auto", "report_to=none"], methods=methods()
    )
    assert (cfg.mode, cfg.cache_dir, cfg.resume, cfg.report_to) == (
        "offline",
        "/data/cache",
        "auto",
        ["none"],
    )


def test_medusa2_keys_default_and_parse():
    cfg = load_config(None, ["method=medusa2"], methods=methods())
    assert (cfg.lora_r, cfg.lora_alpha, cfg.lora_dropout, cfg.lr_adapter) == (32, 16.0, 0.0, 1e-4)
    assert (cfg.lambda0, cfg.lambda0_schedule, cfg.lambda0_warmup) == (0.2, "sine", 1.0)
    assert cfg.lora_target_modules == [
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    ]
    cfg = load_config(
        None,
        ["method=medusa2", "lora_target_modules=q_proj,v_proj", "lora_alpha=8", "lambda0=0.5"],
        methods=methods(),
    )
    assert cfg.lora_target_modules == ["q_proj", "v_proj"] and cfg.lora_alpha == 8.0 and cfg.lambda0 == 0.5


def test_medusa2_cannot_train_offline():
    """The adapters move the hidden states a cache would have frozen."""
    with pytest.raises(ValueError, match="method 'medusa2' trains LoRA adapters .* use mode 'online'"):
        load_config(None, ["method=medusa2", "mode=offline", "cache_dir=/data/cache"], methods=methods())
    assert (
        load_config(None, ["method=medusa", "mode=offline", "cache_dir=/data/cache"], methods=methods()).mode
        == "offline"
    )


def test_every_loss_setting_reaches_the_objective():
    """HeadsWithLoss takes the recipe's loss settings by name (loss_settings): each of its settings is a
    recipe key, and each recipe value arrives, so a new one cannot be left at its default."""
    params = inspect.signature(HeadsWithLoss).parameters
    keywords = {n for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert set(LOSS_SETTINGS) == keywords - {"capture_layers", "needs_logits"}
    overrides = {"decay": 0.7, "ttt_steps": 2, "eagle3_topk_loss": 10, "eagle3_topk_loss_weight": 0.5}
    cfg = load_config(None, {"method": "eagle3", **overrides}, methods=methods())
    model = HeadsWithLoss(torch.nn.Linear(1, 1), lambda *a: None, capture_layers=(), **loss_settings(cfg))
    for name in LOSS_SETTINGS:
        assert getattr(model, name) == getattr(cfg, name), name
    assert {name: getattr(model, name) for name in overrides} == overrides
