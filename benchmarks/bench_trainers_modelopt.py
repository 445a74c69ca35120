"""The EAGLE-3 row of benchmarks/bench_trainers.py: NVIDIA Model Optimizer's side (the budget, the recipe
overrides of tests/consumers/modelopt_train.py's job, what they change, and one run of it imported and
decoded).

modelopt's examples/speculative_decoding/main.py trains with the HF Trainer over its recipe
(modelopt_recipes/general/speculative_decoding/eagle3.yaml: lr 1e-4, warm-up 1000 steps then linear decay,
batch 1, 1 epoch, 3 training-time-test steps with loss decay 0.9, self-logit distillation, 2048-token rows,
bf16, torch.compile); the bench runs it at our budget (eagle3_budget) with the overrides of modelopt_job.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from benchmarks.bench_trainers_jobs import (
    ROOT,
    accelerator_mib,
    evaluate,
    import_heads,
    load_average,
    message_rows,
    row_result,
    run_measured,
)

# Model Optimizer 0.47.0's EAGLE-3 recipe (modelopt_recipes/general/speculative_decoding/eagle3.yaml, what
# examples/speculative_decoding/main.py trains with), less what cannot run here or must match ours: each
# override below is listed among the row's changes (MODELOPT_CHANGES). The draft layer is the target's
# (ours: Eagle3Head's stock layer); the recipe's is a Llama-3-8B layer (14336, 32 x 128, 8 KV heads).
MODELOPT = "modelopt 0.47.0"
MODELOPT_LOGGING = {"training.report_to": "none", "training.disable_tqdm": True, "training.logging_steps": 1}
MODELOPT_CPU = {**MODELOPT_LOGGING, "training.bf16": False, "training.tf32": False,
                "eagle.eagle_use_torch_compile": False}  # fmt: skip
# On a GPU its recipe's bf16 and tf32 stay; torch.compile is off as ours never compiles (a compile's minutes
# would be most of a short GPU run, and neither side's tokens/s would then be its training's).
MODELOPT_CUDA = {**MODELOPT_LOGGING, "eagle.eagle_use_torch_compile": False}
WHERE = {
    "cpu": "CPU fp32: bf16, tf32 and eagle_use_torch_compile false (recipe: true); logging_steps 1, report_to none",
    "cuda": "CUDA: its recipe's bf16 and tf32, the target loaded in bf16 (main.py: dtype auto; this build's "
    "config says float32, the hub's bfloat16); eagle_use_torch_compile false (recipe: true; ours does not "
    "compile either); logging_steps 1, report_to none",
}


def warmup_like_hf(steps: int, ratio: float) -> int:
    """The HF Trainer's warm-up steps for a ratio: ceil(ratio * steps)."""
    return max(1, math.ceil(ratio * steps))


def joined_overrides(names: str, table: dict, flag: str, *args, nothing: tuple[str, ...] = ()) -> dict:
    """The overrides of a '+'-joined list of `table`'s names, each entry called with `args` (a budget, and
    for some tables a seed); a name not in `table` (nor in `nothing`, which adds none) stops the bench,
    naming `flag`."""
    out = {}
    for name in names.split("+"):
        if name in nothing:
            continue
        if name not in table:
            raise SystemExit(f"{flag}: {name!r} is not one of {list(table)}")
        out |= table[name](*args)
    return out


def joined_help(what: str, table: dict) -> str:
    """argparse help for a flag taking comma-separated lists of '+'-joined `table` names."""
    return f"{what}: comma-separated, each one or several of {list(table)} joined by '+'".replace("%", "%%")


