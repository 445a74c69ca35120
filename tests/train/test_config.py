"""Recipes: YAML + key=value overrides, typed, unknown keys rejected; the common keys at the top level,
each method's own in its section."""

import dataclasses
import warnings
from pathlib import Path

import pytest
import torch

from specheads.methods import methods
from specheads.methods.eagle3 import Eagle3Settings
from specheads.methods.medusa import MedusaSettings
from specheads.train.config import RecipeKeyMoved, TrainConfig
from specheads.train.objective import HeadsWithLoss
from specheads.train.recipe import config_from_record, load_config, parse_overrides


def quietly(recipe, overrides=()):
    """load_config, failing on any message (a moved key, another method's key)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return load_config(recipe, overrides, methods=methods())


def test_yaml_and_overrides(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("method: medusa\nmedusa: {num_heads: 3}\nlr: 0.002\ndata: [a.jsonl, b.jsonl]\n")
    cfg = quietly(recipe, ["lr=3e-4", "medusa.share_lm_head=true", "max_steps=7", "data=c.jsonl"])
    assert cfg.settings.num_heads == 3 and cfg.lr == 3e-4 and cfg.settings.share_lm_head is True
    assert cfg.max_steps == 7 and cfg.data == ["c.jsonl"]
    assert quietly(recipe).data == ["a.jsonl", "b.jsonl"]
    default = quietly(None)  # the settings come from the method table, which TrainConfig() alone has not
    assert default.settings == MedusaSettings() and TrainConfig().settings is None
    assert dataclasses.replace(default, settings=None) == TrainConfig()


def test_unknown_keys_are_rejected_with_a_suggestion(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("num_head: 3\n")
    with pytest.raises(
        ValueError, match=r"unknown recipe key in .*r.yaml: 'num_head' \(did you mean 'medusa.num_heads'\?\)"
    ):
        load_config(recipe, methods=methods())
    recipe.write_text("medusa:\n  num_head: 3\n")
    with pytest.raises(
        ValueError, match=r"unknown recipe key medusa.num_head in .*r.yaml: did you mean medusa.num_heads"
    ):
        load_config(recipe, methods=methods())
    with pytest.raises(ValueError, match="unknown recipe keys on the command line: 'lr_rate'.*'zzz'"):
        load_config(None, ["lr_rate=1", "zzz=2"], methods=methods())


@pytest.mark.parametrize(
    "override, message",
    [
        ("medusa.num_heads=two", "'medusa.num_heads' takes int, got 'two'"),
        ("medusa.num_heads=2.5", "'medusa.num_heads' takes int"),
        ("packing=maybe", "'packing' takes true/false"),
        ("medusa.num_heads=0", "medusa.num_heads must be >= 1"),
        ("method=hydra", "method must be one of"),
        ("medusa.labels=gold", "medusa.labels must be one of data, target, target-top1, got 'gold'"),
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
        ("medusa2.lambda0_schedule=cosine", "lambda0_schedule must be one of .'sine', 'linear', 'constant'."),
        ("medusa2.lambda0_warmup=0", r"medusa2.lambda0_warmup must be in \(0, 1\], got 0.0"),
        ("medusa2.lora_r=0", "medusa2.lora_r must be >= 1"),
        ("medusa2.lr_adapter=0", "medusa2.lr_adapter must be > 0"),
        ("lr_schedule=step", r"lr_schedule must be one of \('cosine', 'linear'\), got 'step'"),
        ("data_seed=-2", "data_seed must be >= 0, or -1 for seed's, got -2"),
        ("medusa2.lora_dropout=1", r"medusa2.lora_dropout must be in \[0, 1\)"),
        ("max_bad_rows=2.5", r"a float max_bad_rows is a fraction of the rows, in \[0, 1\]; got 2.5"),
        ("max_bad_rows=-1", "max_bad_rows must be a count"),
        ("eagle3.draft_arch=qwen3", r"eagle3.draft_arch must be one of \('llama', 'target'\), got 'qwen3'"),
    ],
)
def test_bad_values_are_clear_errors(override, message):
    section = override.split(".")[0] if "." in override.split("=")[0] else ""
    with pytest.raises(ValueError, match=message):
        load_config(None, [f"method={section}", override] if section else [override], methods=methods())


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
    s = quietly(None, ["method=medusa2"]).settings
    assert (s.lora_r, s.lora_alpha, s.lora_dropout, s.lr_adapter) == (32, 16.0, 0.0, 1e-4)
    assert (s.lambda0, s.lambda0_schedule, s.lambda0_warmup) == (0.2, "sine", 1.0)
    assert s.lora_target_modules == [
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    ]
    s = quietly(
        None,
        [
            "method=medusa2",
            "medusa2.lora_target_modules=q_proj,v_proj",
            "medusa2.lora_alpha=8",
            "medusa2.lambda0=0.5",
        ],
    ).settings
    assert s.lora_target_modules == ["q_proj", "v_proj"] and s.lora_alpha == 8.0 and s.lambda0 == 0.5


def test_medusa2_cannot_train_offline():
    """The adapters move the hidden states a cache would have frozen."""
    with pytest.raises(ValueError, match="method 'medusa2' trains LoRA adapters .* use mode 'online'"):
        load_config(None, ["method=medusa2", "mode=offline", "cache_dir=/data/cache"], methods=methods())
    assert (
        load_config(None, ["method=medusa", "mode=offline", "cache_dir=/data/cache"], methods=methods()).mode
        == "offline"
    )


def test_the_recipe_section_reaches_the_objective():
    """HeadsWithLoss holds the method's section itself, so every value the losses read is the recipe's."""
    overrides = {"decay": 0.7, "ttt_steps": 2, "topk_loss": 10, "topk_loss_weight": 0.5}
    cfg = quietly(None, {"method": "eagle3", "topk": 3, "eagle3": overrides})
    model = HeadsWithLoss(
        torch.nn.Linear(1, 1), lambda *a: None, capture_layers=(), topk=cfg.topk, settings=cfg.settings
    )
    assert model.settings == Eagle3Settings(**overrides) and model.topk == 3


def test_flat_method_keys_still_load_and_name_their_new_place(tmp_path):
    """A recipe written before the sections (method keys at the top level) trains the same, and says where
    each key lives now: in the file, and on the command line."""
    flat = tmp_path / "flat.yaml"
    flat.write_text(
        "method: eagle3\neagle3_layers: [1, 2, 3]\ndraft_vocab_size: 64\neagle3_noise: 0.1\nlr: 0.01\n"
    )
    sectioned = tmp_path / "sectioned.yaml"
    sectioned.write_text(
        "method: eagle3\nlr: 0.01\neagle3: {layers: [1, 2, 3], draft_vocab_size: 64, noise: 0.1}\n"
    )
    with pytest.warns(RecipeKeyMoved) as moved:
        old = load_config(flat, methods=methods())
    messages = [str(w.message) for w in moved]
    assert any("'eagle3_layers' in " in m and "use eagle3: {layers: ...}" in m for m in messages), messages
    assert any("'draft_vocab_size'" in m and "use eagle3: {draft_vocab_size: ...}" in m for m in messages)
    assert any("'eagle3_noise'" in m and "use eagle3: {noise: ...}" in m for m in messages)
    assert old == quietly(sectioned) and old.settings.layers == [1, 2, 3] and old.settings.noise == 0.1
    with pytest.warns(RecipeKeyMoved, match=r"'ttt_steps' on the command line .*use eagle3.ttt_steps=\.\.\."):
        assert load_config(sectioned, ["ttt_steps=2"], methods=methods()).settings.ttt_steps == 2
    # the section's own keys on the command line, one by one or as a mapping, over the file's
    assert quietly(sectioned, ["eagle3.draft_vocab_size=4096"]).settings.draft_vocab_size == 4096
    both = quietly(sectioned, ["eagle3={ttt_steps: 2, layers: [0, 1, 2]}"]).settings
    assert (both.ttt_steps, both.layers, both.draft_vocab_size) == (2, [0, 1, 2], 64)


def test_the_shipped_recipes_in_the_flat_form_load_as_the_sectioned_ones():
    """Two shipped recipes as they were written before the sections: the same configs as today's files."""
    repo = Path(__file__).resolve().parents[2]
    for name in ("eagle3", "medusa2"):
        with pytest.warns(RecipeKeyMoved):
            old = load_config(
                repo / "tests" / "train" / "old_recipes" / f"tiny-{name}.yaml", methods=methods()
            )
        assert old == quietly(repo / "recipes" / "tiny" / f"{name}.yaml")


