"""Train EAGLE-3 heads as NVIDIA Model Optimizer's examples/speculative_decoding does, on the CPU (run in the
modelopt env: tests/consumers/modelopt_env.py), for benchmarks/bench_trainers.py.

    python modelopt_train.py JOB.json

JOB: {"target", "data" (rows of {"messages"}), "work", "overrides" (the recipe's dotlist), and optionally
"engine_norm" (true: layer 0 normalises the fused state once in training, as the engines read the export),
"draft_vocab_size" with "draft_vocab_cache" (calibrate to that file) and "export_rope_scaling" (a dict).

modelopt 0.47.0's wheel holds the library and the recipe (`modelopt_recipes/general/speculative_decoding/
eagle3.yaml`) but not the example scripts (main.py, eagle_utils.py, scripts/), which live in its git tree.
So this follows those scripts step by step with the wheel's own functions (modelopt_run.py does the
conversion and export part for the import tests; this is the training run):

  1. scripts/calibrate_draft_vocab.py: `calibrate_frequent_vocab(tokenizer, messages, draft_vocab_size)`
     over the job's rows, saved where the recipe's `data.draft_vocab_cache` points (only when the job gives
     a draft_vocab_size below the target's vocabulary; the recipe's default is the whole vocabulary), its
     ids sorted (below).
  2. main.py: `torch.manual_seed(0)` and `mto.enable_huggingface_checkpointing()` (its module level);
     `load_recipe(eagle3.yaml, overrides)`; its HfTrainingArguments (the recipe's training fields over
     transformers.TrainingArguments, built as main.py builds it); `load_vlm_or_llm` on the CPU;
     the tokenizer with model_max_length = training_seq_len; `mtsp.convert(model, [("eagle", recipe.eagle)])`
     and `HFEagleModel.load_draft_vocab_cache`; its online data module (eagle_utils
     make_speculative_data_module: `ShardedDataset("json", data_files=...)` and `LanguageDataCollator`
     with answer_only_loss and shifted labels); a Trainer with `can_return_loss = True`; train,
     save_state, save_model(output_dir).
  3. scripts/export_hf_checkpoint.py: output_dir reloaded with `load_vlm_or_llm` and exported with
     `export_speculative_decoding` to WORK/export.

Left out (example-only code, none of it in the wheel): eagle_utils' EagleTrainerWithAccLog (a Trainer
that logs the draft's training accuracy and scales LoRA learning rates: no LoRA here) and its
EagleTrainingPlot callback (accuracy logging / acceptance-rate validation, off in the recipe:
estimate_ar false); init_distributed_env (one process: it changes nothing). Writes WORK/out.json: the
Trainer's log history, its global step, the export path and the seconds of each stage.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import modelopt.torch.opt as mto
import modelopt.torch.speculative as mtsp
import torch
import transformers
from modelopt.recipe import load_recipe
from modelopt.torch.export import export_speculative_decoding
from modelopt.torch.speculative.plugins.hf_training_args import TrainingArguments as SpecTrainingArgs
from modelopt.torch.speculative.utils import calibrate_frequent_vocab, load_vlm_or_llm
from modelopt.torch.utils.plugins.transformers_dataset import LanguageDataCollator, ShardedDataset
from modelopt_run import EmbedsOnlyNorm

RECIPE = "general/speculative_decoding/eagle3"  # the wheel's modelopt_recipes

# main.py, at import: the draft's initial weights (the Trainer's seed orders the data only)
torch.manual_seed(0)
mto.enable_huggingface_checkpointing()

# main.py's: the recipe's training fields over transformers.TrainingArguments
HfTrainingArguments = dataclasses.make_dataclass(
    "HfTrainingArguments",
    [
        (n, f.annotation, dataclasses.field(default=f.default))
        for n, f in SpecTrainingArgs.model_fields.items()
    ],
    bases=(transformers.TrainingArguments,),
)
# What make_dataclass sets itself from Python 3.12; on 3.11 the class says it is types.HfTrainingArguments
# and the Trainer's torch.save of its arguments (at its final checkpoint) cannot pickle it.
HfTrainingArguments.__module__ = __name__


def calibrate(target: str, data: str, size: int, out: Path) -> None:
    """calibrate_draft_vocab.py: the `size` most frequent token ids of the rows' messages, as d2t offsets."""
    rows = [json.loads(line) for line in Path(data).read_text().splitlines() if line.strip()]
    messages = [m for r in rows for m in (r.get("messages") or r["conversations"])]
    d2t = calibrate_frequent_vocab(transformers.AutoTokenizer.from_pretrained(target), messages, size)
    # Its draft ids in frequency order; specheads' format keeps them in target-id order (import-heads sorts
    # an export's lm_head rows with them; sorted here before training, as the bench's runs were):
    # the same vocabulary numbered by id (draft id is only the lm_head row the head learns for that token).
    ids = (torch.arange(size) + d2t).sort().values
    d2t = ids - torch.arange(size)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(d2t, out)


