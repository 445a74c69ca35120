"""The output folder of `specheads distill` (data/distillation.py): where its parts and chunk records
lie, reading them back (distillation.commit_chunk writes a chunk), the settings a resume must match,
the summary a finished run writes (checked against its parts), and whether a distillation is finished.

Output, a directory that `load_rows` and a recipe's `data:` read (names starting with "_" are skipped):

    part-00000.jsonl    the rows of chunk 0 (`chunk_rows` prompts): {"messages": [...]} or {"text": str},
                        and "index", the prompt's number in the source; "capped": true on a
                        conversation with an answer cut off at max_new_tokens (no end token), which
                        training leaves out unless the recipe sets `include_capped: true`.
                        Text rows are never marked: a window's continuation ends at max_new_tokens.
    _chunks/00000.json  chunk 0's counts and failures, written after its part: the mark of a finished chunk
    _settings.json      everything that decides the output (with --chat-template or --enable-thinking,
                        the template's sha256 and enable_thinking); resuming with other settings is refused
    _summary.json       the last run's counts, `read = written + skipped + failed`, and every failure
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from specheads.core.atomic import write_text
from specheads.data.checks import CHUNKS_DIR, SETTINGS_FILE, SUMMARY_FILE


def part_path(out: Path, k: int) -> Path:
    return out / f"part-{k:05d}.jsonl"


def chunk_record_path(out: Path, k: int) -> Path:
    return out / CHUNKS_DIR / f"{k:05d}.json"


def read_chunk_record(out: Path, k: int) -> dict | None:
    try:
        return json.loads(chunk_record_path(out, k).read_text())
    except FileNotFoundError:
        return None


def check_settings(out: Path, settings: dict) -> None:
    """Refuse to resume into `out` with other settings; record them on a first run."""
    path = out / SETTINGS_FILE
    if path.is_file():
        before = json.loads(path.read_text())
        changed = {k: (before.get(k), v) for k, v in settings.items() if before.get(k) != v}
        if changed:
            lines = "\n".join(f"  {k}: was {a!r}, now {b!r}" for k, (a, b) in changed.items())
            raise ValueError(
                f"{out} holds a distillation made with other settings; resume with the same ones, or "
                f"pass --overwrite (or another --out) to start over:\n{lines}"
            )
        return
    out.mkdir(parents=True, exist_ok=True)
    (out / CHUNKS_DIR).mkdir(exist_ok=True)
    write_text(path, json.dumps(settings, indent=1))


def content_fingerprint(rows) -> str:
    """A hash of the rows' content in the order they are read: what a resume must find unchanged.

    Not datasets' own fingerprint, which for a local file hashes its path and modification time: a
    prompt file written again with the same content (`specheads seed-prompts` rerun) would refuse the
    resume of a distillation that read it."""
    digest = hashlib.sha256(json.dumps(list(rows.column_names)).encode())
    for start in range(0, len(rows), 1024):
        batch = rows[start : start + 1024]
        digest.update(json.dumps(batch, sort_keys=True, default=str, ensure_ascii=False).encode())
    return digest.hexdigest()[:16]


def finished_parts(out: Path) -> list[Path]:
    """The parts of `out` whose chunk record is written (a part alone does not count as done), in order:
    every part of a finished distillation; the finished chunks of one a time limit stopped."""
    out = Path(out)
    parts = sorted(out.glob("part-*.jsonl"))
    return [p for p in parts if chunk_record_path(out, int(p.stem.removeprefix("part-"))).is_file()]


def is_complete(out: Path) -> bool:
    """Whether `out` holds a finished distillation (its summary says so)."""
    try:
        return bool(json.loads((Path(out) / SUMMARY_FILE).read_text()).get("complete"))
    except (OSError, ValueError):
        return False


def _count_lines(path: Path) -> int:
    with path.open("rb") as f:
        return sum(1 for _ in f)


def write_summary(out: Path, counts: dict, records: list[dict], seconds: float) -> dict:
    """The run's counts, checked: every prompt read is written, skipped or failed, and every part
    holds the rows its record says."""
    if counts["read"] != counts["written"] + counts["skipped"] + counts["failed"]:
        raise RuntimeError(f"distill lost count: {counts}")
    for k, record in enumerate(records):
        lines = _count_lines(part_path(out, k))
        if lines != record["written"]:
            raise RuntimeError(
                f"{part_path(out, k)} holds {lines} rows but its record says {record['written']}; "
                "start over with --overwrite"
            )
    generated = counts["new_tokens"]
    return {
        "complete": True,
        **counts,
        "seconds": round(seconds, 2),
        "new_tokens_per_second": round(generated / seconds, 1) if generated else None,
        "output_rows": sum(r["written"] for r in records),
        "output_failed": sum(r["failed"] for r in records),
        "output_capped": sum(r.get("capped", 0) for r in records),  # rows load_rows leaves out by default
        "parts": len(records),
        "failures": [f for r in records for f in r["failures"]],
    }