# modelopt with one or more ('+'-joined) of our recipe's settings, to see what its defaults cost in this
# budget (its warm-up of 1000 steps at lr 1e-4 never ends here): recipe overrides at a budget.
MODELOPT_VARIANTS = {
    "lr 1e-3": lambda b: {"training.learning_rate": 1e-3},  # ours
    "lr 2e-3": lambda b: {"training.learning_rate": 2e-3},  # ours' best at 240 steps (--eagle3-ablations)
    # the HF Trainer's warm-up for a ratio, ceil(0.1 * steps), as medusa-llm's; its recipe: 1000 steps
    "warmup 10%": lambda b: {"training.warmup_steps": warmup_like_hf(b["steps"], 0.1)},
    # not a recipe setting but a change to its training forward (a job field, "job." keys): its layer 0
    # normalises the fused state once, as its export's readers (vLLM, SGLang, our decoder) do, where its own
    # forward normalises it twice (modelopt_run.EmbedsOnlyNorm)
    "engine norm": lambda b: {"job.engine_norm": True},
    # its recipe's own draft vocabulary, the target's whole vocabulary (no calibration, no d2t), in place of a
    # calibrated one the size of ours
    "whole vocab": lambda b: {"job.whole_vocab": True},
}
MODELOPT_CHANGES = [
    "the steps of its examples/speculative_decoding (calibrate_draft_vocab.py, main.py, export_hf_checkpoint.py) "
    "with the wheel's functions in tests/consumers/modelopt_train.py (the scripts are not in the wheel): its "
    "recipe eagle3.yaml, HF Trainer and export, without the example's accuracy-logging Trainer subclass and "
    "plot callback; HfTrainingArguments.__module__ set (Python 3.11's make_dataclass leaves 'types', which "
    "the Trainer's final save cannot pickle)",
    WHERE["cpu"],
    "num_train_epochs E, per_device_train_batch_size B for the budget (recipe: 1, 1); training_seq_len "
    "the longest row in the target's chat template rounded up to a multiple of 8, at most --max-length "
    "(recipe: 2048; its collator pads every row to it; --max-length itself before 2026-12-04)",
    "draft vocabulary the size of ours, by its calibrate_frequent_vocab over the rows (recipe: the whole "
    "vocabulary), its ids put in id order before training (as ours keeps them)",
    "exported without the recipe's YaRN rope_scaling (factor 32, on a draft trained without it; its "
    "`eagle_export_rope_scaling={}` override merges into the default and keeps it)",
    "decoded as vLLM and SGLang read its export: layer 0 normalises the fused state once, where its training "
    "forward normalised it twice (tests/consumers/modelopt_run.py)",
    "answer_only_loss false kept (its loss on every token of the chat, as our SmolLM2 recipe's since "
    "2026-11-28; ours on the answer's on the tiny target); seed S is its "
    "training.seed (data order), main.py seeds the draft's initial weights with 0",
]


def recipe_eagle3(recipe: Path) -> tuple[list[int], int]:
    """Our EAGLE-3 recipe's target layers (HF hidden_states ids) and draft-vocabulary size: modelopt is given
    the same (its aux layer ids count decoder layers from 0, so HF id l is its l - 1)."""
    import yaml

    config = yaml.safe_load(recipe.read_text())
    section = config["eagle3"]  # the recipe's EAGLE-3 keys
    return [int(i) for i in section["layers"]], int(section["draft_vocab_size"])


