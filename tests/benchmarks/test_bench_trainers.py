"""benchmarks/bench_trainers.py's (and its modules') pure parts: the budgets matched to the peers', and the table (no training here:
tests/consumers/test_consumer_trainers.py runs the peers' trainers). The peers' view of a chat target and its rows:
test_bench_trainers_peers.py; Model Optimizer's budget and job, and the EAGLE-3 ablations:
test_bench_trainers_modelopt.py."""

import pytest

from benchmarks import bench_trainers as bench
from benchmarks import bench_trainers_eagle as eagle
from benchmarks import bench_trainers_jobs as jobs
from benchmarks import bench_trainers_medusa as medusa
from benchmarks import bench_trainers_modelopt as modelopt
from benchmarks import bench_trainers_report as report
from specheads.methods import methods


def test_eagle_budget_follows_main_py_split_epochs_and_batch():
    """main.py trains on int(0.95 N) files at --bs 4; ours takes the same optimizer steps and batch."""
    b = jobs.eagle_budget(40, 21)
    assert (b["peer_rows"], b["batch"], b["grad_accum"]) == (38, 4, 1)
    assert b["steps"] == 21 * 10  # ceil(38 / 4) batches an epoch, the last one short
    assert b["rows_seen"] == 21 * 38
    assert jobs.eagle_budget(40, 6)["steps"] == 60
    assert jobs.eagle_budget(20, 21)["peer_rows"] == 19


def test_eagle_budgets_are_states_main_py_saves():
    """main.py saves state_e only when (e + 1) % 5 != 0: the curve's budgets must be among them."""
    assert eagle.EAGLE_EPOCHS - 1 in eagle.EAGLE_SAVED
    assert all(e - 1 in eagle.EAGLE_SAVED for e in (6, 11, 21))
    assert 4 not in eagle.EAGLE_SAVED and 19 not in eagle.EAGLE_SAVED


def test_medusa_budget_counts_optimizer_steps_of_batch_times_accumulation():
    b = jobs.medusa_budget(40, 21)
    assert (b["batch"], b["grad_accum"]) == (8, 4)
    assert b["steps"] == 21 * 2  # ceil(40 / 32)
    assert b["rows_seen"] == 21 * 40
    assert jobs.medusa_budget(64, 3)["steps"] == 6
    # fewer micro-batches an epoch than the accumulation: the Trainer steps at the epoch's end
    small = jobs.medusa_budget(16, 4)
    assert (small["steps"], small["grad_accum"], small["rows_seen"]) == (4, 2, 64)
    assert jobs.medusa_budget(40, 1)["steps"] == 2  # 5 micro-batches: one step of 4, one of 1
    assert jobs.tokens_seen(b, 100.5) == round(21 * 40 * 100.5)


def row(method, trainer, epochs, tau, **kw):
    budget = jobs.medusa_budget(40, epochs)
    return {"method": method, "trainer": trainer, "budget": budget, "tokens_seen": 1000 * epochs, "tau": tau,
            "identical": "8/8", **kw}  # fmt: skip


def test_table_has_a_line_per_trainer_and_budget_with_the_range_and_runs_and_says_plainly_when_ours_loses():
    peer = dict(wall_s=30.0, peak_rss_mib=900.0, tokens_per_s=200.0, changes=["fp32"])
    rows = [
        row("Medusa", "medusa-llm 0.1", 6, 1.5, **peer),
        row("Medusa", "specheads", 6, 1.4),
        row("Medusa", "medusa-llm 0.1", 21, 1.9),
        row("Medusa", "specheads", 21, 1.7),
        row("EAGLE", "eagle-llm 1.2.1", 21, 2.0),
        row("EAGLE", "specheads", 21, 2.5),
    ]
    table = report.render_table(rows)
    lines = [line for line in table.splitlines() if line.startswith("| ")]
    assert len(lines) == 1 + len(rows)  # the header and one line a (trainer, budget): one run each here
    assert (
        "| Medusa | medusa-llm 0.1 | 6 | 12 x 32 | 6000 | 1.50 | 1 | 8/8 | 30.0 | 900 | 200 | [1] |" in table
    )
    assert "\n[1] fp32.\n" in table  # each trainer's changes from its defaults, once, under the table
    assert "| Medusa | specheads | 6 | 12 x 32 | 6000 | 1.40 | 1 | 8/8 | - | - | - | - |" in table
    # a verdict at every budget both ran, the smaller first
    small = (
        "Medusa, 6 epochs of 40 rows: ours trails (one run each: no spread, no verdict) against medusa-llm 0.1: "
        "tau 1.40 vs 1.50 (-6.7% in the mean; 1 and 1 runs)."
    )
    large = (
        "Medusa, 21 epochs of 40 rows: ours trails (one run each: no spread, no verdict) against medusa-llm 0.1: "
        "tau 1.70 vs 1.90 (-10.5% in the mean; 1 and 1 runs)."
    )
    assert small in table and large in table and table.index(small) < table.index(large)
    assert (
        "EAGLE, 21 epochs of 40 rows: ours leads (one run each: no spread, no verdict) against eagle-llm 1.2.1: "
        "tau 2.50 vs 2.00 (+25.0% in the mean;" in table
    )
    # the same epochs over other rows are another budget: another line, and a verdict each
    more = [{**r, "budget": jobs.medusa_budget(128, 6)} for r in rows[:2]]
    table = report.render_table(rows[:2] + more)
    assert len([line for line in table.splitlines() if line.startswith("| Medusa")]) == 4
    assert table.index("Medusa, 6 epochs of 40 rows: ours trails") < table.index(
        "Medusa, 6 epochs of 128 rows: ours trails"
    )
    # a budget where the peer did not run has no verdict
    assert "6 epochs of 40 rows" not in report.render_table(rows[1:4])


