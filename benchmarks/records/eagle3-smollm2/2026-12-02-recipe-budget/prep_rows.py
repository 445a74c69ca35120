"""The rows `recipes/smollm2-135m/eagle3.yaml` trains on, in its order, as Model Optimizer's data file.

    python prep_rows.py DATA_DIR OUT.jsonl [SEED]

Run from the repository root. It takes DATA_DIR's training rows as the trainer does (`make_data`: 2% of the
prompts held out, tokenised), draws the recipe's max_steps batches with the trainer's own sampler for SEED (the recipe's seed, 0, by default), writes
those rows as {"messages": [...]} lines, and prints their count, the longest in the target's chat template
(Model Optimizer's training_seq_len must hold it) and their tokens (the budget's target tokens).
"""

import json
import sys
from itertools import islice
from pathlib import Path

from transformers import AutoTokenizer

from specheads.builders.named_targets import resolve_target
from specheads.methods import methods
from specheads.train.prepare import data_seed, make_data
from specheads.train.recipe import load_config
from specheads.train.sampler import EpochBatches
from specheads.train.sources import rows_for

data, out = sys.argv[1], Path(sys.argv[2])
seed = int(sys.argv[3]) if len(sys.argv) > 3 else 0
cfg = load_config("recipes/smollm2-135m/eagle3.yaml", [f"data=[{data}]", f"seed={seed}"], methods=methods())
train, held = rows_for(cfg)
tokenizer = AutoTokenizer.from_pretrained(resolve_target(cfg.target))
tokens, _, _ = make_data(cfg, tokenizer)  # the training rows tokenised, as `specheads train` has them
if len(tokens) != len(train):
    raise SystemExit(
        f"{len(train) - len(tokens)} rows were dropped in tokenising: the indices no longer match"
    )
batches = islice(iter(EpochBatches(len(tokens), cfg.batch_size, seed=data_seed(cfg))), cfg.max_steps)
seen = [i for batch in batches for i in batch]
if len(set(seen)) != cfg.max_steps * cfg.batch_size:
    raise SystemExit(f"the recipe's {cfg.max_steps} steps of {cfg.batch_size} see a row twice: not one epoch")
lengths = [len(tokens[i]["input_ids"]) for i in seen]
with out.open("w") as f:
    for i in seen:
        f.write(json.dumps({"messages": train[i]["messages"]}, ensure_ascii=False) + "\n")
print(json.dumps({"training_rows": len(train), "held_out": len(held), "rows_seen": len(seen),
                  "longest": max(lengths), "tokens": sum(lengths),
                  "at_max_length": sum(n >= cfg.max_length for n in lengths)}))  # fmt: skip
