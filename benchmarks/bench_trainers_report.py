"""The report of benchmarks/bench_trainers.py: its table, verdicts and learning curve, from the rows (pure apart
from plot and render's files). `bench_trainers.py --render [--merge OTHER.json]` redraws them from the JSON.

A row is one training run decoded once: method, trainer, budget (peer_rows, epochs, batch, grad_accum,
steps, rows_seen), tokens_seen, tau (eval's mean accept length), identical ("N/N", eval's greedy check),
wall_s, peak_rss_mib, tokens_per_s, changes (from the trainer's defaults), and whatever else the run
recorded (seed, overrides, load_average, carried_from).
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.bench_trainers_paired import paired, paired_line

# The bar ours must clear: above the best peer by this fraction of its tau (in the mean), per method.
GOALS = {"EAGLE-3": 0.05}


def fmt(x, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def groups(rows: list[dict]) -> list[list[dict]]:
    """The runs of each (method, trainer, budget), in first-seen order: one table line each. A budget is
    its rows and epochs (runs at other --rows with the same epochs are another budget)."""
    out: dict[tuple, list[dict]] = {}
    for r in rows:
        out.setdefault((r["method"], r["trainer"], budget_key(r)), []).append(r)
    return list(out.values())


def budget_key(row: dict) -> tuple[int, int, int]:
    """(rows, epochs, rows seen) of a row's budget."""
    b = row["budget"]
    return b["peer_rows"], b["epochs"], b["rows_seen"]


def budget_words(key: tuple) -> str:
    """A budget_key in the verdicts' words: '21 epochs of 30 rows'."""
    return f"{key[1]} epochs of {key[0]} rows"


def run_key(row: dict) -> tuple:
    """One run: (method, trainer, budget, seed)."""
    return row["method"], row["trainer"], budget_key(row), row.get("seed")


def tau_range(runs: list[dict]) -> dict:
    """mean, min, max and n of the runs' tau (runs without one left out)."""
    taus = [r["tau"] for r in runs if r.get("tau") is not None]
    if not taus:
        return {"mean": None, "min": None, "max": None, "n": 0}
    return {"mean": sum(taus) / len(taus), "min": min(taus), "max": max(taus), "n": len(taus)}


def fmt_range(t: dict) -> str:
    if t["n"] == 0:
        return "-"
    if t["n"] == 1:
        return f"{t['mean']:.2f}"
    return f"{t['mean']:.2f} [{t['min']:.2f}-{t['max']:.2f}]"


def mean_of(runs: list[dict], key: str):
    xs = [r[key] for r in runs if r.get(key) is not None]
    return sum(xs) / len(xs) if xs else None


def identical_sum(runs: list[dict]) -> str:
    """'36/36': the greedy-identity counts of all runs added up."""
    pairs = [r.get("identical", "") for r in runs]
    try:
        got, of = zip(*(map(int, p.split("/")) for p in pairs))
    except ValueError:
        return "-"
    return f"{sum(got)}/{sum(of)}"


def render_table(rows: list[dict]) -> str:
    """Markdown: one line per (method, trainer, budget) with tau's mean [min-max] over its runs and their
    number; each trainer's changes from its defaults as a numbered note under the table; a verdict line
    per method and budget both ran, and, at the largest, what each ablation of ours bought."""
    # a GPU's memory where any run measured it; the training loop's own rate where any trainer gave it
    gpu = any(r.get("peak_accelerator_mib") for r in rows)
    loop = any(r.get("loop_tokens_per_s") for r in rows)
    cols = ["method", "trainer", "epochs", "steps x rows/step", "target tokens seen", "tau mean [min-max]",
            "runs", "greedy = generate()", "train wall s", "peak RSS MiB", *(["peak GPU MiB"] * gpu),
            "train tokens/s", *(["loop tokens/s"] * loop), "changes"]  # fmt: skip
    head = "| " + " | ".join(cols) + " |\n" + "|---" * len(cols) + "|\n"
    notes: list[tuple] = []
    lines = []
    for runs in groups(rows):
        r = runs[0]
        b, changes = r["budget"], tuple(r.get("changes", []))
        if r.get("carried_from"):
            changes += (f"from an earlier run: {r['carried_from'].get('command')}",)
        if changes and changes not in notes:
            notes.append(changes)
        note = f"[{notes.index(changes) + 1}]" if changes else "-"
        lines.append(
            f"| {r['method']} | {r['trainer']} | {b['epochs']} | {b['steps']} x {b['batch'] * b['grad_accum']} "
            f"| {r['tokens_seen']} | {fmt_range(tau_range(runs))} | {tau_range(runs)['n']} "
            f"| {identical_sum(runs)} | {fmt(mean_of(runs, 'wall_s'), '.1f')} "
            f"| {fmt(mean_of(runs, 'peak_rss_mib'), '.0f')} "
            + (f"| {fmt(mean_of(runs, 'peak_accelerator_mib'), '.0f')} " if gpu else "")
            + f"| {fmt(mean_of(runs, 'tokens_per_s'), '.0f')} "
            + (f"| {fmt(mean_of(runs, 'loop_tokens_per_s'), '.0f')} " if loop else "")
            + f"| {note} |"
        )
    text = head + "\n".join(lines) + "\n"
    text += "".join(f"\n[{i}] {'; '.join(n)}.\n" for i, n in enumerate(notes, 1))
    return text + "".join(verdicts(rows)) + "\n"


