"""Give heads trained before training saved `label_counts.safetensors` their label counts, so that
`--draft-vocab` can decode them: the counts of the rows their own training read, rebuilt from the
training record in their config.json (data, max_length, loss_on, eval_fraction, seed, ...). The data
must be where the record says.

    python scripts/add_label_counts.py runs/old-eagle OUT_DIR     # a copy of runs/old-eagle, with the counts
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import sys
from pathlib import Path

from safetensors.torch import save_file

from specheads.builders.named_targets import resolve_target
from specheads.core.atomic import write_file
from specheads.core.target import FrozenTarget
from specheads.heads import read_head_config
from specheads.heads.checkpoint import LABEL_COUNTS_FILE
from specheads.methods import methods
from specheads.train import prepare
from specheads.train.eagle_losses import count_label_tokens
from specheads.train.recipe import config_from_record


def add_label_counts(heads_dir: str | Path, out: str | Path) -> int:
    """Copy `heads_dir` to `out` with the label counts of its training rows; returns the label tokens."""
    heads_dir, out = Path(heads_dir), Path(out)
    if out.exists():
        raise FileExistsError(f"{out} exists; choose a new folder")
    record = read_head_config(heads_dir, methods=methods()).get("training", {})
    cfg = config_from_record(record, methods=methods())  # the record's notes, step and eval aside
    cfg = dataclasses.replace(cfg, mode="online")  # the rows come from the data, not from a cache
    target = FrozenTarget.from_pretrained(resolve_target(cfg.target), dtype="float32")
    rows, _, _ = prepare.make_data(cfg, target.tokenizer)
    counts = count_label_tokens(rows, target.vocab_size)
    shutil.copytree(heads_dir, out)
    write_file(out / LABEL_COUNTS_FILE, lambda f: save_file({"counts": counts}, f, metadata={"format": "pt"}))
    return int(counts.sum())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("heads", help="a native head checkpoint trained by specheads")
    p.add_argument("out", help="a new folder: the checkpoint copied, with label_counts.safetensors")
    args = p.parse_args(argv)
    labels = add_label_counts(args.heads, args.out)
    print(f"{args.out}: {labels} label tokens counted")
    return 0


if __name__ == "__main__":
    sys.exit(main())
