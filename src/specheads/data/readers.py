"""Reading training rows from files, saved datasets and the hub, normalised to one of two shapes.

Every source comes out as a `datasets.Dataset` (or `IterableDataset` when streaming) with exactly one
column:

    {"messages": [{"role": "system" | "user" | "assistant", "content": str}, ...]}   conversations
    {"text": str}                                                                      plain text

What is read, and how (`load_rows`):

    *.txt, *.md         plain text. `text_split` decides what a document is: "document" (default: the
                        whole file), "paragraph" (blocks separated by blank lines) or "line".
    *.jsonl, *.ndjson   one JSON object per line.
    *.json              a JSON array of objects, or JSON Lines under a .json name.
    *.parquet           rows of a parquet file (what the hub serves).
    a directory         saved with `Dataset.save_to_disk` / `DatasetDict.save_to_disk`, or holding data
                        files of one kind (text, or JSON/parquet), read in sorted order; files and folders
                        whose names start with "." or "_" are skipped (metadata such as the `_summary.json`
                        of `specheads distill`, temporary files).
    a glob              `data/*.jsonl`.
    a hub name          `org/name` through `datasets.load_dataset` (with `config_name`, `split`).

A JSON object (or dataset row) becomes one row by its keys (data/row_shapes.py: which keys, which
role names). A turn's `reasoning_content` (a thinking model's reasoning, as vLLM and SGLang return it)
is kept in a column of its own, `reasoning_content` (one string or None a turn), present only when
some row has one (streamed: when the first row has one); tokenisation puts it back into the turns, and
the recipe key `reasoning` keeps or drops it (data/chat_masks.py).

A row that cannot be read (invalid JSON, neither text nor a conversation, an unknown role, a text row
in a source of conversations, ...) is a *bad row*: it is counted and reported with where it is
(`file:line`, `file[item]` for JSON arrays, `source row i` for datasets). `max_bad_rows` decides
between skipping and stopping: an int is a count, a float a fraction of the rows read; above it,
`BadRowsError` lists the first bad rows. Below it the bad rows are skipped with a warning.

Local files are read once into the `datasets` cache (keyed by the files' paths, sizes and mtimes), so
a second run reads the cache. Streaming (`streaming=True`) reads lazily and never caches; a count
threshold is checked as rows arrive, a fraction once at least `STREAM_MIN_ROWS` rows were read and
again at the end of each pass. A JSON array, or a text file read as one document, is still read whole
when streaming: use JSONL, or text_split="line" / "paragraph", for large data.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import math
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets
import pyarrow.compute as pc
from datasets import Features, List, Value

from specheads.data.checks import check_distill_folder
from specheads.data.row_shapes import RowError, normalise_row

logger = logging.getLogger(__name__)

TEXT_SUFFIXES = (".txt", ".md")
JSON_SUFFIXES = (".jsonl", ".ndjson", ".json")
PARQUET_SUFFIXES = (".parquet",)
TEXT_SPLITS = ("document", "paragraph", "line")
STREAM_MIN_ROWS = 100  # a fractional threshold is judged in streaming only after this many rows
REPORT_ROWS = 10  # bad rows shown in a report
READER_VERSION = 2  # bump when the rows read from a file change, to invalidate cached reads
_GLOB_CHARS = re.compile(r"[*?\[]")


class DataSourceError(ValueError):
    """A source that cannot be read at all (unknown kind, unreadable file, no readable rows)."""


@dataclass
class RowsReport:
    """How many rows a source gave and which could not be read."""

    source: str
    rows: int = 0
    bad: int = 0
    examples: list[tuple[str, str]] = field(default_factory=list)  # (where, why), first REPORT_ROWS
    failed: str = "could not be read"  # what happened to a bad row, for the summary

    def add_bad(self, where: str, why: str) -> None:
        self.bad += 1
        if len(self.examples) < REPORT_ROWS:
            self.examples.append((where, why))

    def listing(self) -> str:
        lines = [f"  {where}: {why}" for where, why in self.examples]
        if self.bad > len(self.examples):
            lines.append(f"  ... and {self.bad - len(self.examples)} more")
        return "\n".join(lines)

    def summary(self, max_bad_rows: float | int) -> str:
        allowed = math.floor(_limit(max_bad_rows, self.rows))
        return (
            f"{self.source}: {self.bad} of {self.rows} rows {self.failed} "
            f"(max_bad_rows={max_bad_rows!r} allows {allowed}):\n{self.listing()}"
        )


class BadRowsError(DataSourceError):
    """More rows could not be read than `max_bad_rows` allows."""

    def __init__(self, report: RowsReport, max_bad_rows: float | int):
        self.report = report
        super().__init__(report.summary(max_bad_rows) + "\n(raise max_bad_rows to skip them)")


def too_many_bad_rows(report: RowsReport, max_bad_rows: float | int) -> bool:
    """Whether `report` has more bad rows than `max_bad_rows` allows (a count, or a fraction of rows)."""
    return report.bad > _limit(max_bad_rows, report.rows)


# -- raw rows from each kind of source -------------------------------------------------------------
# Readers yield (where, row, why): `row` a raw object, or None with `why` saying what went wrong.


def _text_rows(path: str, text_split: str) -> Iterator[tuple[str, Any, str | None]]:
    if text_split == "document":
        try:
            text = Path(path).read_bytes().decode("utf-8")
        except UnicodeDecodeError as e:
            yield path, None, f"not UTF-8 text ({e})"
            return
        yield path, {"text": text}, None
        return
    with open(path, encoding="utf-8", errors="strict") as f:
        block, start, lineno = [], 0, 0
        try:
            for lineno, line in enumerate(f, 1):
                if text_split == "line":
                    if line.strip():
                        yield f"{path}:{lineno}", {"text": line.rstrip("\n")}, None
                elif line.strip():
                    start = start or lineno
                    block.append(line)
                elif block:
                    yield f"{path}:{start}", {"text": "".join(block).rstrip("\n")}, None
                    block, start = [], 0
        except UnicodeDecodeError as e:
            yield f"{path}:{lineno + 1}", None, f"not UTF-8 text ({e})"
            return
        if block:
            yield f"{path}:{start}", {"text": "".join(block).rstrip("\n")}, None


def _json_lines(path: str) -> Iterator[tuple[str, Any, str | None]]:
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield f"{path}:{lineno}", json.loads(line), None
            except json.JSONDecodeError as e:
                yield f"{path}:{lineno}", None, f"not valid JSON ({e.msg} at column {e.colno})"


def _json_rows(path: str) -> Iterator[tuple[str, Any, str | None]]:
    if path.endswith(".json"):
        with open(path, encoding="utf-8", errors="replace") as f:
            head = f.read(4096).lstrip()
        if head.startswith("["):  # a JSON array (classic ShareGPT)
            try:
                items = json.loads(Path(path).read_text(encoding="utf-8", errors="replace"))
            except json.JSONDecodeError as e:
                raise DataSourceError(
                    f"{path}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})"
                ) from e
            for i, item in enumerate(items):
                yield f"{path}[{i}]", item, None
            return
    yield from _json_lines(path)


def _file_rows(path: str, text_split: str) -> Iterator[tuple[str, Any, str | None]]:
    if path.endswith(TEXT_SUFFIXES):
        yield from _text_rows(path, text_split)
    else:
        yield from _json_rows(path)


def _dataset_rows(dataset, name: str) -> Iterator[tuple[str, Any, str | None]]:
    for i, row in enumerate(dataset):
        yield f"{name} row {i}", row, None


def _raw_rows(
    kind: str | None,
    files: list[str] | None = None,
    text_split: str = "document",
    dataset=None,
    name: str = "",
    include_capped: bool = True,
) -> Iterator[dict[str, Any]]:
    """Every row of a source, normalised, with `_where` and `_error` (None for a good row).

    `kind` ("messages" or "text") is what the source holds; a row of the other kind is bad. A row marked
    "capped": true (`specheads distill`: an answer cut off at max_new_tokens) is left out, not bad,
    when include_capped is False (training's default).
    """
    source = (
        (item for path in files for item in _file_rows(path, text_split))
        if files is not None
        else _dataset_rows(dataset, name)
    )
    for where, raw, why in source:
        if not include_capped and isinstance(raw, Mapping) and raw.get("capped") is True:
            continue
        row: dict[str, Any] = {}
        if why is None:
            try:
                row = normalise_row(raw)
            except RowError as e:
                why = str(e)
        if why is None and kind is not None and kind not in row:
            other = next(iter(row))
            why = f"a {other!r} row in a source of {kind!r} rows"
            row = {}
        yield {
            "messages": row.get("messages"),
            "reasoning_content": row.get("reasoning_content"),
            "text": row.get("text"),
            "_where": where,
            "_error": why,
        }


# -- finding the source ---------------------------------------------------------------------------


def _is_saved_dataset(path: Path) -> bool:
    return (path / "dataset_dict.json").is_file() or (
        (path / "state.json").is_file() and (path / "dataset_info.json").is_file()
    )


def _family(path: Path) -> str:
    name = path.name.lower()
    for family, suffixes in (("text", TEXT_SUFFIXES), ("json", JSON_SUFFIXES), ("parquet", PARQUET_SUFFIXES)):
        if name.endswith(suffixes):
            return family
    raise DataSourceError(
        f"{path}: unknown file type {path.suffix!r}; expected text ({', '.join(TEXT_SUFFIXES)}), JSON rows "
        f"({', '.join(JSON_SUFFIXES)}), parquet, a directory saved with save_to_disk, or a hub dataset name"
    )


def _hidden(relpath: Path) -> bool:
    """A file a directory source skips: a part of its path (below the source) starts with "." or "_"."""
    return any(part.startswith((".", "_")) for part in relpath.parts)


def _looks_like_path(source: str) -> bool:
    """A path rather than a hub id (hub ids are `name` or `org/name`, with no file suffix)."""
    known = TEXT_SUFFIXES + JSON_SUFFIXES + PARQUET_SUFFIXES
    return source.startswith(("/", ".", "~")) or source.count("/") > 1 or source.lower().endswith(known)


def _relative_note(path: Path) -> str:
    """Where a relative data path was looked for: the working folder, not the recipe's."""
    if path.is_absolute():
        return ""
    return f" (a relative path is resolved against the working folder, {Path.cwd()}, not the recipe's)"


def _data_files(source: str) -> tuple[str, list[str]] | None:
    """(family, files) for a local file, a glob, or a directory of data files; None for a hub name."""
    path = Path(source).expanduser()
    if _GLOB_CHARS.search(source):
        files = [Path(f) for f in sorted(glob.glob(str(path), recursive=True)) if Path(f).is_file()]
        if not files:
            raise FileNotFoundError(
                f"data source {source!r}: the pattern matches no files{_relative_note(path)}"
            )
    elif path.is_dir():
        check_distill_folder(path, source)  # a half-finished distill output is not data yet
        files = sorted(p for p in path.rglob("*") if p.is_file() and not _hidden(p.relative_to(path)))
        files = [
            p for p in files if p.name.lower().endswith(TEXT_SUFFIXES + JSON_SUFFIXES + PARQUET_SUFFIXES)
        ]
        if not files:
            raise DataSourceError(
                f"data source {source!r}: a directory with no data files (text, JSON rows or parquet) "
                "and not a dataset saved with save_to_disk"
            )
    elif path.is_file():
        files = [path]
    elif _looks_like_path(source):
        raise FileNotFoundError(f"data source {source!r}: no such file or directory{_relative_note(path)}")
    else:
        return None
    families = {_family(f) for f in files}
    if len(families) > 1:
        raise DataSourceError(
            f"data source {source!r} mixes kinds of files ({', '.join(sorted(families))}); "
            "point at one kind, e.g. with a glob such as 'dir/*.jsonl'"
        )
    return families.pop(), [str(f) for f in files]


def _files_fingerprint(files: list[str], text_split: str) -> str:
    h = hashlib.sha256(f"specheads-rows-v{READER_VERSION}|{text_split}".encode())
    for f in files:
        st = os.stat(f)
        h.update(f"|{os.path.abspath(f)}|{st.st_size}|{st.st_mtime_ns}".encode())
    return h.hexdigest()[:32]


def _open_dataset(
    source: str, parquet_files: list[str] | None, *, split: str, streaming: bool, config_name, cache_dir
):
    """A saved-to-disk, parquet or hub dataset (its rows not yet normalised)."""

    path = Path(source).expanduser()
    if parquet_files is not None:
        return datasets.load_dataset(
            "parquet", data_files=parquet_files, split="train", streaming=streaming, cache_dir=cache_dir
        )
    if path.is_dir():
        ds = datasets.load_from_disk(str(path))
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise DataSourceError(f"{source}: no split {split!r}; it has {sorted(ds)}")
            ds = ds[split]
        return ds.to_iterable_dataset() if streaming else ds
    try:
        return datasets.load_dataset(
            source, config_name, split=split, streaming=streaming, cache_dir=cache_dir
        )
    except (ConnectionError, OSError, datasets.exceptions.DatasetNotFoundError) as e:
        raise ConnectionError(
            f"data source {source!r} is not a local file or directory, and loading it as a hub dataset "
            f"failed: {e}"
        ) from e


# -- the public loader ----------------------------------------------------------------------------


def check_max_bad_rows(max_bad_rows: float | int) -> None:
    if isinstance(max_bad_rows, bool) or not isinstance(max_bad_rows, (int, float)) or max_bad_rows < 0:
        raise ValueError(
            f"max_bad_rows must be a count (int >= 0) or a fraction (float), got {max_bad_rows!r}"
        )
    if isinstance(max_bad_rows, float) and max_bad_rows > 1:
        raise ValueError(f"a float max_bad_rows is a fraction of the rows, in [0, 1]; got {max_bad_rows}")


def _limit(max_bad_rows: float | int, rows: int) -> float:
    return max_bad_rows if isinstance(max_bad_rows, int) else max_bad_rows * rows


def _first_kind(reader: dict[str, Any], source: str, with_reasoning: bool = False) -> str:
    """Whether the source holds conversations or text: the kind of its first readable row (with
    `with_reasoning`, "reasoning" for conversations whose first row has reasoning_content)."""
    report = RowsReport(source)
    for row in _raw_rows(None, **reader):
        report.rows += 1
        if row["_error"] is None:
            if row["messages"] is None:
                return "text"
            return "reasoning" if with_reasoning and row["reasoning_content"] is not None else "messages"
        report.add_bad(row["_where"], row["_error"])
    capped = (
        ' or holds only rows marked "capped" (answers cut off at max_new_tokens; include_capped keeps them)'
        if reader.get("include_capped") is False
        else ""
    )
    raise DataSourceError(
        f"{source}: no readable rows"
        + (":\n" + report.listing() if report.rows else f" (it is empty{capped})")
    )


def _streamed_rows(kind: str, max_bad_rows: float | int, source: str, **reader) -> Iterator[dict[str, Any]]:
    columns = ["messages", "reasoning_content"] if kind == "reasoning" else [kind]
    kind = "messages" if kind == "reasoning" else kind
    yield from judged_stream(_raw_rows(kind, **reader), RowsReport(source), max_bad_rows, columns)


def judged_stream(
    rows: Iterable[dict], report: RowsReport, max_bad_rows: float | int, columns: list[str]
) -> Iterator[dict[str, Any]]:
    """The good rows of a stream (`_error` None), cut to `columns`; the bad ones counted in `report`.

    Judged as the rows come (a fractional `max_bad_rows` only once STREAM_MIN_ROWS rows are read) and
    again at the end, so a stream stops at the first row that makes it too bad.
    """
    for row in rows:
        report.rows += 1
        if row["_error"] is None:
            yield {c: row[c] for c in columns}
            continue
        report.add_bad(row["_where"], row["_error"])
        judged = isinstance(max_bad_rows, int) or report.rows >= STREAM_MIN_ROWS
        if judged and too_many_bad_rows(report, max_bad_rows):
            raise BadRowsError(report, max_bad_rows)
    if too_many_bad_rows(report, max_bad_rows):
        raise BadRowsError(report, max_bad_rows)
    if report.bad:
        logger.warning("skipped bad rows: %s", report.summary(max_bad_rows))


def _features(kind: str | None):

    columns = {
        "messages": List({"role": Value("string"), "content": Value("string")}),
        "reasoning_content": List(Value("string")),
        "text": Value("string"),
    }
    if kind == "reasoning":
        return Features({k: columns[k] for k in ("messages", "reasoning_content")})
    if kind is not None:
        return Features({kind: columns[kind]})
    return Features({**columns, "_where": Value("string"), "_error": Value("string")})


def drop_bad_rows(raw, columns: list[str], max_bad_rows: float | int, report: RowsReport):
    """Report the bad rows of `raw`, stop if too many, else return the good rows' `columns`.

    `raw` is a Dataset with `_where` and `_error` columns (`_error` None for a good row); `report`
    names the source and holds the number of rows read (the base of a fractional `max_bad_rows`).
    """

    errors = raw.data.column("_error")
    if errors.null_count < len(raw):
        bad = pc.indices_nonzero(pc.is_valid(errors)).to_pylist()
        report.bad = len(bad)
        shown = raw.select(bad[:REPORT_ROWS])
        report.examples = list(zip(shown["_where"], shown["_error"]))
        if too_many_bad_rows(report, max_bad_rows):
            raise BadRowsError(report, max_bad_rows)
        logger.warning("skipped bad rows: %s", report.summary(max_bad_rows))
        raw = raw.filter(lambda errs: [e is None for e in errs], input_columns="_error", batched=True)
    return raw.select_columns(columns)


def concatenate_rows(parts: list):
    """load_rows' Datasets one after the other; a source of conversations without reasoning_content gets
    that column (None for every turn) where another source has it, so that they concatenate."""
    if any("reasoning_content" in p.column_names for p in parts):
        parts = [
            p.add_column(
                "reasoning_content", [None] * len(p), feature=_features("reasoning")["reasoning_content"]
            )
            if "messages" in p.column_names and "reasoning_content" not in p.column_names
            else p
            for p in parts
        ]
    return datasets.concatenate_datasets(parts)


def load_rows(
    source: str | Path,
    *,
    split: str = "train",
    streaming: bool = False,
    max_bad_rows: float | int = 0.01,
    text_split: str = "document",
    config_name: str | None = None,
    cache_dir: str | Path | None = None,
    include_capped: bool = True,
):
    """Read a data source into rows of {"messages": [...]} or {"text": str} (module docstring).

    Args:
        source: a file, a directory, a glob, or a hub dataset name.
        split: the split of a saved DatasetDict or a hub dataset (local files are one split).
        streaming: return a lazily read `IterableDataset` instead of a cached `Dataset`.
        max_bad_rows: rows that cannot be read are skipped up to this many (int) or this fraction of
            the rows (float); above it, BadRowsError.
        text_split: what one document of a text file is: "document", "paragraph" or "line".
        config_name: the configuration of a hub dataset.
        cache_dir: where `datasets` caches what it reads (its default cache when None).
        include_capped: keep rows marked "capped": true (distilled answers cut off at max_new_tokens);
            training reads with False unless the recipe sets include_capped.

    Returns:
        `datasets.Dataset`, or `datasets.IterableDataset` when streaming, with one column.
    """

    check_max_bad_rows(max_bad_rows)
    if text_split not in TEXT_SPLITS:
        raise ValueError(f"unknown text_split {text_split!r}; expected one of {TEXT_SPLITS}")
    source = str(source)
    cache_dir = str(cache_dir) if cache_dir is not None else None
    path = Path(source).expanduser()
    found = None if path.is_dir() and _is_saved_dataset(path) else _data_files(source)
    if found is not None and split != "train":
        raise ValueError(
            f"split={split!r} names a split of a saved DatasetDict or a hub dataset; {source!r} is data "
            "files, which are one split (point at the files of the split you want)"
        )
    if found is not None and found[0] != "parquet":
        reader: dict[str, Any] = {"files": found[1], "text_split": text_split}
        fingerprint = _files_fingerprint(found[1], text_split) + ("" if include_capped else "|uncapped")
    else:
        dataset = _open_dataset(
            source,
            found[1] if found else None,
            split=split,
            streaming=streaming,
            config_name=config_name,
            cache_dir=cache_dir,
        )
        reader = {"dataset": dataset, "name": source}
        fingerprint = getattr(dataset, "_fingerprint", None)
        if fingerprint is not None and not include_capped:
            fingerprint += "|uncapped"
    reader["include_capped"] = include_capped
    kind = _first_kind(reader, source, with_reasoning=streaming)
    if streaming:
        return datasets.IterableDataset.from_generator(
            _streamed_rows,
            features=_features(kind),
            gen_kwargs={"kind": kind, "max_bad_rows": max_bad_rows, "source": source, **reader},
        )
    if fingerprint is not None:
        fingerprint = hashlib.sha256(f"{fingerprint}|{kind}|v{READER_VERSION}".encode()).hexdigest()[:32]
    raw = datasets.Dataset.from_generator(
        _raw_rows,
        features=_features(None),
        gen_kwargs={"kind": kind, **reader},
        fingerprint=fingerprint,
        cache_dir=cache_dir,
    )
    columns = [kind]
    if kind == "messages" and raw.data.column("reasoning_content").null_count < len(raw):
        columns.append("reasoning_content")
    return drop_bad_rows(raw, columns, max_bad_rows, RowsReport(source, rows=len(raw)))
