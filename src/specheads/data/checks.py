"""Data that reads without an error and still cannot train: stopped with the numbers, not trained on.

check_distill_folder   a `specheads distill` output used as data must be finished: its summary there
                       and saying complete, and its parts holding the rows the summary counts (a
                       half-finished folder read as data trained on 48 of 96 rows without a word)
check_label_tokens     the tokenised rows must hold enough label tokens (loss_mask 1), in total and a
                       row on average (a chat set whose assistant turns were all "" trained on 24
                       label tokens to top-1 0.000 and exited 0)
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.compute as pc

# A `specheads distill` output folder: its settings, its summary (written last), its chunk records.
SETTINGS_FILE, SUMMARY_FILE, CHUNKS_DIR = "_settings.json", "_summary.json", "_chunks"


def check_distill_folder(path: Path, source: str) -> None:
    """Raise ValueError if `path` is an unfinished `specheads distill` output (no-op for other folders)."""
    if not (path / SETTINGS_FILE).is_file():
        return  # not a distill output
    resume = f"finish it first: run the same `specheads distill ... --out {path}` again, it resumes where it stopped"
    try:
        summary = json.loads((path / SUMMARY_FILE).read_text())
    except (OSError, ValueError):
        raise ValueError(
            f"data source {source!r} is an unfinished `specheads distill` output (no {SUMMARY_FILE}); {resume}"
        ) from None
    rows = sum(_lines(f) for f in sorted(path.glob("part-*.jsonl")))
    if not summary.get("complete") or rows != summary.get("output_rows"):
        raise ValueError(
            f"data source {source!r} is an incomplete `specheads distill` output: its parts hold {rows} rows, "
            f"its summary counts {summary.get('output_rows')} (complete: {summary.get('complete')}); {resume}"
        )


def _lines(file: Path) -> int:
    with open(file, "rb") as f:
        return sum(1 for line in f if line.strip())


def label_tokens_per_row(rows) -> np.ndarray:
    """(rows,) int64: the label tokens (loss_mask 1) of each tokenised row (a `datasets.Dataset` or a
    list of dicts)."""
    if hasattr(rows, "with_format"):  # Arrow batches: no Python loop over tokens
        counts = [np.zeros(0, dtype=np.int64)]
        for batch in rows.select_columns(["loss_mask"]).with_format("arrow").iter(batch_size=4096):
            column = batch["loss_mask"]
            flat = pc.list_flatten(column).to_numpy(zero_copy_only=False).astype(np.int64)
            lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False).astype(np.int64)
            ends = np.cumsum(lengths)
            running = np.concatenate([[0], np.cumsum(flat)])
            counts.append(running[ends] - running[ends - lengths])
        return np.concatenate(counts)
    return np.array([int(sum(r["loss_mask"])) for r in rows], dtype=np.int64)


def check_label_tokens(rows, min_total: int, min_per_row: float, what: str, loss_on: str) -> None:
    """Raise ValueError with the numbers if `rows` hold fewer than `min_total` label tokens, or fewer than
    `min_per_row` a row on average (0 turns a floor off)."""
    counts = label_tokens_per_row(rows)
    total, n = int(counts.sum()), len(counts)
    mean = total / max(n, 1)
    if total >= min_total and mean >= min_per_row:
        return
    empty = int((counts == 0).sum())
    raise ValueError(
        f"{what}: {total} label tokens in {n} rows ({mean:.1f} a row, {empty} rows with none); training "
        f"needs at least min_label_tokens={min_total} in total and min_label_tokens_per_row={min_per_row:g} "
        f"a row. loss_on={loss_on!r} counts "
        + ("every token" if loss_on == "all" else "assistant tokens only: are the assistant turns empty?")
        + " (lower the floors in the recipe if the data is meant to be this small)"
    )