def train(
    overrides: list[str], device_map: str | None = "cpu", dtype: str = "auto", engine_norm: bool = False
) -> dict:
    """main.py's train() for an EAGLE recipe, online data, one process, no resume; the target on
    `device_map` in `dtype` (main.py: "auto", the target config's). `engine_norm`: not main.py's: its draft's
    layer 0 normalises the fused state once in training, as the engines read its export (EmbedsOnlyNorm),
    the module put back before the checkpoint is saved."""
    recipe = load_recipe(RECIPE, overrides=overrides)
    args = HfTrainingArguments(**recipe.training.model_dump())
    path = recipe.model.model_name_or_path
    model = load_vlm_or_llm(path, use_offline_training=False, dtype=dtype, device_map=device_map)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path, model_max_length=args.training_seq_len)
    mtsp.convert(model, [("eagle", recipe.eagle.model_dump())])
    mtsp.plugins.HFEagleModel.load_draft_vocab_cache(model, recipe.data.draft_vocab_cache)
    collator = LanguageDataCollator(
        tokenizer=tokenizer, train_len=args.training_seq_len, return_labels=True,
        answer_only_loss=args.answer_only_loss, shift_labels=True,
    )  # fmt: skip
    trainer = transformers.Trainer(
        model=model, processing_class=tokenizer, args=args, data_collator=collator,
        train_dataset=ShardedDataset("json", data_files=recipe.data.data_path),
    )  # fmt: skip
    trainer.can_return_loss = True
    assert trainer.label_smoother is None
    layer0 = model.eagle_module.layers[0]
    own_norm = layer0.input_layernorm
    if engine_norm:
        layer0.input_layernorm = EmbedsOnlyNorm(own_norm)  # the same parameter: the optimizer's
    trainer.train()
    layer0.input_layernorm = own_norm
    trainer.save_state()
    trainer.save_model(args.output_dir)
    return {"log_history": trainer.state.log_history, "global_step": trainer.state.global_step,
            "output_dir": args.output_dir, "aux_layers": list(model.eagle_config.eagle_aux_hidden_state_layer_ids),
            "draft_vocab_size": model.eagle_config.draft_vocab_size}  # fmt: skip


def export(checkpoint: str, out: Path, rope_scaling: dict | None) -> None:
    """export_hf_checkpoint.py: the saved checkpoint (its modelopt state) reloaded and exported; with
    `rope_scaling` in place of the recipe's eagle_export_rope_scaling (None: the recipe's)."""
    model = load_vlm_or_llm(checkpoint, dtype="auto")
    model.eval()
    if rope_scaling is not None:
        # a recipe override `eagle.eagle_export_rope_scaling={}` merges into the default YaRN and keeps it
        model.eagle_export_rope_scaling = rope_scaling
    with torch.inference_mode():
        export_speculative_decoding(model, export_dir=str(out))


def main(job_path: str) -> None:
    job = json.loads(Path(job_path).read_text())
    work = Path(job["work"])
    seconds = {}
    start = time.perf_counter()
    if job.get("draft_vocab_cache"):
        calibrate(job["target"], job["data"], job["draft_vocab_size"], Path(job["draft_vocab_cache"]))
    seconds["calibrate"] = time.perf_counter() - start
    got = train(
        job["overrides"],
        job.get("device_map", "cpu"),
        job.get("target_dtype", "auto"),
        job.get("engine_norm", False),
    )
    seconds["train"] = time.perf_counter() - start - seconds["calibrate"]
    export(got["output_dir"], work / "export", job.get("export_rope_scaling"))
    seconds["export"] = time.perf_counter() - start - seconds["calibrate"] - seconds["train"]
    peak = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else -1
    out = {**got, "export": str(work / "export"), "seconds": seconds, "peak_accelerator_bytes": [peak]}
    (work / "out.json").write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main(*sys.argv[1:])