@pytest.mark.parametrize(
    "text, message",
    [
        # an old key in the wrong section names its method's
        (
            "method: medusa\nmedusa: {draft_vocab_size: 8}\n",
            r"'draft_vocab_size' is read by method eagle3: use eagle3: \{draft_vocab_size: \.\.\.\}",
        ),
        (
            "method: medusa\nmedusa: {lora_r: 8}\n",
            r"'lora_r' is read by method medusa2: use medusa2: \{lora_r: \.\.\.\}",
        ),
        # a top-level name inside the section names the section's own
        (
            "method: eagle3\neagle3: {eagle3_noise: 0.1}\n",
            r"unknown recipe key eagle3.eagle3_noise in .*: use eagle3: \{noise: \.\.\.\}",
        ),
        ("method: eagle3\neagle3: {lr: 0.1}\n", r"every method reads 'lr': set it at the top level"),
        ("method: eagle\neagle: 0.1\n", r"'eagle' in .* is method eagle's section: it takes a mapping"),
    ],
)
def test_a_key_in_the_wrong_section_names_the_right_one(tmp_path, text, message):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_config(recipe, methods=methods())


def test_a_key_in_the_wrong_section_on_the_command_line():
    with pytest.raises(
        ValueError, match=r"medusa.draft_vocab_size on the command line: .* use eagle3.draft_vocab_size="
    ):
        load_config(None, ["medusa.draft_vocab_size=8"], methods=methods())


