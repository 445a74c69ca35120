"""Merge `specheads compare` runs over disjoint prompts into one comparison (e.g. two halves run side by side).

    python scripts/merge_compare.py OUT_A/results.json OUT_B/results.json --out MERGED

Each method's per-prompt records (which results.json keeps) are put together and its figures built anew by
compare's own `method_entry` (evaluate/compare_records.py), overall and per category: so τ, acceptance per
depth, tokens/s, speedup, identity and the phase shares are the whole set's, exactly as one run over all the
prompts would report them. MERGED/results.json (compact; `--per-prompt` keeps the records, which are large)
and MERGED/report.md (compare's report) are written; no plots or answer files. The runs must compare the
same methods with the same settings, on the same target, dtype and token budget.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace

from specheads.core.atomic import write_text
from specheads.evaluate.compare_records import method_entry
from specheads.evaluate.report import render_comparison

SAME = ("baseline", "max_new_tokens", "temperature", "dtype", "device", "attn_implementation")


def merge(runs: list[dict]) -> dict:
    """One results.json from several over disjoint prompts (module docstring)."""
    first = runs[0]
    names = [m["name"] for m in first["methods"]]
    for run in runs[1:]:
        if [m["name"] for m in run["methods"]] != names:
            raise ValueError(
                f"the runs compare other methods: {names} and {[m['name'] for m in run['methods']]}"
            )
        for key in SAME:
            if run.get(key) != first.get(key):
                raise ValueError(f"the runs differ in {key}: {first.get(key)!r} and {run.get(key)!r}")
        if run["target"].get("weights_fingerprint") != first["target"].get("weights_fingerprint"):
            raise ValueError("the runs decoded different target weights")
        for m, m0 in zip(run["methods"], first["methods"]):
            if m["settings"] != m0["settings"]:
                raise ValueError(f"{m['name']} ran with other settings in one of the runs")
    methods = []
    for i, m0 in enumerate(first["methods"]):
        records = [r for run in runs for r in run["methods"][i]["per_prompt"]]
        # what method_entry reads of a Method: its tree depth (for acceptance per depth) and its settings
        method = SimpleNamespace(
            max_depth=len(m0["accept_rate_per_depth"]), settings=lambda m0=m0: m0["settings"]
        )
        methods.append(method_entry(m0["name"], m0["method"], method, records))
    prompts = [run["prompts"] for run in runs]
    return {
        **first,
        "methods": methods,
        "order": [o for run in runs for o in run["order"]],
        "prompts": {
            **prompts[0],
            "source": " + ".join(p["source"] for p in prompts),
            "path": [p["path"] for p in prompts],
            "num_prompts": sum(p["num_prompts"] for p in prompts),
            "turns": sum(p["turns"] for p in prompts),
            "skipped": [s for p in prompts for s in p["skipped"]],
        },
        "command": "\n".join(run["command"] for run in runs),
        "answers": {},
        "plots": {},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", nargs="+", type=Path, help="results.json of each compare run")
    p.add_argument("--out", type=Path, required=True, help="folder for the merged results.json and report.md")
    p.add_argument("--per-prompt", action="store_true", help="keep the per-prompt records in results.json")
    args = p.parse_args(argv)
    merged = merge([json.loads(r.read_text()) for r in args.results])
    args.out.mkdir(parents=True, exist_ok=True)
    report = render_comparison(merged)
    if not args.per_prompt:
        for m in merged["methods"]:
            del m["per_prompt"]
    write_text(args.out / "results.json", json.dumps(merged, separators=(",", ":")) + "\n")
    write_text(args.out / "report.md", report)
    print(f"wrote {args.out}/results.json and report.md ({merged['prompts']['num_prompts']} prompts)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
