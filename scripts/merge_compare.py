"""Merge `specheads compare` runs over disjoint prompts into one table (e.g. two halves run side by side).

    python scripts/merge_compare.py OUT_A/results.json OUT_B/results.json --out merged.json --md merged.md \\
        --title "SmolLM2, all 80 MT-Bench questions"

Each method's new tokens, seconds, steps and prompts are summed over the runs (so tokens/s and the speedup
over `generate()` are the whole set's); τ is the step-weighted mean accept length, acceptance per depth the
step-weighted rates, the share of a step outside the target's forward the seconds-weighted one; "identical"
adds the runs' n/N. The runs must hold the same methods with the same settings; the per-category tables are
merged the same way. Writes compact JSON and a markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SUMMED = ("new_tokens", "seconds", "baseline_seconds", "baseline_new_tokens", "num_prompts")


def merged_entry(entries: list[dict]) -> dict:
    """One method's (or category's) figures over several runs' entries of results.json."""
    steps = sum(e["steps"] for e in entries)
    out = {"steps": steps, **{k: sum(e[k] for e in entries) for k in SUMMED}}
    out["tau"] = sum(e["mean_accept_length"] * e["steps"] for e in entries) / steps
    depth = max(len(e["accept_rate_per_depth"]) for e in entries)
    rates = [e["accept_rate_per_depth"] + [0.0] * (depth - len(e["accept_rate_per_depth"])) for e in entries]
    out["accept_rate_per_depth"] = [
        sum(e["steps"] * r[d] for e, r in zip(entries, rates)) / steps for d in range(depth)
    ]
    same, total = zip(*(map(int, e["identical_to_baseline"].split("/")) for e in entries))
    out["identical"] = f"{sum(same)}/{sum(total)}"
    out["tokens_per_second"] = out["new_tokens"] / out["seconds"]
    out["baseline_tokens_per_second"] = out["baseline_new_tokens"] / out["baseline_seconds"]
    out["speedup"] = out["tokens_per_second"] / out["baseline_tokens_per_second"]
    timed = [e for e in entries if e.get("outside_forward_fraction") is not None]
    out["outside_forward_fraction"] = (
        sum(e["outside_forward_fraction"] * e["seconds"] for e in timed) / sum(e["seconds"] for e in timed)
        if timed
        else None
    )
    return out


def merge(runs: list[dict]) -> dict:
    """The merged record of several results.json (same methods and settings, disjoint prompts)."""
    names = [m["name"] for m in runs[0]["methods"]]
    for run in runs[1:]:
        if [m["name"] for m in run["methods"]] != names:
            raise ValueError(
                f"the runs compare other methods: {names} and {[m['name'] for m in run['methods']]}"
            )
        for m, first in zip(run["methods"], runs[0]["methods"]):
            if m["settings"] != first["settings"]:
                raise ValueError(f"{m['name']} ran with other settings in one of the runs")
    categories = list(dict.fromkeys(c for run in runs for m in run["methods"] for c in m["per_category"]))
    methods = {}
    for name in names:
        entries = [next(m for m in run["methods"] if m["name"] == name) for run in runs]
        methods[name] = {
            **merged_entry(entries),
            "settings": entries[0]["settings"],
            "per_category": {
                c: merged_entry([e["per_category"][c] for e in entries if c in e["per_category"]])
                for c in categories
            },
        }
    keep = ("max_new_tokens", "dtype", "threads", "versions", "platform")
    return {"runs": [{"command": r["command"], "prompts": r["prompts"]} for r in runs],
            **{k: runs[0].get(k) for k in keep}, "methods": methods}  # fmt: skip


def table(merged: dict, title: str) -> str:
    lines = [f"# {title}", "", "| method | τ | acceptance per depth | tokens/s | speedup | outside forward | identical |",
             "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for name, e in merged["methods"].items():
        rates = [f"{r:.2f}" for r in e["accept_rate_per_depth"]]
        while rates and rates[-1] == "0.00":  # depths the drafts reached but never got accepted at
            rates.pop()
        acc = " ".join(rates) or "–"
        off = "–" if e["outside_forward_fraction"] is None else f"{100 * e['outside_forward_fraction']:.0f}%"
        lines.append(f"| {name} | {e['tau']:.2f} | {acc} | {e['tokens_per_second']:.1f} | {e['speedup']:.2f}x "
                     f"| {off} | {e['identical']} |")  # fmt: skip
    names = list(merged["methods"])
    lines += ["", "Per category, τ / speedup:", "", "| category | " + " | ".join(names) + " |",
              "| --- |" + " --- |" * len(names)]  # fmt: skip
    for c in next(iter(merged["methods"].values()))["per_category"]:
        cells = [merged["methods"][n]["per_category"][c] for n in names]
        lines.append(f"| {c} | " + " | ".join(f"{e['tau']:.2f} / {e['speedup']:.2f}x" for e in cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", nargs="+", type=Path, help="results.json of each compare run")
    p.add_argument("--out", type=Path, required=True, help="merged JSON")
    p.add_argument("--md", type=Path, required=True, help="merged table")
    p.add_argument("--title", default="specheads compare, merged")
    args = p.parse_args(argv)
    merged = merge([json.loads(r.read_text()) for r in args.results])
    args.out.write_text(json.dumps(merged, separators=(",", ":")))
    args.md.write_text(table(merged, args.title))
    print(table(merged, args.title))
    return 0


if __name__ == "__main__":
    sys.exit(main())