def verdict_word(ours: dict, peer: dict) -> str:
    """'wins' / 'LOSES' when the tau ranges do not overlap, else 'ties (the ranges overlap)'. One run a side
    has no spread to judge a difference by: 'leads' / 'trails' then, and no verdict."""
    if ours["n"] > 1 or peer["n"] > 1:
        if ours["min"] > peer["max"]:
            return "wins"
        if ours["max"] < peer["min"]:
            return "LOSES"
        return "ties (the ranges overlap)"
    if ours["mean"] == peer["mean"]:
        return "ties"
    return f"{'leads' if ours['mean'] > peer['mean'] else 'trails'} (one run each: no spread, no verdict)"


def verdicts(rows: list[dict]) -> list[str]:
    """Ours against each peer, in plain words, at every budget of a method both ran, the smaller first (a
    learning curve's merged report judges each of its points); at each method's largest budget also each
    ablation of ours against ours, ours against a peer at the peer's learning rate, and the goal."""
    out = []
    for method in dict.fromkeys(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == method and r["trainer"] == "specheads"]
        if not mine:
            continue
        keys = sorted({budget_key(r) for r in mine}, key=lambda k: (k[2], k[1]))  # by rows seen
        for key in keys[:-1]:
            mine_at = [r for r in mine if budget_key(r) == key]
            if tau_range(mine_at)["n"] == 0:
                continue
            for runs in groups(rows):
                r = runs[0]
                if (
                    r["method"] == method
                    and not r["trainer"].startswith("specheads")
                    and budget_key(r) == key
                ):
                    out += peer_verdict(method, key, mine_at, runs)[0]
        out += largest_budget_verdicts(rows, method, mine, keys[-1])
    return out


def peer_verdict(
    method: str, key: tuple, mine: list[dict], runs: list[dict]
) -> tuple[list[str], tuple | None]:
    """Ours (`mine`) against a peer's runs at one budget: the verdict and the paired line, and (ours' range,
    the peer's, its name, the seeds, the pairing) for the goal; ([], None) where the peer has no tau."""
    if tau_range(runs)["n"] == 0:
        return [], None
    trainer = runs[0]["trainer"]
    lead = f"\n{method}, {budget_words(key)}: "
    mine_m, runs_m, on = common_seeds(mine, runs)
    base, other = tau_range(mine_m), tau_range(runs_m)
    out = [
        f"{lead}ours {verdict_word(base, other)} against {trainer}: tau "
        f"{fmt_range(base)} vs {fmt_range(other)} ({(base['mean'] / other['mean'] - 1) * 100:+.1f}% "
        f"in the mean; {base['n']} and {other['n']} runs{on})."
    ]
    pair = paired(mine_m, runs_m)
    if pair:
        out.append(f"{lead}ours against {trainer}, {paired_line(pair)}")
    return out, (base, other, trainer, on, pair)