def test_ablations_and_the_goal_are_judged_at_the_largest_budget_only():
    rows = [
        row("EAGLE-3", "modelopt", 10, 1.5, seed=0),
        row("EAGLE-3", "specheads", 10, 1.6, seed=0),
        row("EAGLE-3", "specheads (ttt 3)", 10, 1.7, seed=0),
        row("EAGLE-3", "modelopt", 30, 2.0, seed=0),
        row("EAGLE-3", "specheads", 30, 2.2, seed=0),
        row("EAGLE-3", "specheads (ttt 3)", 30, 2.1, seed=0),
    ]
    table = report.render_table(rows)
    assert "EAGLE-3, 10 epochs of 40 rows: ours leads" in table
    assert "EAGLE-3, 30 epochs of 40 rows: ours leads" in table
    assert "30 epochs of 40 rows: specheads (ttt 3): tau 2.10 vs ours 2.20" in table
    assert "10 epochs of 40 rows: specheads (ttt 3)" not in table
    assert table.count("the goal") == 1 and "EAGLE-3, 30 epochs of 40 rows: the goal" in table


def test_gpu_memory_and_the_loops_own_rate_are_columns_where_a_run_measured_them():
    """wall tokens/s counts a process's start-up and saving (20 to 30 s on a GPU); loop tokens/s the
    training steps alone. Neither column shows where no run has it (the CPU tables stay as they were)."""
    plain = [row("EAGLE-3", "specheads", 4, 1.6, wall_s=40.0, tokens_per_s=100.0)]
    assert "peak GPU MiB" not in report.render_table(plain) and "loop tokens/s" not in report.render_table(
        plain
    )
    r = jobs.row_result("EAGLE-3", "specheads", jobs.medusa_budget(40, 4), 100.0, {"mean_accept_length": 1.6,
                        "identical_to_baseline": "8/8"}, 40.0, 900.0, loop_s=20.0, peak_accelerator_mib=1768.0)  # fmt: skip
    assert r["loop_tokens_per_s"] == r["tokens_seen"] / 20.0 == 2 * r["tokens_per_s"]
    table = report.render_table([r, row("EAGLE-3", "modelopt", 4, 1.6, peak_rss_mib=1.0)])
    header, _, ours, peer = [line.split(" | ") for line in table.splitlines()[:4]]
    assert header[10:13] == ["peak GPU MiB", "train tokens/s", "loop tokens/s"]
    assert ours[10] == "1768" and ours[12] == f"{r['loop_tokens_per_s']:.0f}" and peer[10] == peer[12] == "-"


def test_one_run_a_side_is_no_verdict_and_one_against_several_is_judged_by_the_range():
    one = {"n": 1, "mean": 1.7, "min": 1.7, "max": 1.7}
    other = {"n": 1, "mean": 1.9, "min": 1.9, "max": 1.9}
    assert report.verdict_word(one, other) == "trails (one run each: no spread, no verdict)"
    assert report.verdict_word(other, one) == "leads (one run each: no spread, no verdict)"
    assert report.verdict_word(one, one) == "ties"
    several = {"n": 3, "mean": 2.0, "min": 1.95, "max": 2.05}
    assert report.verdict_word(several, one) == "wins" and report.verdict_word(one, several) == "LOSES"
    inside = {"n": 3, "mean": 1.9, "min": 1.6, "max": 2.0}
    assert report.verdict_word(inside, one) == "ties (the ranges overlap)"


