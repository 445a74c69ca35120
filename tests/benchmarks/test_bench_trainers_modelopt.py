"""benchmarks/bench_trainers.py's EAGLE-3 side against NVIDIA Model Optimizer (bench_trainers_modelopt.py): its
budget, its job (the recipe overrides, the CPU or GPU, our layers and vocabulary) and our ablations that take
its settings (no training here: tests/consumers/test_modelopt.py runs it). Split from test_bench_trainers.py."""

import json

import pytest

from benchmarks import bench_trainers as bench
from benchmarks import bench_trainers_jobs as jobs
from benchmarks import bench_trainers_modelopt as modelopt
from specheads.methods import methods
from specheads.train.recipe import load_config


def test_eagle3_budget_is_modelopt_trainers_steps_with_its_last_short_batch_dropped():
    """Its recipe sets dataloader_drop_last: an epoch is floor(rows / batch) steps; ours the same steps."""
    b = modelopt.eagle3_budget(32, 10, 4)
    assert (b["steps"], b["batch"], b["grad_accum"], b["rows_seen"]) == (80, 4, 1, 320)
    short = modelopt.eagle3_budget(30, 2, 4)
    assert (short["steps"], short["rows_seen"], short["peer_rows"]) == (14, 56, 30)


TINY_LAYER = {"intermediate_size": 352, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 64,
              "rms_norm_eps": 1e-6}  # fmt: skip


def modelopt_ctx(tmp_path, layer: dict = TINY_LAYER, eagle3_layers: tuple = (1, 2, 3)) -> dict:
    """What modelopt_job reads: a target folder with `layer` as its config.json, and our recipe's layers."""
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(bench.json.dumps(layer))
    return {
        "target": target,
        "rows_path": tmp_path / "rows.jsonl",
        "max_length": 256,
        "eagle3_layers": list(eagle3_layers),
    }