def largest_budget_verdicts(rows: list[dict], method: str, mine: list[dict], top: tuple) -> list[str]:
    """At a method's largest budget: ours against each peer, each ablation of ours against ours, ours at a
    peer's learning rate against it, and the goal."""
    mine_top = [r for r in mine if budget_key(r) == top]
    if tau_range(mine_top)["n"] == 0:
        return []
    where = budget_words(top)
    out, peers = [], []
    for runs in groups(rows):
        r = runs[0]
        if r["method"] != method or r["trainer"] == "specheads" or budget_key(r) != top:
            continue
        if tau_range(runs)["n"] == 0:
            continue
        lead = f"\n{method}, {where}: "
        if r["trainer"].startswith("specheads ("):
            if not {x.get("seed") for x in runs} & {x.get("seed") for x in mine_top}:
                out.append(
                    f"{lead}{r['trainer']}: tau {fmt_range(tau_range(runs))}; no seed in common with ours, "
                    "not compared."
                )
                continue
            mine_m, runs_m, on = common_seeds(mine_top, runs)
            other, base = tau_range(runs_m), tau_range(mine_m)
            out.append(
                f"{lead}{r['trainer']}: tau {fmt_range(other)} vs ours {fmt_range(base)}{on}: "
                f"{other['mean'] - base['mean']:+.3f} ({other['n']} and {base['n']} runs)."
            )
            pair = paired(runs_m, mine_m)
            if pair:
                out.append(f"{lead}{r['trainer']} against ours, {paired_line(pair, 'it')}")
            continue
        lines, judged = peer_verdict(method, top, mine_top, runs)
        out += lines
        peers.append(judged)
        matched = same_lr(rows, method, top, lr_of(r["trainer"]))
        if matched:  # the peer at another learning rate: ours at that rate too, where it ran
            mine_l, runs_l, on_l = common_seeds(matched, runs)
            base_l, other_l = tau_range(mine_l), tau_range(runs_l)
            out.append(
                f"{lead}at the same lr, {matched[0]['trainer']} {verdict_word(base_l, other_l)} against "
                f"{r['trainer']}: tau {fmt_range(base_l)} vs {fmt_range(other_l)} "
                f"({(base_l['mean'] / other_l['mean'] - 1) * 100:+.1f}% in the mean; {base_l['n']} and "
                f"{other_l['n']} runs{on_l})."
            )
    if method in GOALS and peers:
        out.append(goal_line(method, where, *max(peers, key=lambda p: p[1]["mean"])))
    return out


def lr_of(trainer: str) -> float | None:
    """The learning rate a trainer line names, '... (lr 0.002)' or '... (lr 2e-3)'; None for any other."""
    _, _, rest = trainer.partition(" (lr ")
    if not rest.endswith(")"):
        return None
    try:
        return float(rest[:-1])
    except ValueError:
        return None


def same_lr(rows: list[dict], method: str, budget: tuple, lr: float | None) -> list[dict]:
    """Our runs of `method` at `budget` whose only change is learning rate `lr` (ablation 'lr X')."""
    if lr is None:
        return []
    return [
        r
        for r in rows
        if r["method"] == method
        and r["trainer"].startswith("specheads (lr ")
        and lr_of(r["trainer"]) == lr
        and budget_key(r) == budget
    ]


def common_seeds(mine: list[dict], runs: list[dict]) -> tuple[list[dict], list[dict], str]:
    """Both sides' runs on the seeds both ran, and ' on seeds a, b' naming them. Seed-to-seed spread is
    larger than most differences measured here, so runs on other seeds are left out; sides sharing no
    seed (a peer run once, unseeded) are kept whole, with '' for the seeds."""
    seeds = {r.get("seed") for r in mine} & {r.get("seed") for r in runs}
    if not seeds:
        return mine, runs, ""
    named = sorted(s for s in seeds if s is not None)
    on = f" on seed{'s' if len(named) > 1 else ''} {', '.join(map(str, named))}" if named else ""
    return [r for r in mine if r.get("seed") in seeds], [r for r in runs if r.get("seed") in seeds], on


def goal_line(
    method: str, where: str, ours: dict, best: dict, trainer: str, on: str = "", pair: dict | None = None
) -> str:
    """Whether ours' mean tau clears the best peer's by GOALS[method], whether the ranges do too, and where
    the runs kept their prompts (`pair`, bench_trainers_paired.paired), whether the paired interval does."""
    need = 1 + GOALS[method]
    met = ours["mean"] >= need * best["mean"]
    apart = ours["min"] >= need * best["max"]
    line = (
        f"\n{method}, {where}: the goal (ours {GOALS[method]:.0%} above the best peer, {trainer}: tau "
        f"{need * best['mean']:.2f} or more{on}) is {'met' if met else 'NOT met'}: ours {ours['mean']:.2f}, "
        f"{(ours['mean'] / best['mean'] - 1) * 100:+.1f}% in the mean; "
        f"{'and' if apart == met else 'but'} ours' lowest run {'clears' if apart else 'does not clear'} "
        f"{need:.2f} x its highest ({need * best['max']:.2f})"
    )
    if pair is None:
        return line + "."
    clears = pair["lo"] >= GOALS[method]
    return (
        f"{line}; {'and' if clears == met else 'but'} the paired interval's low end ({pair['lo'] * 100:+.1f}%) "
        f"{'clears' if clears else 'does not clear'} {GOALS[method]:+.0%}."
    )