def test_another_methods_keys_do_nothing_and_say_so(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("method: eagle3\neagle3: {ttt_steps: 2}\n")
    with pytest.warns(
        UserWarning,
        match=r"recipe section 'eagle3' on the command line is read by method eagle3 only; method 'eagle' ignores it",
    ):
        cfg = load_config(None, ["method=eagle", "eagle3.ttt_steps=3"], methods=methods())
    assert cfg.method == "eagle" and not hasattr(cfg.settings, "ttt_steps")
    with pytest.warns(
        UserWarning,
        match=r"'ttt_steps' on the command line is read by method eagle3 only; method 'medusa' ignores it",
    ):
        load_config(None, ["ttt_steps=3"], methods=methods())


@pytest.mark.parametrize(
    "text, line, first, key",
    [
        ("method: medusa\nmax_steps: 120\nlr: 0.1\nmax_steps: 1000\n", 4, 2, "max_steps"),
        ("method: eagle3\neagle3:\n  ttt_steps: 2\n  decay: 0.9\n  ttt_steps: 3\n", 5, 3, "ttt_steps"),
        ("method: eagle3\neagle3: {ttt_steps: 2}\nlr: 0.1\neagle3: {decay: 0.9}\n", 4, 2, "eagle3"),
    ],
)
def test_a_key_set_twice_is_an_error_naming_the_file_and_line(tmp_path, text, line, first, key):
    recipe = tmp_path / "twice.yaml"
    recipe.write_text(text)
    with pytest.raises(
        ValueError,
        match=rf"recipe .*twice.yaml at line {line}: key '{key}' is set twice \(first at line {first}\); keep one",
    ):
        load_config(recipe, methods=methods())


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n# and another\n"])
def test_an_empty_recipe_is_an_error_naming_the_file(tmp_path, text):
    recipe = tmp_path / "empty.yaml"
    recipe.write_text(text)
    with pytest.raises(ValueError, match=r"recipe .*empty.yaml at line 1: the file sets no keys"):
        load_config(recipe, methods=methods())


def test_training_records_of_either_form_read_back_quietly():
    """A checkpoint records its recipe (config.json "training", trainer_state.json): flat before the sections,
    with notes beside it (the draft vocabulary as built, the step); both read back as the recipe trained."""
    cfg = quietly(None, {"method": "eagle3", "lr": 0.01, "eagle3": {"ttt_steps": 2, "draft_vocab_size": 300}})
    record = {**cfg.to_dict(), "target_resolved": "/x", "draft_vocab_size": 264, "step": 40}
    flat = {k: v for k, v in record.items() if k != "eagle3"} | {
        "eagle3_layers": [],
        "ttt_steps": 2,
        "lora_r": 32,
    }
    flat["draft_vocab_size"] = 300
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert config_from_record(record, methods=methods()) == cfg
        assert config_from_record(flat, methods=methods()) == cfg
    assert cfg.to_dict()["eagle3"] == dataclasses.asdict(cfg.settings) and "ttt_steps" not in cfg.to_dict()