def test_repeated_runs_give_one_line_with_mean_min_max_and_n_and_overlapping_ranges_tie():
    rows = [
        row("Medusa", "medusa-llm 0.1", 6, t, identical="12/12", wall_s=w) for t, w in ((1.5, 10), (1.7, 20))
    ]
    rows += [row("Medusa", "specheads", 6, t, identical="12/12") for t in (1.6, 1.8, 2.0)]
    rows += [row("Medusa", "specheads (decay 1)", 6, t) for t in (1.5, 1.9)]
    table = report.render_table(rows)
    assert "| Medusa | medusa-llm 0.1 | 6 | 12 x 32 | 6000 | 1.60 [1.50-1.70] | 2 | 24/24 | 15.0 |" in table
    assert "| Medusa | specheads | 6 | 12 x 32 | 6000 | 1.80 [1.60-2.00] | 3 | 36/36 |" in table
    assert (
        "ours ties (the ranges overlap) against medusa-llm 0.1: tau 1.80 [1.60-2.00] vs 1.60 [1.50-1.70]"
        in table
    )
    # an ablation of ours is measured against ours, not called a peer
    assert (
        "specheads (decay 1): tau 1.70 [1.50-1.90] vs ours 1.80 [1.60-2.00]: -0.100 (2 and 3 runs)." in table
    )
    assert "ours ties (the ranges overlap) against specheads (decay 1)" not in table
    apart = [row("Medusa", "medusa-llm 0.1", 6, t) for t in (1.5, 1.6)] + [
        row("Medusa", "specheads", 6, t) for t in (1.65, 1.7)
    ]
    assert "ours wins against medusa-llm 0.1" in report.render_table(apart)
    assert report.tau_range([row("Medusa", "x", 6, None)])["n"] == 0


def test_an_ablation_is_measured_against_ours_on_the_seeds_both_ran():
    """Seed-to-seed spread outweighs most ablations: ours on seeds 0-2 and 10-11, an ablation on 10 and 11
    only, compares against ours' runs on 10 and 11; an ablation on seeds ours never ran is not compared."""
    ours = [
        row("EAGLE-3", "specheads", 30, t, seed=s)
        for s, t in ((0, 3.2), (1, 3.2), (2, 3.1), (10, 2.4), (11, 3.0))
    ]
    screened = [row("EAGLE-3", "specheads (ttt 4)", 30, t, seed=s) for s, t in ((10, 2.5), (11, 3.0))]
    elsewhere = [row("EAGLE-3", "specheads (decay 1)", 30, 2.9, seed=20)]
    table = report.render_table(ours + screened + elsewhere)
    assert (
        "specheads (ttt 4): tau 2.75 [2.50-3.00] vs ours 2.70 [2.40-3.00] on seeds 10, 11: +0.050 (2 and 2 runs)."
        in table
    )
    assert "specheads (decay 1): tau 2.90; no seed in common with ours, not compared." in table
    assert "vs ours 2.98" not in table  # never against all five of ours
    # a peer too: its runs on 10 and 11 are left out against ours on 0-2 alone, in the verdict and the goal
    peer = [row("EAGLE-3", "modelopt", 30, t, seed=s) for s, t in ((0, 3.0), (1, 3.0), (2, 3.0), (10, 1.0))]
    table = report.render_table(ours[:3] + peer)
    assert (
        "ours wins against modelopt: tau 3.17 [3.10-3.20] vs 3.00 [3.00-3.00] (+5.6% in the mean; " in table
    )
    assert "3 and 3 runs on seeds 0, 1, 2)." in table
    assert (
        "the goal (ours 5% above the best peer, modelopt: tau 3.15 or more on seeds 0, 1, 2) is met" in table
    )
    # a peer run once without a seed is compared with all of ours
    once = report.render_table(ours[:3] + [row("EAGLE-3", "modelopt", 30, 3.0)])
    assert (
        "ours wins against modelopt: tau 3.17 [3.10-3.20] vs 3.00 (+5.6% in the mean; 3 and 1 runs)." in once
    )


def test_ablations_are_medusa_llms_settings_as_our_recipe_overrides():
    budget = jobs.medusa_budget(128, 6)  # 24 steps
    assert medusa.ablation_overrides("warmup 10%", budget) == {"warmup_steps": 3}  # HF: ceil(0.1 * 24)
    assert medusa.ablation_overrides("decay 1+data labels", budget) == {"decay": 1.0, "labels": "data"}
    # medusa-llm's heads each project through a trainable copy of the target's lm_head
    assert medusa.ablation_overrides("own lm_head+target top1", budget) == {"share_lm_head": False,
                                                                             "labels": "target-top1"}  # fmt: skip
    assert modelopt.warmup_like_hf(5, 0.1) == 1
    with pytest.raises(SystemExit, match="decay 2"):  # an unknown ablation stops the bench
        medusa.ablation_overrides("decay 2", budget)
    # ours at medusa-llm's --learning_rate values (--medusa-lrs): the same rate, its README's first
    assert [medusa.ablation_overrides(f"lr {x}", budget) for x in ("2e-3", "3e-3", "5e-3")] == [
        {"lr": 2e-3},
        {"lr": 3e-3},
        {"lr": 5e-3},
    ]
    assert medusa.MEDUSA_LR == 1e-3 and medusa.MEDUSA_README["--learning_rate"] == "0.001"
    assert bench.floats("1e-3,,5e-3") == [1e-3, 5e-3]