def plot(rows: list[dict], path: Path, target: str = "tiny") -> None:
    """tau against target tokens seen, a panel per method, a line per trainer; `target` names the target and
    the prompts tau was measured on (the tiny target's held-out files, else MT-Bench)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    from specheads.evaluate.plots import save_png

    methods = list(dict.fromkeys(r["method"] for r in rows))
    n_trainers = max(len({r["trainer"] for r in rows if r["method"] == m}) for m in methods)
    fig, axes = plt.subplots(
        1, len(methods), figsize=(5.5 * len(methods), 4 + 0.2 * n_trainers), squeeze=False
    )
    for ax, method in zip(axes[0], methods):
        trainers = dict.fromkeys(r["trainer"] for r in rows if r["method"] == method)
        for i, trainer in enumerate(trainers):
            pts = sorted(
                (runs[0]["tokens_seen"], tau_range(runs))
                for runs in groups([r for r in rows if r["method"] == method and r["trainer"] == trainer])
                if tau_range(runs)["n"]
            )
            x, t = [p[0] for p in pts], [p[1] for p in pts]
            n = max(p["n"] for p in t)
            # matplotlib's 10 colours, then the same colours with another marker: no two lines alike
            ax.errorbar(x, [p["mean"] for p in t], color=f"C{i % 10}", marker="osD^v"[i // 10 % 5], capsize=3,
                        yerr=[[p["mean"] - p["min"] for p in t], [p["max"] - p["mean"] for p in t]],
                        label=trainer + (f" (mean, min-max of up to {n} runs)" if n > 1 else ""))  # fmt: skip
        ax.set_title(f"{method} on the tiny target" if target == "tiny" else f"{method} on {target}")
        ax.set_xlabel("target tokens seen in training")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / 1000:g}k"))  # 40k, not 40000
        ax.set_ylabel(f"tau (our decoder, {'held-out prompts' if target == 'tiny' else 'MT-Bench'})")
        ax.grid(alpha=0.3)
        # under the panel: inside, the labels of four or more trainers cover the points
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16))
    fig.tight_layout()
    save_png(fig, path, dpi=100)
    plt.close(fig)


def report_json(report: dict) -> str:
    """The report as JSON: a key per line, and each run in "rows" on one line of its own, after the other keys.
    It is the same JSON as indent=1 gives, in fewer bytes (the tracked reports, whose runs are mostly long
    strings, by 9%; they count against the room a GPU job leaves the repository: tests/benchmarks/test_gpu_scripts.py),
    and a run is one line in a diff."""
    head = {k: v for k, v in report.items() if k != "rows"}
    rows = ",\n  ".join(json.dumps(r, default=str) for r in report.get("rows", []))
    text = json.dumps(head, indent=1, default=str)
    if "rows" not in report:
        return text + "\n"
    rows = f'"rows": [\n  {rows}\n ]' if rows else '"rows": []'
    return (text[:-2] + ",\n " if head else "{\n ") + rows + "\n}\n"


def render(report: Path, merge: list[Path]) -> None:
    """Redraw `report`'s table and plot from its JSON, after adding the rows other runs measured."""
    path = report / "bench_trainers.json"
    data = json.loads(path.read_text())
    for other in merge:
        more = json.loads(other.read_text())
        # a run (trainer, budget, seed) already in the report is not counted twice: runs made beside each
        # other repeat ours at a seed to compare a variant with it (training is deterministic per seed)
        have = {run_key(r) for r in data["rows"]}
        rows = [r for r in more["rows"] if not r.get("carried_from") and run_key(r) not in have]
        data["rows"] += rows
        data.setdefault("merged_from", []).append(
            {"command": more.get("command"), "load_average": more.get("load_average"), "rows": len(rows),
             "total_wall_s": more.get("total_wall_s"), "finished": more.get("finished")}
        )  # fmt: skip
    if merge:
        path.write_text(report_json(data))
    (report / "bench_trainers.md").write_text(render_table(data["rows"]))
    plot(data["rows"], report / "learning_curve.png", data.get("settings", {}).get("target", "tiny"))
