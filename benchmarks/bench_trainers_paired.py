"""Two lines of runs compared prompt by prompt, for benchmarks/bench_trainers.py's verdicts.

The table's verdict sets the seeds' tau ranges side by side on one set of prompts, so it speaks for the
seeds and not for the prompts: 8 or 32 MT-Bench questions are a sample too, and which ones were drawn moved
a difference of a few percent by more than the difference (a 1.2%-2.3% loss on the first 8 prompts was
level on 32). Greedy decoding is lossless, so every run decodes the same text from a
prompt (the target's own answer) and two trainers' heads differ there only in the steps they take over it:
the prompts pair. This measures the difference in tau on the prompts both lines decoded, counts the prompts
each line is ahead on, and gives a 95% interval for the difference by a bootstrap that draws the prompts
(the same draw for both lines) and each line's runs (its seeds) anew. An interval clear of zero says the
difference holds across prompts and seeds; one across zero, that these prompts and seeds do not settle it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

DRAWS = 4000  # bootstrap draws: the interval's ends move by about 0.1% of tau from one seed of the draws to another


def prompt_steps(ev: dict) -> dict[str, list[int]] | None:
    """{prompt id: [new tokens, steps]} from an eval's results.json; None where it kept no per-prompt records."""
    records = ev.get("per_prompt")
    if not records:
        return None
    return {str(p["id"]): [int(p["new_tokens"]), int(p["steps"])] for p in records}


def paired(ours: list[dict], other: list[dict], draws: int = DRAWS, seed: int = 0) -> dict | None:
    """Line `ours` against line `other` (runs: rows with "per_prompt", as prompt_steps gives it) on the prompts
    every run of both decoded. Returns n_prompts, runs (per line), ahead / behind / level (prompts where ours'
    tau, the mean over its runs, is above, below or equal to the other's), diff (ours' tau over the other's,
    less 1, each line's tau the mean of its runs' over those prompts, as the table's) and lo / hi (the
    bootstrap's 2.5th and 97.5th percentiles of diff). None where a run kept no per-prompt records or no
    prompt is common to all."""
    lines = [[r["per_prompt"] for r in runs if r.get("per_prompt")] for runs in (ours, other)]
    if not all(lines) or any(len(side) < len(runs) for side, runs in zip(lines, (ours, other))):
        return None
    ids = [p for p in lines[0][0] if all(p in run for side in lines for run in side)]
    if not ids:
        return None
    # accepted tokens (each prompt's first token comes from the prefill, not from a step) and steps: [run, prompt]
    acc = [np.array([[run[p][0] - 1 for p in ids] for run in side], dtype=float) for side in lines]
    steps = [np.array([[run[p][1] for p in ids] for run in side], dtype=float) for side in lines]
    per_prompt = [(a / s).mean(axis=0) for a, s in zip(acc, steps)]
    taus = [(a.sum(axis=1) / s.sum(axis=1)).mean() for a, s in zip(acc, steps)]

    rng = np.random.default_rng(seed)
    counts = rng.multinomial(len(ids), [1 / len(ids)] * len(ids), size=draws)  # prompts drawn: [draw, prompt]
    drawn = []
    for a, s in zip(acc, steps):
        tau = (counts @ a.T) / (counts @ s.T)  # each run's tau on each draw's prompts: [draw, run]
        pick = rng.integers(0, a.shape[0], size=(draws, a.shape[0]))  # the line's runs drawn anew
        drawn.append(np.take_along_axis(tau, pick, axis=1).mean(axis=1))
    diff = drawn[0] / drawn[1] - 1
    return {
        "n_prompts": len(ids),
        "runs": [len(side) for side in lines],
        "ahead": int((per_prompt[0] > per_prompt[1]).sum()),
        "behind": int((per_prompt[0] < per_prompt[1]).sum()),
        "level": int((per_prompt[0] == per_prompt[1]).sum()),
        "diff": float(taus[0] / taus[1] - 1),
        "lo": float(np.percentile(diff, 2.5)),
        "hi": float(np.percentile(diff, 97.5)),
    }