def test_modelopt_job_is_its_recipe_with_the_budget_the_cpu_and_our_layers_and_vocabulary(tmp_path):
    import yaml

    budget = modelopt.eagle3_budget(32, 10, 4)
    ctx = modelopt_ctx(tmp_path)
    job = modelopt.modelopt_job(ctx, tmp_path / "w", budget, 2, "defaults", 557)
    overrides = dict(item.split("=", 1) for item in job["overrides"])
    assert (
        overrides["training.num_train_epochs"] == "10"
        and overrides["training.per_device_train_batch_size"] == "4"
    )
    assert overrides["training.seed"] == "2" and overrides["training.training_seq_len"] == "256"
    assert overrides["training.bf16"] == "false" and overrides["eagle.eagle_use_torch_compile"] == "false"
    assert (
        "training.learning_rate" not in overrides and "training.warmup_steps" not in overrides
    )  # its 1e-4, 1000
    arch = yaml.safe_load(overrides["eagle.eagle_architecture_config"])  # load_recipe parses values as YAML
    assert arch["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2] and arch["draft_vocab_size"] == 557
    assert (arch["intermediate_size"], arch["num_attention_heads"], arch["head_dim"]) == (352, 2, 64)
    assert overrides["data.draft_vocab_cache"] == job["draft_vocab_cache"] == str(tmp_path / "w" / "d2t.pt")
    assert job["export_rope_scaling"] == {}  # not the recipe's YaRN
    assert job["device_map"] == "cpu" and job["target_dtype"] == "auto"  # main.py's dtype: the config's
    tuned = modelopt.modelopt_job(ctx, tmp_path / "w", budget, 0, "lr 1e-3+warmup 10%", 557)
    assert "training.learning_rate=0.001" in tuned["overrides"]
    assert "training.warmup_steps=8" in tuned["overrides"]  # the HF Trainer's ceil(0.1 * 80)
    assert "engine_norm" not in job
    engine = modelopt.modelopt_job(ctx, tmp_path / "w", budget, 0, "lr 1e-3+engine norm", 557)
    assert engine["engine_norm"] is True  # a job field modelopt_train.py reads, not a recipe override
    assert (
        not any(o.startswith("job.") for o in engine["overrides"])
        and "training.learning_rate=0.001" in engine["overrides"]
    )
    (tmp_path / "whole").mkdir()
    whole_ctx = modelopt_ctx(tmp_path / "whole", {**TINY_LAYER, "vocab_size": 1000})
    whole = modelopt.modelopt_job(whole_ctx, tmp_path / "w", budget, 0, "whole vocab", 557)
    arch = yaml.safe_load(
        dict(item.split("=", 1) for item in whole["overrides"])["eagle.eagle_architecture_config"]
    )
    assert (
        whole["draft_vocab_size"] == arch["draft_vocab_size"] == 1000
    )  # its recipe's: no d2t, nothing calibrated
    assert whole["draft_vocab_cache"] is None and not any(
        "draft_vocab_cache" in o for o in whole["overrides"]
    )
    assert "whole_vocab" not in whole


def test_on_cuda_both_train_as_their_gpu_recipes_say_and_the_changes_say_so(tmp_path, monkeypatch):
    """--device cuda: modelopt keeps its recipe's bf16 and tf32 (no override), the target in bf16 and placed by
    its Trainer, torch.compile off as ours; ours gets its recipe's GPU overrides. Each side's changes name it."""
    budget = modelopt.eagle3_budget(32, 10, 4)
    job = modelopt.modelopt_job(modelopt_ctx(tmp_path), tmp_path / "w", budget, 0, "defaults", 557, "cuda")
    overrides = dict(item.split("=", 1) for item in job["overrides"])
    assert "training.bf16" not in overrides and "training.tf32" not in overrides
    assert overrides["eagle.eagle_use_torch_compile"] == "false"
    assert job["device_map"] is None and job["target_dtype"] == "bfloat16"
    smollm2 = {"intermediate_size": 1536, "num_attention_heads": 9, "num_key_value_heads": 3,
               "hidden_size": 576, "num_hidden_layers": 30}  # fmt: skip
    on_gpu, on_cpu = (modelopt.modelopt_changes(smollm2, [2, 15, 27], d) for d in ("cuda", "cpu"))
    assert any(c.startswith("CUDA: its recipe's bf16 and tf32") for c in on_gpu)
    assert not any("CPU fp32" in c for c in on_gpu) and any(c.startswith("CPU fp32") for c in on_cpu)
    assert len(on_gpu) == len(on_cpu)
    ran = []
    monkeypatch.setattr(jobs, "run_measured", lambda cmd, log, env=None: ran.append(cmd) or (1.0, 2.0))
    got = jobs.train_ours("eagle3", tmp_path / "rows.jsonl", budget, tmp_path / "ours", {}, "smollm2", "cuda")
    assert got["overrides"]["target_dtype"] == "bfloat16" and got["overrides"]["mixed_precision"] == "bf16"
    assert "target_dtype=bfloat16" in ran[0] and got["peak_accelerator_mib"] is None
    (tmp_path / "ours").mkdir()
    summary = {"peak_accelerator_bytes": [1048576, 3145728], "step_seconds": 0.25, "steps": 10}
    (tmp_path / "ours" / "train_summary.json").write_text(json.dumps(summary))
    got = jobs.train_ours("eagle3", tmp_path / "rows.jsonl", budget, tmp_path / "ours", {}, "smollm2", "cpu")
    assert "target_dtype" not in got["overrides"] and got["peak_accelerator_mib"] == 3.0
    assert got["loop_s"] == 2.5  # the steps alone, from the run's summary
    # ours trains its recipe's loss: SmolLM2's EAGLE-3 recipe puts it on every token, as modelopt does
    assert "loss_on" not in got["overrides"] and not any(a.startswith("loss_on=") for a in ran[-1])
    assert load_config(jobs.recipe_path("smollm2", "eagle3"), methods=methods()).loss_on == "all"
    # the tiny recipes' every-token loss is for plain text: on the bench's chat rows ours trains the answers
    jobs.train_ours("eagle3", tmp_path / "rows.jsonl", budget, tmp_path / "ours", {}, "tiny", "cpu")
    assert (
        "loss_on=assistant" in ran[-1]
        and load_config(jobs.recipe_path("tiny", "eagle3"), methods=methods()).loss_on == "all"
    )
    assert jobs.accelerator_mib([-1]) is None and jobs.accelerator_mib(None) is None


@pytest.mark.parametrize("target", ["tiny", "smollm2"])
def test_modelopt_fuses_our_recipes_layers_and_drafts_over_its_vocabulary_size(target):
    """Each target's EAGLE-3 recipe says which target layers both trainers fuse and how many tokens both draft
    over (the bench lowers both to the rows' distinct tokens when fewer)."""
    import yaml

    recipe = jobs.recipe_path(target, "eagle3")
    config = yaml.safe_load(recipe.read_text())
    layers, vocab = modelopt.recipe_eagle3(recipe)
    assert (layers, vocab) == (config["eagle3"]["layers"], config["eagle3"]["draft_vocab_size"])
    assert config["target"] == target and config["method"] == "eagle3"


def test_modelopt_aux_layers_are_ours_counted_from_zero_and_its_default_is_named():
    """modelopt counts decoder layers from 0 where HF's hidden_states count the embedding as 0: our HF ids
    1, 2, 3 are its 0, 1, 2. On SmolLM2 (30 layers) our recipe's 2, 15, 27 are its own default 1, 14, 26."""
    assert modelopt.default_aux_layers(4) == [0, 1] and modelopt.default_aux_layers(30) == [1, 14, 26]
    smollm2 = {"intermediate_size": 1536, "num_attention_heads": 9, "num_key_value_heads": 3,
               "hidden_size": 576, "num_hidden_layers": 30}  # fmt: skip
    changes = modelopt.modelopt_changes(smollm2, [2, 15, 27])
    assert "aux layers [1, 14, 26] = ours' HF 2, 15, 27 (its default for 30 layers: [1, 14, 26])" in changes
    assert any(
        "intermediate 1536, 9 heads of 64, 3 KV heads" in c for c in changes
    )  # head_dim from the width
    assert len(changes) == len(modelopt.MODELOPT_CHANGES) + 2


def test_modelopt_job_reads_the_head_dim_from_the_width_when_the_config_has_none(tmp_path):
    smollm2 = {"intermediate_size": 1536, "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576,
               "rms_norm_eps": 1e-5}  # fmt: skip
    ctx = modelopt_ctx(tmp_path, smollm2, (2, 15, 27))
    job = modelopt.modelopt_job(ctx, tmp_path / "w", modelopt.eagle3_budget(8, 1, 4), 0, "defaults", 8192)
    arch = dict(item.split("=", 1) for item in job["overrides"])["eagle.eagle_architecture_config"]
    arch = bench.json.loads(arch)
    assert arch["head_dim"] == 64 and arch["eagle_aux_hidden_state_layer_ids"] == [1, 14, 26]


def test_an_unknown_modelopt_variant_stops_the_bench():
    with pytest.raises(SystemExit, match="lr 1e-2"):
        modelopt.modelopt_variant("defaults+lr 1e-2", modelopt.eagle3_budget(8, 1, 4))


def eagle3_recipe(target: str, overrides: dict):
    """`target`'s EAGLE-3 recipe with `overrides`, as the bench passes them to `specheads train`."""
    return load_config(
        jobs.recipe_path(target, "eagle3"), [f"{k}={v}" for k, v in overrides.items()], methods=methods()
    )


def test_eagle3_ablations_are_modelopts_settings_as_our_recipe_overrides():
    budget = modelopt.eagle3_budget(32, 30, 4)  # 240 steps
    assert modelopt.eagle3_ablation("loss all", budget) == {"loss_on": "all"}
    assert modelopt.eagle3_ablation("ttt 3+decay 0.9", budget) == {"ttt_steps": 3, "decay": 0.9}
    # modelopt's HF Trainer schedule: warm-up ceil(10% of the steps), then linear to 0
    got = modelopt.eagle3_ablation("linear+warmup 10%", budget)
    assert got == {"lr_schedule": "linear", "warmup_steps": 24, "warmup_ratio": 0.0}
    # over either recipe's own warm-up (the tiny one's steps, SmolLM2's ratio): 24 steps
    for target in ("tiny", "smollm2"):
        cfg = eagle3_recipe(target, got)
        assert cfg.warmup == 24
    recipe = jobs.recipe_path("smollm2", "eagle3")
    assert load_config(recipe, ["max_steps=96"], methods=methods()).warmup == 10  # its own tenth
    # its seeding: the draft's initial weights drawn with seed 0 whatever the run's seed, which orders the rows
    assert modelopt.eagle3_ablation("init seed 0", budget, seed=2) == {"seed": 0, "data_seed": 2}
    with pytest.raises(SystemExit, match="ttt 7"):  # an unknown ablation stops the bench
        modelopt.eagle3_ablation("ttt 7", budget)


def test_every_eagle3_ablation_is_a_valid_recipe_override():
    """Each name gives keys and values the SmolLM2 EAGLE-3 recipe takes (a typo would stop a bench run late)."""
    budget = modelopt.eagle3_budget(128, 3, 4)
    for name in modelopt.EAGLE3_ABLATIONS:
        overrides = modelopt.eagle3_ablation(name, budget, seed=1)
        eagle3_recipe("smollm2", overrides)
    assert modelopt.eagle3_ablation("muon+wd 0.1", budget) == {"optimizer": "muon", "weight_decay": 0.1}
    # no warm-up over the SmolLM2 recipe's tenth of the steps
    cfg = eagle3_recipe("smollm2", modelopt.eagle3_ablation("muon+warmup 0", budget))
    assert (cfg.warmup, cfg.optimizer) == (0, "muon")
    # the recipe starts its draft's head from the target's; "head init random" gives its runs before that
    assert eagle3_recipe("smollm2", {}).settings.draft_head_init == "target"
    assert (
        eagle3_recipe(
            "smollm2", modelopt.eagle3_ablation("head init random", budget)
        ).settings.draft_head_init
        == "random"
    )


def test_modelopt_pads_its_rows_to_the_longest_not_to_max_length(tmp_path, monkeypatch, tiny_target_dirs):
    """Its collator pads every row to training_seq_len: the bench gives it the longest row in the target's chat
    template (rounded up to a multiple of 8, at most --max-length), measured on the rows it trains on."""
    assert [modelopt.training_seq_len(n, 256) for n in (8, 100, 249, 256, 300)] == [8, 104, 256, 256, 256]
    assert modelopt.training_seq_len(323, 1024) == 328
    target = tiny_target_dirs["llama"]
    conversations = [("hi", "a short answer"), ("a longer question " * 3, "and a longer answer " * 4)]
    ctx = bench.data_context(target, conversations, tmp_path / "data", None, tmp_path / "env")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target)  # each row as modelopt's collator tokenizes it
    rows = [json.loads(line)["messages"] for line in ctx["rows_path"].open()]
    lengths = [len(tok.apply_chat_template(r, return_dict=True)["input_ids"]) for r in rows]
    assert (
        ctx["longest_chat_tokens"] == max(lengths) > min(lengths) and ctx["chat_tokens"] == sum(lengths) / 2
    )
    jobs_seen = []

    class Stop(Exception):
        pass

    def measured(cmd, log, env=None):
        jobs_seen.append(json.loads(open(cmd[-1]).read()))
        raise Stop  # the job is written: nothing to train here

    monkeypatch.setattr(modelopt, "run_measured", measured)
    monkeypatch.syspath_prepend(str(modelopt.ROOT / "tests" / "consumers"))  # as the bench puts it there
    args = bench.argparse.Namespace(out=tmp_path, max_length=256, device="cpu")
    budget = modelopt.eagle3_budget(2, 1, 1)
    ctx = {**modelopt_ctx(tmp_path), **ctx, "modelopt_env": tmp_path / "env"}
    with pytest.raises(Stop):
        modelopt.modelopt_row(budget, 0, "defaults", 64, args, ctx)
    overrides = dict(item.split("=", 1) for item in jobs_seen[0]["overrides"])
    assert max(lengths) < 256 and overrides["training.training_seq_len"] == str(-(-max(lengths) // 8) * 8)
    with pytest.raises(Stop):
        modelopt.modelopt_row(budget, 1, "defaults", 64, bench.argparse.Namespace(out=tmp_path, max_length=16,
                                                                                  device="cpu"), ctx)  # fmt: skip
    assert "training.training_seq_len=16" in jobs_seen[1]["overrides"]