def test_a_peer_at_another_learning_rate_is_also_set_against_ours_at_that_rate():
    """medusa-llm at --learning_rate 0.003 (--medusa-lrs) beside ours at lr 3e-3 (the ablation): the verdict
    against the recipe stays, and one at the same rate follows it; a peer rate ours never ran gets none."""
    ours = [row("Medusa", "specheads", 6, 1.5, seed=s) for s in (0, 1)]
    ours_3 = [row("Medusa", "specheads (lr 3e-3)", 6, t, seed=s) for s, t in ((0, 2.1), (1, 2.1))]
    peer_3 = [row("Medusa", "medusa-llm 0.1 (lr 0.003)", 6, t, seed=s) for s, t in ((0, 2.0), (1, 2.05))]
    peer_5 = [row("Medusa", "medusa-llm 0.1 (lr 0.005)", 6, 2.4, seed=0)]
    table = report.render_table(ours + ours_3 + peer_3 + peer_5)
    assert "ours LOSES against medusa-llm 0.1 (lr 0.003): tau 1.50 [1.50-1.50] vs 2.02" in table
    assert (
        "at the same lr, specheads (lr 3e-3) wins against medusa-llm 0.1 (lr 0.003): tau 2.10 [2.10-2.10] vs "
        "2.02 [2.00-2.05] (+3.7% in the mean; 2 and 2 runs on seeds 0, 1)." in table
    )
    assert "at the same lr, specheads (lr 5e-3)" not in table and "against medusa-llm 0.1 (lr 0.005)" in table
    assert report.lr_of("specheads (lr 2e-3)") == report.lr_of("medusa-llm 0.1 (lr 0.002)") == 0.002
    assert report.lr_of("specheads (loss all+lr 2e-3)") is None and report.lr_of("specheads") is None


def test_rows_of_methods_not_run_are_carried_from_the_report_with_their_command(tmp_path):
    old = {"command": "bench --methods eagle", "load_average": {"start": [1, 2, 3]},
           "rows": [row("EAGLE", "specheads", 21, 2.5), row("Medusa", "specheads", 6, 1.4)]}  # fmt: skip
    (tmp_path / "bench_trainers.json").write_text(bench.json.dumps(old))
    rows, origin = bench.carried_rows(tmp_path, ["medusa"])
    assert [r["method"] for r in rows] == ["EAGLE"] and origin["EAGLE"]["command"] == "bench --methods eagle"
    assert "from an earlier run: bench --methods eagle" in report.render_table(rows)
    assert bench.carried_rows(tmp_path, ["eagle", "medusa"])[0] == []
    assert bench.carried_rows(tmp_path / "none", ["medusa"]) == ([], {})


