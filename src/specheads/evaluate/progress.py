"""What an `eval` or `compare` has finished, kept while it runs so that a stopped run loses only the
prompt it was on: `<out>/progress.jsonl`.

    line 1       {"progress": "eval" | "compare", "settings": {...}, "kept": {...}}: the settings decide
                 the outputs (target, heads, tree, prompts, max_new_tokens, sampling and seed, ...; never
                 timings or warmup); "kept" holds what the run measured before its first record and must
                 not measure again on resume (`--tree auto`'s calibrated tree: a second calibration may
                 time the candidates differently and pick another tree)
    line 2, ...  one finished prompt (eval) or conversation (compare) each, in order

Each line is appended whole: one `write` of the line on a descriptor opened O_APPEND, then fsync. A run
killed inside that write can leave a last line without its newline; reading drops it (that prompt is
decoded again). A re-run on the folder, with `--resume` or simply with the same settings, skips what the
file holds and goes on; settings that differ are refused naming the key. The file is removed once
results.json is written.

SIGTERM (a scheduler's stop) is turned into a KeyboardInterrupt while the run decodes (`stop_on_sigterm`),
so that it ends as Ctrl-C does: the progress file stays, and the command says how to resume.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from specheads.core.atomic import naming_a_full_disk, write_text

PROGRESS_FILE = "progress.jsonl"


def rank_file(rank: int) -> str:
    """The progress file of process `rank` of a run shared by several (each keeps its own prompts')."""
    return f"progress-rank{rank}.jsonl"


class Progress:
    """`<out>/progress.jsonl` of one run: `done` (the records already finished), `append(record)`."""

    def __init__(
        self,
        out: str | Path,
        kind: str,
        settings: dict[str, Any],
        resume: bool = False,
        file: str = PROGRESS_FILE,
    ):
        """Open the folder's progress: continue a file of the same `kind` and `settings`, or start one.
        `file`: its name in `out` (each process of a several-process run keeps its own: `rank_file`).

        Raises:
            ValueError: the file holds another run (another command, or settings that differ: the keys
                are named), or `resume` and there is nothing to resume.
        """
        self.path = Path(out) / file
        self.kind = kind
        self.settings = json.loads(json.dumps(settings, default=str))  # as it reads back
        self.done: list[Any] = []
        self.kept: dict[str, Any] = {}
        if self.path.exists():
            header, self.done = read_progress(self.path)
            check_same(header, kind, self.settings, self.path)
            self.kept = header.get("kept", {})
            self._rewrite(header)  # drops a torn last line before anything is appended after it
        elif resume:
            raise ValueError(f"--resume: {self.path.parent} holds no {file}, so there is nothing to resume")
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._rewrite({"progress": kind, "settings": self.settings})

    def _rewrite(self, header: dict[str, Any]) -> None:
        lines = [header, *self.done]
        write_text(self.path, "".join(json.dumps(line, default=str) + "\n" for line in lines))

    def keep(self, key: str, value: Any) -> None:
        """Keep `value` in the header's "kept" under `key` (not a setting: never compared), for a resume."""
        self.kept[key] = json.loads(json.dumps(value, default=str))
        self._rewrite({"progress": self.kind, "settings": self.settings, "kept": self.kept})

    def append(self, record: Any) -> None:
        """Add one finished record to the file (whole, fsynced) and to `done`."""
        line = (json.dumps(record, default=str) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            with naming_a_full_disk(self.path):
                os.write(fd, line)
                os.fsync(fd)
        finally:
            os.close(fd)
        self.done.append(record)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def read_progress(path: str | Path) -> tuple[dict[str, Any], list[Any]]:
    """(header, records) of a progress file; a last line cut short (no newline) is dropped."""
    text = Path(path).read_text(encoding="utf-8")
    lines = text.split("\n")
    complete = lines[:-1]  # the last piece is "" after a final newline, or a torn line
    if not complete:
        raise ValueError(f"{path} has no header line; remove it to start over")
    try:
        header = json.loads(complete[0])
        records = [json.loads(line) for line in complete[1:] if line]
    except ValueError as e:
        raise ValueError(f"{path} is not a specheads progress file ({e}); remove it to start over") from None
    if not isinstance(header, dict) or "progress" not in header or "settings" not in header:
        raise ValueError(f"{path} is not a specheads progress file (no header); remove it to start over")
    return header, records


def check_same(header: dict[str, Any], kind: str, settings: dict[str, Any], path: Path) -> None:
    """Raise ValueError naming every key whose recorded setting differs from this run's."""
    if header["progress"] != kind:
        raise ValueError(
            f"{path} holds a stopped `specheads {header['progress']}`, not `specheads {kind}`; "
            "pass --overwrite to start over, or choose another --out"
        )
    recorded = header["settings"]
    keys = sorted(k for k in {*recorded, *settings} if recorded.get(k) != settings.get(k))
    if keys:
        what = "; ".join(f"{k}: {recorded.get(k)!r} there, {settings.get(k)!r} now" for k in keys)
        raise ValueError(
            f"{path} holds a stopped run with other settings ({what}); rerun with its settings to resume, "
            "or pass --overwrite to start over"
        )


@contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """Within `with`, SIGTERM raises KeyboardInterrupt (as Ctrl-C does); main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def stopped_message(command: str, done: int, total: int, out: str | Path, what: str = "prompts") -> str:
    """What a stopped run prints: how far it got, where that is kept, how to go on."""
    return (
        f"stopped after {done} of {total} {what}; they are kept in {Path(out) / PROGRESS_FILE}. "
        f"Resume with the same command and --resume: {command} --resume"
    )