def default_aux_layers(num_layers: int) -> list[int]:
    """modelopt's own aux layers for a target of `num_layers` (hf_eagle.py's default_eagle_aux_layer_ids)."""
    return sorted({1, max(0, num_layers // 2 - 1), max(0, num_layers - 4)})


def draft_layer_shape(target_config: dict) -> dict:
    """The draft layer's shape modelopt is given: the target's (head_dim from the width where the config has
    none, as HF's Llama derives it)."""
    c = target_config
    return {"intermediate_size": c["intermediate_size"], "num_attention_heads": c["num_attention_heads"],
            "num_key_value_heads": c["num_key_value_heads"],
            "head_dim": c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]}  # fmt: skip


def modelopt_changes(target_config: dict, hf_layers: list[int], device: str = "cpu") -> list[str]:
    """MODELOPT_CHANGES with what depends on the target (its draft layer's size and the aux layers) and on
    the device (WHERE)."""
    c, aux, shape = target_config, [i - 1 for i in hf_layers], draft_layer_shape(target_config)
    return [
        MODELOPT_CHANGES[0],
        WHERE[device],
        MODELOPT_CHANGES[2],
        f"the draft layer sized to the target's (intermediate {shape['intermediate_size']}, "
        f"{shape['num_attention_heads']} heads of {shape['head_dim']}, {shape['num_key_value_heads']} KV heads, "
        "fp32; recipe: an 8B layer)",
        f"aux layers {aux} = ours' HF {', '.join(map(str, hf_layers))} (its default for "
        f"{c['num_hidden_layers']} layers: {default_aux_layers(c['num_hidden_layers'])})",
        *MODELOPT_CHANGES[3:],
    ]


def eagle3_budget(rows: int, epochs: int, batch: int) -> dict:
    """modelopt's main.py (HF Trainer, dataloader_drop_last true in its recipe, no accumulation) for `epochs`
    epochs over `rows` at `batch`, and ours at its optimizer steps and batch."""
    steps = epochs * (rows // batch)
    return {"peer_rows": rows, "epochs": epochs, "batch": batch, "grad_accum": 1, "steps": steps,
            "rows_seen": steps * batch}  # fmt: skip


def modelopt_job(
    ctx: dict, work: Path, budget: dict, seed: int, variant: str, draft_vocab: int, device: str = "cpu"
) -> dict:
    """modelopt_train.py's job: main.py's recipe overrides (a dotlist, as its command line takes them), and
    where the target loads (`device`: cpu in fp32, cuda in bf16)."""
    layer = json.loads((ctx["target"] / "config.json").read_text())
    variant_overrides = modelopt_variant(variant, budget)
    # variants that change modelopt_train.py's run rather than the recipe: "job." keys, fields of the job
    job_fields = {
        k[4:]: variant_overrides.pop(k) for k in [k for k in variant_overrides if k.startswith("job.")]
    }
    whole_vocab = job_fields.pop("whole_vocab", False)
    if whole_vocab:
        draft_vocab = layer["vocab_size"]
    arch = {**draft_layer_shape(layer), "rms_norm_eps": layer["rms_norm_eps"], "torch_dtype": "float32",
            "draft_vocab_size": draft_vocab,
            "eagle_aux_hidden_state_layer_ids": [i - 1 for i in ctx["eagle3_layers"]]}  # fmt: skip
    overrides = {
        "model.model_name_or_path": str(ctx["target"]),
        "data.data_path": str(ctx["rows_path"]),
        **({} if whole_vocab else {"data.draft_vocab_cache": str(work / "d2t.pt")}),
        "training.output_dir": str(work / "ckpt"),
        "training.num_train_epochs": budget["epochs"],
        "training.per_device_train_batch_size": budget["batch"],
        "training.training_seq_len": ctx["max_length"],
        "training.seed": seed,
        **(MODELOPT_CUDA if device == "cuda" else MODELOPT_CPU),
        "eagle.eagle_architecture_config": arch,
        **variant_overrides,
    }
    dotlist = [f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in overrides.items()]
    return {**job_fields, "target": str(ctx["target"]), "data": str(ctx["rows_path"]), "work": str(work), "overrides": dotlist,
            "draft_vocab_size": draft_vocab, "draft_vocab_cache": None if whole_vocab else str(work / "d2t.pt"),
            "export_rope_scaling": {},
            # on a GPU the Trainer moves the model there, as in main.py; here it stays on the CPU
            "device_map": None if device == "cuda" else "cpu",
            "target_dtype": "bfloat16" if device == "cuda" else "auto"}  # fmt: skip


def modelopt_variant(names: str, budget: dict) -> dict:
    """The recipe overrides of a '+'-joined list of MODELOPT_VARIANTS names ("defaults": none)."""
    return joined_overrides(names, MODELOPT_VARIANTS, "--modelopt-variants", budget, nothing=("", "defaults"))


# Ours at an EAGLE-3 budget with one (or several, '+'-joined) of modelopt's recipe settings in place of our
# recipe's: what each difference buys in tau (recipe overrides at a budget b for a run's seed s;
# --eagle3-ablations). The last ones are not modelopt's settings: ours tuned further, and the seeds apart.
EAGLE3_ABLATIONS = {
    "loss all": lambda b, s: {"loss_on": "all"},  # its answer_only_loss false: every token of the chat
    "ttt 3": lambda b, s: {"ttt_steps": 3},  # its eagle_ttt_steps; ours 5
    "decay 0.9": lambda b, s: {"decay": 0.9},  # its eagle_loss_decay_factor; ours 0.8
    "linear": lambda b, s: {"lr_schedule": "linear"},  # its Trainer's lr_scheduler_type; ours cosine to 0.1
    # the warm-up of modelopt's variant "warmup 10%" (ceil(0.1 * steps)), whatever our recipe's warm-up (the
    # tiny one's 20 steps; SmolLM2's warmup_ratio 0.1 already)
    "warmup 10%": lambda b, s: {"warmup_steps": warmup_like_hf(b["steps"], 0.1), "warmup_ratio": 0.0},
    "ttt 2": lambda b, s: {"ttt_steps": 2},
    "ttt 4": lambda b, s: {"ttt_steps": 4},
    "decay 1": lambda b, s: {"decay": 1.0},
    "decay 0.5": lambda b, s: {"decay": 0.5},  # the first draft step weighted more (where tau comes from)
    "lr 2e-3": lambda b, s: {"lr": 2e-3},
    "lr 3e-3": lambda b, s: {"lr": 3e-3},
    "lr 4e-3": lambda b, s: {"lr": 4e-3},
    "lr 5e-4": lambda b, s: {"lr": 5e-4},
    "lr 1e-3": lambda b, s: {"lr": 1e-3},
    # the initial weights drawn with seed s, the rows in one order whatever s
    "data seed 0": lambda b, s: {"data_seed": 0},
    # modelopt's seeding: main.py draws the draft's initial weights with seed 0 whatever its training.seed,
    # which orders the rows only
    "init seed 0": lambda b, s: {"seed": 0, "data_seed": s},
    # modelopt's draft layer's rope theta (its default_config, whatever the target's; SmolLM2's is 100000)
    "rope 1e4": lambda b, s: {"draft_rope_theta": 10000.0},
    # ours only: the draft's lm_head and norm start from the target's (neither peer does; the SmolLM2 recipe
    # since 2026-12-06, so "head init random" gives its earlier runs)
    "head init target": lambda b, s: {"draft_head_init": "target"},
    "head init random": lambda b, s: {"draft_head_init": "random"},
    "beta2 0.95": lambda b, s: {"adam_beta2": 0.95},  # EAGLE's main.py; ours and modelopt's 0.999
    # AdamW's decoupled weight decay (ours and modelopt's Trainer: 0): 30 epochs of 32 rows overfit
    "wd 0.01": lambda b, s: {"weight_decay": 0.01},
    "wd 0.1": lambda b, s: {"weight_decay": 0.1},
    # ours only: EAGLE-1's U(-a, a) feature noise on the captured layers (neither EAGLE-3 trainer adds any)
    "noise 0.1": lambda b, s: {"eagle3_noise": 0.1},
    "noise 0.3": lambda b, s: {"eagle3_noise": 0.3},
    "noise 1": lambda b, s: {"eagle3_noise": 1.0},
    # ours only: the labels' temperature (both trainers: 1, the target's distribution over the draft
    # vocabulary; the SmolLM2 recipe: 1.5 since 2026-12-05, so "teacher T 1" gives its earlier runs).
    # 0: the target's top token as a hard label (on Medusa, hard labels bought 1.5% on SmolLM2)
    "top1": lambda b, s: {"eagle3_teacher_temperature": 0.0},
    "teacher T 1": lambda b, s: {"eagle3_teacher_temperature": 1.0},
    "teacher T 1.5": lambda b, s: {"eagle3_teacher_temperature": 1.5},
    "teacher T 2": lambda b, s: {"eagle3_teacher_temperature": 2.0},
    "teacher T 3": lambda b, s: {"eagle3_teacher_temperature": 3.0},
    "teacher T 4": lambda b, s: {"eagle3_teacher_temperature": 4.0},
    # modelopt's: positions whose target token is outside the draft vocabulary are trained too, against the
    # target's distribution renormalised over it (ours: left out)
    "train oov": lambda b, s: {"eagle3_out_of_vocab": "train"},
    # ours only: torch's Muon on the draft's hidden matrices, AdamW on its lm_head and norms (train/optimizers.py):
    # Muon at 8 x lr, the product's default, or at the rate named ('+lr 4e-3' moves AdamW's part and Muon's)
    "muon": lambda b, s: {"optimizer": "muon"},
    # AdamW on every parameter at lr, as modelopt's Trainer (the recipe's Muon off)
    "adamw": lambda b, s: {"optimizer": "adamw"},
    "muon x1": lambda b, s: {"optimizer": "muon", "muon_lr_scale": 1.0},
    "muon x4": lambda b, s: {"optimizer": "muon", "muon_lr_scale": 4.0},
    "muon x16": lambda b, s: {"optimizer": "muon", "muon_lr_scale": 16.0},
    # Muon's Newton-Schulz products in one dtype whatever the machine (the recipe's muon_dtype "auto": bf16 on
    # an accelerator or a CPU with bf16 matrix instructions, else fp32)
    "muon fp32": lambda b, s: {"muon_dtype": "float32"},
    "muon bf16": lambda b, s: {"muon_dtype": "bfloat16"},
    # the high fused layer nearer the top: HF 29 of SmolLM2's 30 (the recipe's L-3 = 27, modelopt's default;
    # HF 30 would be after the final norm, where vLLM and SGLang capture before it)
    "top 29": lambda b, s: {"eagle3_layers": [2, 15, 29]},
    # the draft vocabulary larger than the rows' distinct tokens, as our recipes have it (SmolLM2's: 8192): the
    # most frequent label tokens, then the rest in id order; modelopt's calibration can give it no more than
    # the distinct tokens (its recipe's own default is the whole vocabulary: variant "whole vocab")
    "vocab 4096": lambda b, s: {"draft_vocab_size": 4096},
    "vocab 8192": lambda b, s: {"draft_vocab_size": 8192},
    # no warm-up: the rate at its peak from the first step (Muon's updates have a fixed size whatever the
    # gradient's, so its first steps need no warm-up to stay small)
    "warmup 0": lambda b, s: {"warmup_ratio": 0.0, "warmup_steps": 0},
}


def eagle3_ablation(names: str, budget: dict, seed: int = 0) -> dict:
    """The recipe overrides of a '+'-joined list of EAGLE3_ABLATIONS names at `budget`, for the run of
    `seed` (an override of `seed` itself replaces the run's)."""
    return joined_overrides(names, EAGLE3_ABLATIONS, "--eagle3-ablations", budget, seed)


def distinct_chat_tokens(target: Path, conversations: list) -> int:
    """The distinct token ids of the rows' messages in the chat template, as calibrate_draft_vocab.py counts
    them (all rows' messages as one conversation)."""
    from transformers import AutoTokenizer

    messages = [m for r in message_rows(conversations) for m in r["messages"]]
    ids = AutoTokenizer.from_pretrained(target).apply_chat_template(messages, tokenize=True, return_dict=True)
    return len(set(ids["input_ids"]))


def training_seq_len(longest: int, max_length: int) -> int:
    """modelopt's training_seq_len for rows whose longest is `longest` tokens: its collator pads every row to
    it (and truncates past it), so the longest row rounded up to a multiple of 8, never past `max_length`
    (--max-length). Padding every row to --max-length would charge it for tokens that no trainer sees."""
    return min(max_length, -(-longest // 8) * 8)


def modelopt_row(budget: dict, seed: int, variant: str, vocab: int, args, ctx: dict) -> dict:
    """modelopt's EAGLE-3 training (modelopt_train.py, its recipe with `variant`) at `budget`, its export
    imported and decoded (the bench has put tests/consumers on the path)."""
    from modelopt_env import subprocess_environ

    name = f"modelopt-e{budget['epochs']}-s{seed}" + (
        "" if variant == "defaults" else "-" + variant.replace(" ", "_")
    )
    work = args.out / name.replace("%", "pc").replace("+", "-")
    work.mkdir()
    # what modelopt_job reads as ctx["max_length"]: the rows' own length, not --max-length
    seq_len = training_seq_len(ctx["longest_chat_tokens"], args.max_length)
    job = modelopt_job({**ctx, "max_length": seq_len}, work, budget, seed, variant, vocab, args.device)
    (work / "job.json").write_text(json.dumps(job, indent=1))
    env = subprocess_environ(ctx["modelopt_env"])
    load = load_average()
    cmd = [sys.executable, str(ROOT / "tests" / "consumers" / "modelopt_train.py"), str(work / "job.json")]
    wall, rss = run_measured(cmd, work / "train.log", env=env)
    got = json.loads((work / "out.json").read_text())
    if got["global_step"] != budget["steps"]:
        raise RuntimeError(f"{name}: modelopt took {got['global_step']} steps, the budget {budget['steps']}")
    native = import_heads("eagle3", Path(got["export"]), ctx["target"], work / "native")
    ev = evaluate(native, args.eagle_tree, work / "eval", args.eval_prompts, args.eval_new_tokens, args.target,
                  ctx["eval_source"], args.device)  # fmt: skip
    trainer = MODELOPT + ("" if variant == "defaults" else f" ({variant})")
    losses = [h["loss"] for h in got["log_history"] if "loss" in h]
    row = row_result("EAGLE-3", trainer, budget, ctx["chat_tokens"], ev, wall, rss, ctx["modelopt_changes"], seed=seed,
                     load_average=load, overrides=job["overrides"], stages_s=got["seconds"],
                     peak_accelerator_mib=accelerator_mib(got.get("peak_accelerator_bytes")),
                     loop_s=next((h["train_runtime"] for h in got["log_history"] if "train_runtime" in h), None),
                     first_last_loss=[losses[0], losses[-1]] if losses else None)  # fmt: skip
    print(f"  {trainer} seed {seed}: tau {row['tau']:.3f} {row['identical']}", flush=True)
    return row