def test_plot_writes_a_png(tmp_path):
    rows = [
        row("Medusa", "specheads", 6, 1.4),
        row("Medusa", "specheads", 21, 1.7),
        row("EAGLE", "x", 6, 2.0),
        row("EAGLE", "x", 6, 2.2),
    ]
    report.plot(rows, tmp_path / "curve.png")
    assert (tmp_path / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["curve.png"]  # no partial file left beside it


def test_the_plot_draws_no_two_trainers_alike_past_ten_colours(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    rows = [row("EAGLE-3", f"specheads (ablation {i})", 4, 1.3 + i / 100) for i in range(12)]
    report.plot(rows, tmp_path / "curve.png")
    lines = [bars.lines[0] for bars in figures[0].axes[0].containers]  # each errorbar's data line
    styles = [(line.get_color(), line.get_marker()) for line in lines]
    assert len(styles) == 12 and len(set(styles)) == 12


@pytest.mark.parametrize(
    "target, title, prompts", [("tiny", "the tiny target", "held-out"), ("smollm2", "smollm2", "MT-Bench")]
)
def test_the_plot_names_the_target_and_the_prompts_tau_was_measured_on(
    tmp_path, monkeypatch, target, title, prompts
):
    import matplotlib.pyplot as plt

    figures = []
    monkeypatch.setattr(plt, "close", figures.append)  # keep the figure to read its labels
    report.plot([row("EAGLE-3", "specheads", 4, 1.35)], tmp_path / "curve.png", target)
    ax = figures[0].axes[0]
    assert ax.get_title() == f"EAGLE-3 on {title}" and prompts in ax.get_ylabel()


def test_each_measured_row_rewrites_the_report_so_a_cut_run_keeps_it():
    written = []
    rows = bench.ReportedRows(lambda rs: written.append(len(rs)))
    rows.extend([row("EAGLE", "specheads", 21, 2.5)])  # carried rows: no write of their own
    rows.append(row("Medusa", "specheads", 6, 1.4))
    rows.append(row("Medusa", "specheads", 6, 1.5))
    assert written == [2, 3]


def test_render_redraws_table_and_plot_from_the_json(tmp_path):
    rows = [row("Medusa", "specheads", 6, 1.4, seed=0), row("Medusa", "specheads", 6, 1.6, seed=1)]
    (tmp_path / "bench_trainers.json").write_text(bench.json.dumps({"rows": rows}))
    assert bench.main(["--report", str(tmp_path), "--render"]) == 0
    assert "| 1.50 [1.40-1.60] | 2 |" in (tmp_path / "bench_trainers.md").read_text()
    assert (tmp_path / "learning_curve.png").is_file()


def test_render_merges_the_rows_another_run_measured_and_records_its_command(tmp_path):
    (tmp_path / "a").mkdir()
    carried = {**row("EAGLE", "specheads", 21, 2.5), "carried_from": {"command": "old"}}
    (tmp_path / "a" / "bench_trainers.json").write_text(
        bench.json.dumps({"rows": [carried, row("Medusa", "specheads", 6, 1.4, seed=0)]})
    )
    again = row("Medusa", "specheads", 6, 1.4, seed=0)  # ours at seed 0 again, run beside a variant
    other = {
        "command": "bench --seeds 1,2",
        "rows": [carried, again, row("Medusa", "specheads", 6, 1.6, seed=1)],
    }
    (tmp_path / "b.json").write_text(bench.json.dumps(other))
    bench.main(["--report", str(tmp_path / "a"), "--render", "--merge", str(tmp_path / "b.json")])
    merged = bench.json.loads((tmp_path / "a" / "bench_trainers.json").read_text())
    assert len(merged["rows"]) == 3  # neither the other run's carried row nor its repeat counts twice
    assert (
        merged["merged_from"][0]["command"] == "bench --seeds 1,2" and merged["merged_from"][0]["rows"] == 1
    )
    assert "| 1.50 [1.40-1.60] | 2 |" in (tmp_path / "a" / "bench_trainers.md").read_text()


def test_the_report_is_the_same_json_with_each_run_on_a_line_of_its_own(tmp_path):
    rows = [row("Medusa", "specheads", 6, 1.4, seed=0), row("EAGLE", "eagle-llm", 21, 2.5, seed=1)]
    full = {"command": "bench", "load_average": {"start": [0.5, 1.0, 1.5]}, "rows": rows, "after": [1, 2]}
    text = report.report_json(full)
    assert bench.json.loads(text) == full and text.endswith("}\n")
    lines = text.splitlines()
    assert [bench.json.loads(line.rstrip(",")) for line in lines if line.startswith('  {"method"')] == rows
    assert len(report.report_json({"rows": rows}).splitlines()) == 4 + len(rows)  # a run a line
    for other in ({"rows": []}, {"rows": rows}, {"command": "bench"}, {"command": "bench", "rows": []}):
        assert bench.json.loads(report.report_json(other)) == other
    # both writers use it: a merge rewrites the report so
    (tmp_path / "bench_trainers.json").write_text(bench.json.dumps({"rows": rows[:1]}))
    (tmp_path / "b.json").write_text(bench.json.dumps({"command": "other", "rows": rows[1:]}))
    bench.main(["--report", str(tmp_path), "--render", "--merge", str(tmp_path / "b.json")])
    written = (tmp_path / "bench_trainers.json").read_text()
    assert sum(line.startswith('  {"method"') for line in written.splitlines()) == 2


def test_help_prints(capsys):
    # argparse formats help texts with %: an ablation named "warmup 10%" once made --help crash
    try:
        bench.main(["--help"])
    except SystemExit as e:
        assert e.code == 0
    out = capsys.readouterr().out
    assert "warmup 10%" in out and "--medusa-lrs" in out


# -- ours' runs and rows, EAGLE-3's verdict, and the order of each method's runs ------------------------


def test_offline_ours_builds_its_cache_with_the_runs_rows_first_and_counts_it(tmp_path, monkeypatch):
    """--ours-offline: `specheads cache` over the same recipe and overrides (not the train-only ones) into a
    folder beside the run, then `train mode=offline` from it; the wall time and peak are both processes'."""
    budget = jobs.eagle_budget(16, 21)
    ran, times = [], iter([(30.0, 500.0), (70.0, 400.0), (60.0, 400.0)])
    monkeypatch.setattr(jobs, "run_measured", lambda cmd, log, env=None: ran.append(cmd) or next(times))
    got = jobs.train_ours("eagle", tmp_path / "rows.jsonl", budget, tmp_path / "ours", {"mode": "offline"})
    cache, train = ran
    assert cache[3:5] == ["cache", str(jobs.recipe_path("tiny", "eagle"))] and train[3] == "train"
    assert cache[cache.index("--out") + 1] == str(tmp_path / "ours-cache")
    assert f"cache_dir={tmp_path / 'ours-cache'}" in train and "mode=offline" in train
    shared = [a for a in train[5:] if "=" in a and not a.startswith(("mode=", "cache_dir=", "output_dir="))]
    assert shared and all(a in cache for a in shared)  # the same rows: data, max_length, loss_on, seed ...
    assert not any(a.startswith(("mode=", "output_dir=")) for a in cache)
    assert (got["wall_s"], got["peak_rss_mib"], got["cache_s"]) == (100.0, 500.0, 30.0)
    online = jobs.train_ours("eagle", tmp_path / "rows.jsonl", budget, tmp_path / "ours", {"seed": 1})
    assert online["cache_s"] is None and ran[-1][3] == "train" and len(ran) == 3
    assert bench.arg_parser().parse_args(["--ours-offline"]).ours_offline


@pytest.mark.parametrize("target", ["tiny", "smollm2"])
def test_our_rows_list_the_answer_only_loss_only_where_the_bench_sets_it(tmp_path, monkeypatch, target):
    """train_ours puts the loss on the answers on the tiny target only, so only there do our rows' changes
    say so; offline runs add the cache's seconds."""
    monkeypatch.setattr(
        jobs, "run_measured", lambda cmd, log, env=None: (3.0, 1.0)
    )  # the cache's, then train's
    monkeypatch.setattr(
        bench, "evaluate", lambda *a: {"mean_accept_length": 1.5, "identical_to_baseline": "8/8"}
    )
    args = bench.argparse.Namespace(out=tmp_path, our_eval_batches=2, target=target, device="cpu", eval_prompts=8,
                                    eval_new_tokens=64)  # fmt: skip
    ctx = {"rows_path": tmp_path / "rows.jsonl", "eval_source": "heldout", "chat_tokens": 100.0}
    for method in ("eagle", "medusa", "eagle3"):
        row = bench.ours_row(
            method, bench.eagle_budget(16, 21), bench.OFFLINE, "dynamic", args, ctx, 0, "offline"
        )
        answer_only = [c for c in row["changes"] if c.startswith("loss_on=assistant")]
        assert len(answer_only) == (target == "tiny"), (method, row["changes"])
        assert any(c.startswith("eval_fraction=0") for c in row["changes"]) == (target != "tiny")
        assert (row["overrides"].get("loss_on") == "assistant") == (target == "tiny")
        assert row["changes"][-1].startswith("offline mode: `specheads cache` (bf16, 3 s)")
        assert row["cache_s"] == 3.0


def eagle3_row(trainer, tau, **kw):
    return {"method": "EAGLE-3", "trainer": trainer, "budget": modelopt.eagle3_budget(32, 10, 4), "tokens_seen": 9000,
            "tau": tau, "identical": "12/12", **kw}  # fmt: skip


def test_eagle3_verdict_says_whether_ours_beats_the_best_peer_by_five_percent():
    rows = [eagle3_row("modelopt 0.47.0", t) for t in (1.10, 1.20)]
    rows += [eagle3_row("modelopt 0.47.0 (lr 1e-3+warmup 10%)", t) for t in (1.60, 1.70)]
    rows += [eagle3_row("specheads", t) for t in (1.80, 1.90)]
    table = report.render_table(rows)
    assert (
        "| EAGLE-3 | modelopt 0.47.0 (lr 1e-3+warmup 10%) | 10 | 80 x 4 | 9000 | 1.65 [1.60-1.70] | 2 |"
        in table
    )
    assert "ours wins against modelopt 0.47.0: tau 1.85 [1.80-1.90] vs 1.15 [1.10-1.20]" in table
    assert (
        "EAGLE-3, 10 epochs of 32 rows: the goal (ours 5% above the best peer, modelopt 0.47.0 (lr 1e-3+warmup "
        "10%): tau 1.73 or more) is met: ours 1.85, +12.1% in the mean; and ours' lowest run clears 1.05 x its "
        "highest (1.78)." in table
    )
    close = rows[:4] + [eagle3_row("specheads", t) for t in (1.70, 1.72)]
    assert (
        "is NOT met: ours 1.71, +3.6% in the mean; and ours' lowest run does not clear"
        in report.render_table(close)
    )
    # no goal line for a method without one
    assert "the goal" not in report.render_table(
        [row("Medusa", "medusa-llm 0.1", 6, 1.5), row("Medusa", "specheads", 6, 1.4)]
    )


def test_an_eagle3_run_carries_the_eagle_and_medusa_rows(tmp_path):
    old = {"command": "bench --methods eagle,medusa",
           "rows": [row("EAGLE", "specheads", 21, 2.5), row("Medusa", "specheads", 6, 1.4), eagle3_row("specheads", 2.0)]}  # fmt: skip
    (tmp_path / "bench_trainers.json").write_text(bench.json.dumps(old))
    rows, _ = bench.carried_rows(tmp_path, ["eagle3"])
    assert [r["method"] for r in rows] == ["EAGLE", "Medusa"]


def test_one_ablations_only_flag_answers_to_its_earlier_per_method_names():
    """--ablations-only holds for every method run; the per-method names that earlier runs' commands
    (benchmarks/records/) use still set it."""
    for name in ("--ablations-only", "--medusa-ablations-only", "--eagle3-ablations-only"):
        assert bench.arg_parser().parse_args([name]).ablations_only is True
    assert bench.arg_parser().parse_args([]).ablations_only is False


def test_eagle_ablations_run_at_the_largest_budget_with_their_overrides(monkeypatch):
    calls = []
    monkeypatch.setattr(bench, "add_eagle_llm_rows", lambda lr, epochs, args, ctx: calls.append(("peer", lr)))
    monkeypatch.setattr(bench, "ours_row", lambda method, budget, extra, tree, args, ctx, seed, variant="",
                        changes=(): calls.append((budget["epochs"], seed, variant, extra)) or {})  # fmt: skip
    args = bench.argparse.Namespace(eagle_epochs="5,11", eagle_lrs="1e-3", eagle_ablations="muon,muon x4+lr 2e-3",
                                    seeds="0", eagle_tree="dynamic-16", ablations_only=False,
                                    ours_offline=False, ours_first=False)  # fmt: skip
    ctx = {"rows": bench.ReportedRows(lambda rows: None), "conversations": [("p", "a")] * 16}
    bench.run_eagle(args, ctx)
    muon4 = {"optimizer": "muon", "muon_lr_scale": 4.0, "lr": 2e-3}
    assert calls == [("peer", 1e-3), (5, 0, "", {}), (11, 0, "", {}), (11, 0, "muon", {"optimizer": "muon"}),
                     (11, 0, "muon x4+lr 2e-3", muon4)]  # fmt: skip
    calls.clear()
    args.ablations_only, args.eagle_lrs = True, ""
    bench.run_eagle(args, ctx)
    assert [c[:3] for c in calls] == [(5, 0, ""), (11, 0, "muon"), (11, 0, "muon x4+lr 2e-3")]
    with pytest.raises(SystemExit, match="--eagle-ablations: 'adam' is not one of"):
        bench.main(["--methods", "eagle", "--eagle-ablations", "adam", "--out", "/nonexistent/x"])


def test_eagle3_ablations_only_leaves_the_recipe_out_at_the_largest_budget(monkeypatch):
    calls = []
    monkeypatch.setattr(bench, "distinct_chat_tokens", lambda target, conversations: 4096)
    monkeypatch.setattr(bench, "modelopt_row", lambda *a: calls.append(("peer",)) or {})
    monkeypatch.setattr(bench, "ours_row", lambda method, budget, extra, tree, args, ctx, seed, variant="",
                        changes=(): calls.append((budget["epochs"], seed, variant)) or {})  # fmt: skip
    args = bench.argparse.Namespace(eagle3_epochs="1,3", eagle3_batch=4, eagle3_ablations="ttt 3", seeds="0",
                                    peer_seeds="", modelopt_variants="defaults", eagle_tree="dynamic-16",
                                    ablations_only=False, ours_offline=False, ours_first=False)  # fmt: skip
    writes = []  # the report is rewritten after every row, as each is measured
    ctx = {"rows": bench.ReportedRows(lambda rows: writes.append(len(rows))), "conversations": [("p", "a")] * 16,
           "eagle3_vocab": 2048, "target": None}  # fmt: skip
    bench.run_eagle3(args, ctx)
    assert calls == [(3, 0, ""), (3, 0, "ttt 3"), (1, 0, "")] and writes == [1, 2, 3]
    calls.clear()
    args.ablations_only = True
    bench.run_eagle3(args, ctx)
    assert calls == [(3, 0, "ttt 3"), (1, 0, "")]
    calls.clear()
    args.ablations_only, args.ours_offline = False, True  # offline beside the recipe, at every budget
    bench.run_eagle3(args, ctx)
    assert calls == [(3, 0, ""), (3, 0, "offline"), (3, 0, "ttt 3"), (1, 0, ""), (1, 0, "offline")]
    assert writes[-5:] == [6, 7, 8, 9, 10]


def test_medusa_runs_pair_seeds_and_ablations_only_leaves_the_recipe_out(monkeypatch):
    """run_medusa: at each seed, medusa-llm (--peer-seeds) then ours (--seeds), then ours with each ablation
    at the largest budget; --ablations-only leaves the recipe's own run out there (its rows come from
    another report) but not at the smaller budgets."""
    calls = []
    monkeypatch.setattr(bench, "medusa_llm_row", lambda budget, seed, args, ctx, lr: calls.append(
        ("peer", budget["epochs"], seed)) or {})  # fmt: skip
    monkeypatch.setattr(bench, "ours_row", lambda method, budget, extra, tree, args, ctx, seed, variant="", changes=None: calls.append(
        ("ours", budget["epochs"], seed, variant, extra.get("share_lm_head"))) or {})  # fmt: skip
    args = bench.argparse.Namespace(medusa_epochs="2,4", medusa_ablations="own lm_head", peer_seeds="0",
                                    seeds="0,1", medusa_lrs="1e-3", medusa_tree="medusa-31",
                                    ablations_only=False, ours_offline=False, ours_first=False)  # fmt: skip
    ctx = {"rows": [], "conversations": [("p", "a")] * 64}
    bench.run_medusa(args, ctx)
    assert calls == [("peer", 4, 0), ("ours", 4, 0, "", None), ("ours", 4, 0, "own lm_head", False),
                     ("ours", 4, 1, "", None), ("ours", 4, 1, "own lm_head", False),
                     ("peer", 2, 0), ("ours", 2, 0, "", None), ("ours", 2, 1, "", None)]  # fmt: skip
    calls.clear()
    args.ablations_only, args.peer_seeds = True, ""
    bench.run_medusa(args, ctx)
    assert calls == [("ours", 4, 0, "own lm_head", False), ("ours", 4, 1, "own lm_head", False),
                     ("ours", 2, 0, "", None), ("ours", 2, 1, "", None)]  # fmt: skip


def test_ours_first_runs_ours_before_the_peer_at_every_seed_and_method(monkeypatch):
    """--ours-first swaps the two sides' turns (the peer's still run, and the rows are the same), so two
    benches side by side, one with the flag, give each trainer the first turn once."""
    calls = []
    monkeypatch.setattr(bench, "distinct_chat_tokens", lambda target, conversations: 4096)
    monkeypatch.setattr(bench, "modelopt_row", lambda budget, seed, *a: calls.append(("peer", seed)) or {})
    monkeypatch.setattr(bench, "medusa_llm_row", lambda budget, seed, *a: calls.append(("peer", seed)) or {})
    monkeypatch.setattr(
        bench, "add_eagle_llm_rows", lambda lr, epochs, args, ctx: calls.append(("peer", None))
    )
    monkeypatch.setattr(bench, "ours_row", lambda method, budget, extra, tree, args, ctx, seed, variant="",
                        changes=None: calls.append(("ours", seed)) or {})  # fmt: skip
    args = bench.argparse.Namespace(eagle3_epochs="2", eagle3_batch=4, eagle3_ablations="", seeds="0,1",
                                    peer_seeds="0,1", modelopt_variants="defaults", eagle_tree="dynamic-16",
                                    medusa_epochs="2", medusa_ablations="", medusa_lrs="1e-3",
                                    medusa_tree="medusa-31", eagle_epochs="2", eagle_lrs="1e-3",
                                    eagle_ablations="", ablations_only=False, ours_offline=False,
                                    ours_first=False)  # fmt: skip
    ctx = {"rows": [], "conversations": [("p", "a")] * 16, "eagle3_vocab": 2048, "target": None}
    paired = [("peer", 0), ("ours", 0), ("peer", 1), ("ours", 1)]
    for run in (bench.run_eagle3, bench.run_medusa):
        for first, expected in ((False, paired), (True, [paired[i] for i in (1, 0, 3, 2)])):
            calls.clear()
            args.ours_first = first
            run(args, ctx)
            assert calls == expected, (run.__name__, first)
    for first, expected in ((False, [("peer", None), ("ours", 0), ("ours", 1)]),
                            (True, [("ours", 0), ("ours", 1), ("peer", None)])):  # fmt: skip
        calls.clear()
        args.ours_first = first
        bench.run_eagle(args, ctx)
        assert calls == expected
    assert bench.arg_parser().parse_args(["--ours-first"]).ours_first is True
    assert bench.arg_parser().parse_args([]).ours_first is False


def test_every_medusa_ablation_is_a_valid_recipe_override():
    """Each name gives keys and values both Medusa recipes take (a typo would stop a bench run late)."""
    from specheads.train.recipe import load_config

    budget = {"steps": 96, "epochs": 3}
    for target in ("tiny", "smollm2"):
        for name in medusa.MEDUSA_ABLATIONS:
            overrides = medusa.ablation_overrides(name, budget)
            load_config(
                jobs.recipe_path(target, "medusa"),
                [f"{k}={v}" for k, v in overrides.items()],
                methods=methods(),
            )
    assert medusa.ablation_overrides("muon+lr 2e-3", budget) == {"optimizer": "muon", "lr": 2e-3}
