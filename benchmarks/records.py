"""What the run records under benchmarks/records/ share: reading and writing them, and the summaries their
assemble scripts make. The assemble scripts import this module and nothing of each other.

A record is a folder `benchmarks/records/<topic>/<YYYY-MM-DD>-<slug>/`: what was run (its README), what it
measured (JSON, and the Markdown tables the tools print), and the script that gathered the JSON from the run
folders, where one did. JSON over `GZIP_OVER` bytes is kept gzip-compressed (`NAME.json.gz`, written with no
name or time in its header, so the same record gives the same bytes); smaller JSON stays plain. `read_json`
takes either spelling of a name.

Run an assemble script from the repository root: `python benchmarks/records/TOPIC/DATE-SLUG/assemble.py ...`.
"""

from __future__ import annotations

import gzip
import json
import statistics
from pathlib import Path
from typing import Any

from benchmarks.bench_trainers_paired import (
    eval_record,
    modelopt_record,
    ours_record,
    paired,
    paired_line,
    prompt_steps,
    side_by_side,
    time_v,
    with_speeds,
)

__all__ = [
    "GZIP_OVER",
    "RECORDS",
    "assemble_variants",
    "eval_record",
    "last_json_line",
    "modelopt_record",
    "mt80_line",
    "mt80_runs",
    "ours_record",
    "paired",
    "paired_line",
    "prompt_steps",
    "read_json",
    "record_dir",
    "show_variants",
    "side_by_side",
    "span",
    "time_v",
    "variant_record",
    "variants_main",
    "with_speeds",
    "write_json",
]

RECORDS = Path(__file__).resolve().parent / "records"
GZIP_OVER = 8 * 1024  # bytes of JSON text past which a record is kept as .json.gz


def _spellings(path: Path) -> list[Path]:
    name = path.name
    if name.endswith(".json.gz"):
        return [path, path.with_name(name[: -len(".gz")])]
    return [path, path.with_name(name + ".gz")]


def read_json(path: str | Path) -> Any:
    """The JSON at `path`, plain or gzip-compressed: `runs.json` finds `runs.json.gz` and the other way round."""
    for candidate in _spellings(Path(path)):
        if candidate.is_file():
            data = candidate.read_bytes()
            if candidate.name.endswith(".gz"):
                data = gzip.decompress(data)
            return json.loads(data)
    raise FileNotFoundError(f"{path}: no such record (nor its .json / .json.gz twin)")


def write_json(path: str | Path, obj: Any) -> Path:
    """Write `obj` as indented JSON, gzip-compressed past GZIP_OVER bytes (the name then ends in .json.gz),
    replacing the other spelling if there was one. Returns the path written."""
    path = Path(path)
    text = (json.dumps(obj, indent=1) + "\n").encode()
    plain = path.with_name(path.name.removesuffix(".gz"))
    target = plain.with_name(plain.name + ".gz") if len(text) > GZIP_OVER else plain
    data = gzip.compress(text, compresslevel=9, mtime=0) if target.name.endswith(".gz") else text
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_bytes(data)
    tmp.replace(target)
    for other in _spellings(target)[1:]:
        if other.exists():
            other.unlink()
    return target


def record_dir(topic: str, slug: str, latest: bool = False) -> Path:
    """The record folder of `topic` whose name is `DATE-slug`: the one there is, or with `latest` the newest of
    them (the current figures of a measurement made again)."""
    found = sorted((RECORDS / topic).glob(f"????-??-??-{slug}"))
    if latest and found:
        return found[-1]
    if len(found) != 1:
        names = [p.name for p in found] or "none"
        raise FileNotFoundError(f"benchmarks/records/{topic}/*-{slug}: {names}; give the slug of one record")
    return found[0]


def last_json_line(log: Path) -> dict:
    """The JSON object on a log's last line (a data preparation's `{"tokens": ...}`)."""
    return json.loads(log.read_text().strip().splitlines()[-1])


def span(pairs: dict, key: str) -> list[float]:
    """[lowest, highest] of one ratio over side-by-side pairs."""
    return [min(p[key] for p in pairs.values()), max(p[key] for p in pairs.values())]


def mean_span(pairs: dict, key: str) -> float:
    return round(statistics.fmean(p[key] for p in pairs.values()), 3)


# -- SmolLM2 EAGLE-3 on all 80 MT-Bench first turns: the five seeds a side of eagle3-smollm2/*-mt80 ----------


def mt80_runs() -> dict:
    """The runs of the five-seed comparison on all 80 MT-Bench first turns (eagle3-smollm2/*-mt80)."""
    return read_json(record_dir("eagle3-smollm2", "mt80") / "runs.json")["runs"]


def mt80_line(names: list[str], runs: dict | None = None) -> list[dict]:
    """Runs of the mt80 record, each with its steps on all 80 prompts (the bench's 32 and the other 48)."""
    runs = mt80_runs() if runs is None else runs
    return [{"per_prompt": {**runs[n]["per_prompt_32"], **runs[n]["per_prompt_48"]}} for n in names]


def variant_record(run_dir: Path, name: str) -> dict:
    """A head's 80-prompt eval (`RUN_DIR/eval80-NAME/`), with its mean step where it was trained there."""
    ev = eval_record(run_dir / f"eval80-{name}")
    assert len(ev["per_prompt"]) == 80 and " --tree dynamic-16 " in ev["command"], name
    summary = run_dir / name / "train_summary.json"
    return {
        **ev,
        **({"step_seconds": json.loads(summary.read_text())["step_seconds"]} if summary.exists() else {}),
    }


def assemble_variants(variants: dict[str, dict[int, str]], run_dir: Path) -> dict:
    """change -> its runs, the recipe's tau on the same seeds, and paired() over the recipe and Model
    Optimizer (both from the mt80 record). `variants`: change -> {seed: the head's folder name in RUN_DIR}."""
    mt80 = mt80_runs()
    result = {}
    for change, heads in variants.items():
        runs = {seed: variant_record(run_dir, name) for seed, name in heads.items()}
        mine = [{"per_prompt": r["per_prompt"]} for r in runs.values()]
        result[change] = {
            "runs": {heads[seed]: r for seed, r in runs.items()},
            "recipe_same_seeds": {f"ours-t15-s{s}": mt80[f"ours-t15-s{s}"]["mt80"]["tau"] for s in heads},
            "over_recipe": paired(mine, mt80_line([f"ours-t15-s{s}" for s in heads], mt80)),
            "over_modelopt": paired(mine, mt80_line([f"modelopt-s{s}" for s in range(5)], mt80)),
        }
    return result


def show_variants(result: dict) -> None:
    for change, r in result.items():
        print(change)
        for name, run in r["runs"].items():
            depths = [round(a, 3) for a in run["accept_rate_per_depth"][:3]]
            print(" ", name, round(run["mean_accept_length"], 4), run["identical_to_baseline"], depths)
        print("  recipe, same seeds", {k: round(v, 4) for k, v in r["recipe_same_seeds"].items()})
        for key in ("over_recipe", "over_modelopt"):
            print(" ", key, {k: round(v, 4) if isinstance(v, float) else v for k, v in r[key].items()})


def variants_main(variants: dict[str, dict[int, str]], argv: list[str]) -> None:
    """argv: [_, OUT.json, RUN_DIR]: assemble `variants`' runs in RUN_DIR, write them to OUT.json, show them."""
    out, run_dir = Path(argv[1]), Path(argv[2])
    result = assemble_variants(variants, run_dir)
    write_json(out, result)
    show_variants(result)