def paired_line(p: dict, ours: str = "ours") -> str:
    """The comparison in words: "paired on the 32 prompts both decoded: ours ahead on 20, ..."."""
    runs = max(p["runs"]) > 1  # with one run a side the interval is the prompts' alone
    drawn, across = (
        ("the prompts and each line's runs", "prompts and seeds") if runs else ("the prompts", "prompts")
    )
    if p["lo"] > 0:
        says = f"above zero: {ours} leads across {across}"
    elif p["hi"] < 0:
        says = f"below zero: {ours} trails across {across}"
    else:
        says = f"across zero: these {across} do not settle it"
    return (
        f"paired on the {p['n_prompts']} prompts both decoded: {ours} ahead on {p['ahead']}, behind on "
        f"{p['behind']}, level on {p['level']}; {p['diff'] * 100:+.1f}% in tau, 95% interval "
        f"{p['lo'] * 100:+.1f}% to {p['hi'] * 100:+.1f}% (a bootstrap drawing {drawn}), {says}."
    )


# -- the records of a side-by-side run (the docs' assemble.py scripts) ----------------------------------------


def time_v(log: Path) -> dict:
    """The figures `/usr/bin/time -v` wrote at the end of `log`."""
    text = log.read_text(errors="replace")

    def field(name: str) -> str:
        return re.search(re.escape(name) + r":\s*(\S+)", text).group(1)

    h_m_s = [float(x) for x in field("Elapsed (wall clock) time (h:mm:ss or m:ss)").split(":")]
    return {
        "wall_s": round(sum(x * 60**i for i, x in enumerate(reversed(h_m_s))), 1),
        "user_s": float(field("User time (seconds)")),
        "system_s": float(field("System time (seconds)")),
        "peak_rss_mib": round(int(field("Maximum resident set size (kbytes)")) / 1024, 1),
        "minor_page_faults": int(field("Minor (reclaiming a frame) page faults")),
        "exit_status": int(field("Exit status")),
    }


def eval_record(folder: Path) -> dict:
    """An eval's figures from its results.json: tau, acceptance per depth, identity, per category and prompt."""
    ev = json.loads((folder / "results.json").read_text())
    keep = ("mean_accept_length", "accept_rate_per_depth", "identical_to_baseline", "speedup", "new_tokens")
    return {
        **{k: ev[k] for k in (*keep, "steps", "command")},
        "per_category": {c: v["mean_accept_length"] for c, v in ev["per_category"].items()},
        "per_prompt": prompt_steps(ev),
    }


def modelopt_record(run_dir: Path, name: str, tokens_seen: int, **about) -> dict:
    """A Model Optimizer run of a pair (`pair.sh`'s `NAME/` with out.json and job.json, `NAME.log`, and
    `eval-NAME/`): its `time -v` figures, its loop time and losses, `about` (record, seed, ...) first."""
    out = json.loads((run_dir / name / "out.json").read_text())
    losses = [h["loss"] for h in out["log_history"] if "loss" in h]
    return {
        **about,
        **time_v(run_dir / f"{name}.log"),
        "loop_s": out["seconds"]["train"],
        "global_step": out["global_step"],
        "loss_first_last": [losses[0], losses[-1]],
        "overrides": json.loads((run_dir / name / "job.json").read_text())["overrides"],
        "tokens_seen": tokens_seen,
        "eval": eval_record(run_dir / f"eval-{name}"),
    }


def ours_record(run_dir: Path, name: str, tokens_seen: int, **about) -> dict:
    """One of ours in a pair (`NAME/` with train_summary.json, `NAME.log`, and `eval-NAME/`), as above."""
    summary = json.loads((run_dir / name / "train_summary.json").read_text())
    return {
        **about,
        **time_v(run_dir / f"{name}.log"),
        "loop_s": summary["wall_seconds"],
        "train_summary": summary,
        "tokens_seen": tokens_seen,
        "eval": eval_record(run_dir / f"eval-{name}"),
    }


def with_speeds(record: dict, steps: int) -> dict:
    """`record` with its target tokens/s over the whole process (as `time -v` saw it) and over its `steps`
    steps alone (ours: its mean step; Model Optimizer's: its training loop)."""
    summary = record.get("train_summary")
    step_s = summary["step_seconds"] * steps if summary else record["loop_s"]
    return {
        **record,
        "tokens_per_s": round(record["tokens_seen"] / record["wall_s"], 1),
        "tokens_per_step_s": round(record["tokens_seen"] / step_s, 1),
    }


def side_by_side(ours: dict, theirs: dict) -> dict:
    """Ours over theirs, two runs made side by side (records from with_speeds)."""
    return {
        "tokens_per_s": round(ours["tokens_per_s"] / theirs["tokens_per_s"], 3),
        "steps_tokens_per_s": round(ours["tokens_per_step_s"] / theirs["tokens_per_step_s"], 3),
        "peak_rss": round(ours["peak_rss_mib"] / theirs["peak_rss_mib"], 3),
    }
