"""benchmarks/bench_trainers_paired.py: two lines of runs compared prompt by prompt (the same text decoded, the
steps apart), with a bootstrap over the prompts and each line's runs; and the verdicts that carry it."""

import json

import pytest

from benchmarks import bench_trainers as bench
from benchmarks import bench_trainers_jobs as jobs
from benchmarks import bench_trainers_modelopt as modelopt
from benchmarks import bench_trainers_paired as paired_mod
from benchmarks import bench_trainers_report as report

paired, paired_line = paired_mod.paired, paired_mod.paired_line

IDS = [str(80 + i) for i in range(12)]


def run(steps, tokens=64, ids=IDS, **kw):
    """A row whose eval took steps[i] (a list) or steps (one number) over prompt ids[i]."""
    steps = steps if isinstance(steps, list) else [steps] * len(ids)
    return {"tau": None, "per_prompt": {p: [tokens, s] for p, s in zip(ids, steps)}, **kw}


def tau_of(r):
    return sum(n - 1 for n, _ in r["per_prompt"].values()) / sum(s for _, s in r["per_prompt"].values())


def test_ahead_on_every_prompt_is_a_difference_clear_of_zero():
    ours = [run([30 + i for i in range(12)]), run([31 + i for i in range(12)])]
    other = [run([36 + i for i in range(12)]), run([37 + i for i in range(12)])]
    p = paired(ours, other)
    assert (p["n_prompts"], p["runs"], p["ahead"], p["behind"], p["level"]) == (12, [2, 2], 12, 0, 0)
    # the table's tau: each run's over the prompts, then the mean of the line's runs
    want = (tau_of(ours[0]) + tau_of(ours[1])) / (tau_of(other[0]) + tau_of(other[1])) - 1
    assert p["diff"] == pytest.approx(want)
    assert 0 < p["lo"] < p["diff"] < p["hi"]
    assert "ours ahead on 12, behind on 0, level on 0; +" in paired_line(p)
    assert paired_line(p).endswith("above zero: ours leads across prompts and seeds.")


def test_a_lead_that_one_prompt_makes_is_not_settled_by_the_prompts():
    """Ahead in the mean, by one prompt alone: the bootstrap draws sets of prompts without it."""
    ours, other = run([10] + [41] * 11), run([40] * 12)
    p = paired([ours], [other])
    assert p["diff"] > 0.02 and (p["ahead"], p["behind"]) == (1, 11)
    assert p["lo"] < 0 < p["hi"]
    line = paired_line(p)
    assert "(a bootstrap drawing the prompts)" in line  # one run a side: nothing of the seeds in it
    assert line.endswith("across zero: these prompts do not settle it.")
    # behind on every prompt: below zero
    assert paired_line(paired([other], [run(30)])).endswith("below zero: ours trails across prompts.")


def test_the_interval_counts_the_spread_of_the_seeds_not_only_of_the_prompts():
    """Runs that differ by a factor on every prompt: the prompts alone give no spread in the ratio, the
    runs drawn anew do."""
    one = paired([run(32)], [run(36)])
    assert one["lo"] == pytest.approx(one["diff"]) and one["hi"] == pytest.approx(one["diff"])
    two = paired([run(28), run(36)], [run(36), run(36)])
    assert two["hi"] - two["lo"] > 0.15  # both of ours' runs drawn as the 28-step one, or both as the 36-step
    assert two["lo"] <= 0 < two["diff"] < two["hi"]


def test_only_the_prompts_every_run_decoded_are_compared_and_a_run_without_records_stops_it():
    ours = [run(30), run(30, ids=IDS[:8])]
    other = [run(36, ids=IDS[4:])]
    assert paired(ours, other)["n_prompts"] == 4
    assert paired([run(30), {"tau": 1.5}], other) is None  # an eval from before the records were kept
    assert paired([run(30, ids=IDS[:2])], [run(30, ids=IDS[2:4])]) is None
    p = paired([run([30, 36, 40])], [run([36, 36, 38])])
    assert (p["ahead"], p["behind"], p["level"]) == (1, 1, 1)


def test_the_bootstrap_is_the_same_every_time():
    ours, other = [run([30 + i % 5 for i in range(12)])], [run([33 - i % 4 for i in range(12)])]
    assert paired(ours, other) == paired(ours, other)


def test_a_rows_records_are_its_evals_new_tokens_and_steps_by_prompt():
    ev = {"mean_accept_length": 1.5, "identical_to_baseline": "2/2", "per_prompt": [
        {"id": 81, "new_tokens": 64, "steps": 40, "accept_lengths": [1] * 40}, {"id": "91", "new_tokens": 12, "steps": 9}]}  # fmt: skip
    assert paired_mod.prompt_steps(ev) == {"81": [64, 40], "91": [12, 9]}
    assert paired_mod.prompt_steps({"mean_accept_length": 1.5}) is None
    row = jobs.row_result("EAGLE-3", "specheads", modelopt.eagle3_budget(32, 10, 4), 100.0, ev)
    assert row["per_prompt"] == {"81": [64, 40], "91": [12, 9]}


def eagle3(trainer, steps, seed):
    return {"method": "EAGLE-3", "trainer": trainer, "budget": modelopt.eagle3_budget(32, 10, 4),
            "tokens_seen": 9000, "identical": "12/12", "seed": seed, **run(steps), "tau": tau_of(run(steps))}  # fmt: skip


def test_the_verdicts_and_the_goal_carry_the_paired_comparison_where_the_runs_kept_their_prompts():
    rows = [eagle3("modelopt 0.47.0", [40 + i % 3 for i in range(12)], s) for s in (0, 1)]
    rows += [eagle3("specheads", [34 + i % 2 for i in range(12)], s) for s in (0, 1)]
    rows += [eagle3("specheads (teacher T 1.5)", 35, s) for s in (0, 1)]
    table = report.render_table(rows)
    assert "EAGLE-3, 10 epochs of 32 rows: ours wins against modelopt 0.47.0" in table
    assert (
        "EAGLE-3, 10 epochs of 32 rows: ours against modelopt 0.47.0, paired on the 12 prompts both decoded: "
        "ours ahead on 12, behind on 0, level on 0; +" in table
    )
    assert (
        "specheads (teacher T 1.5) against ours, paired on the 12 prompts both decoded: it ahead on 0, "
        in table
    )
    pair = paired(rows[2:4], rows[:2])
    assert pair["lo"] > 0.05  # 34.5 steps a prompt against 41: +18%
    assert f"and the paired interval's low end ({pair['lo'] * 100:+.1f}%) clears +5%." in table
    # rows from before the records were kept: the verdicts as they were
    old = [{k: v for k, v in r.items() if k != "per_prompt"} for r in rows]
    assert "paired" not in report.render_table(old)
    assert "its highest (" in report.render_table(old) and "+5%." not in report.render_table(old)


@pytest.mark.parametrize(("target", "n"), [("tiny", 12), ("smollm2", 32)])
def test_tau_is_measured_on_32_mt_bench_prompts_on_smollm2_unless_told(target, n):
    """8 MT-Bench prompts made level heads look 1.2%-1.7% apart (benchmarks/records/eagle3-smollm2/2026-12-05-eval32)."""

    def parsed(*argv):
        return bench.bench_trainers_args.with_target_defaults(bench.arg_parser().parse_args(argv))

    assert parsed("--target", target).eval_prompts == n
    assert parsed("--target", target, "--eval-prompts", "8").eval_prompts == 8


TIME_V = """\tCommand being timed: "specheads train recipes/smollm2-135m/eagle3.yaml"
\tUser time (seconds): 2392.51
\tSystem time (seconds): 11.03
\tElapsed (wall clock) time (h:mm:ss or m:ss): 1:02:03.5
\tMaximum resident set size (kbytes): 3306780
\tMinor (reclaiming a frame) page faults: 690123
\tExit status: 0
"""


def test_time_v_reads_the_figures_a_run_ended_with(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("train: 100%|##########| 200/200\n" + TIME_V)
    assert paired_mod.time_v(log) == {
        "wall_s": 3723.5,  # h:mm:ss
        "user_s": 2392.51,
        "system_s": 11.03,
        "peak_rss_mib": 3229.3,
        "minor_page_faults": 690123,
        "exit_status": 0,
    }
    log.write_text(TIME_V.replace("1:02:03.5", "40:59.08"))
    assert paired_mod.time_v(log)["wall_s"] == 2459.1  # m:ss


def test_eval_record_keeps_the_figures_and_the_prompts(tmp_path):
    results = {
        "mean_accept_length": 1.7,
        "accept_rate_per_depth": [0.5, 0.2],
        "identical_to_baseline": "2/2",
        "speedup": 0.9,
        "new_tokens": 128,
        "steps": 75,
        "command": "specheads eval",
        "per_category": {"writing": {"mean_accept_length": 1.8, "steps": 40}},
        "per_prompt": [{"id": 81, "new_tokens": 64, "steps": 35}, {"id": 82, "new_tokens": 64, "steps": 40}],
        "calibration": {"not": "kept"},
    }
    (tmp_path / "results.json").write_text(json.dumps(results))
    record = paired_mod.eval_record(tmp_path)
    assert record["per_category"] == {"writing": 1.8}
    assert record["per_prompt"] == {"81": [64, 35], "82": [64, 40]}
    assert record["steps"] == 75 and "calibration" not in record and record["mean_accept_length"] == 1.7


def test_a_pairs_records_and_their_ratios(tmp_path):
    """modelopt_record / ours_record read a pair's files; with_speeds and side_by_side give its tokens/s."""
    results = {
        "mean_accept_length": 1.7, "accept_rate_per_depth": [0.5], "identical_to_baseline": "2/2",
        "speedup": 0.9, "new_tokens": 128, "steps": 75, "command": "specheads eval",
        "per_category": {}, "per_prompt": [{"id": 81, "new_tokens": 64, "steps": 35}],
    }  # fmt: skip
    for name in ("modelopt-s0", "ours-s0"):
        (tmp_path / f"eval-{name}").mkdir()
        (tmp_path / f"eval-{name}" / "results.json").write_text(json.dumps(results))
        (tmp_path / name).mkdir()
    (tmp_path / "modelopt-s0.log").write_text(TIME_V)  # 1:02:03.5, 3229.3 MiB
    (tmp_path / "ours-s0.log").write_text(
        TIME_V.replace("1:02:03.5", "51:43.0").replace("3306780", "2645450")
    )
    history = [{"loss": 9.0, "step": 10}, {"eval": 1}, {"loss": 4.0, "step": 200}]
    out = {"log_history": history, "seconds": {"train": 3600.0}, "global_step": 200}
    (tmp_path / "modelopt-s0" / "out.json").write_text(json.dumps(out))
    (tmp_path / "modelopt-s0" / "job.json").write_text(
        json.dumps({"overrides": ["training.learning_rate=0.002"]})
    )
    summary = {"wall_seconds": 3100.0, "step_seconds": 15.0, "eval_seconds": 60.0}
    (tmp_path / "ours-s0" / "train_summary.json").write_text(json.dumps(summary))

    theirs = paired_mod.modelopt_record(tmp_path, "modelopt-s0", 372_350, seed=0)
    assert theirs["seed"] == 0 and theirs["loss_first_last"] == [9.0, 4.0] and theirs["loop_s"] == 3600.0
    assert theirs["overrides"] == ["training.learning_rate=0.002"] and theirs["eval"]["per_prompt"] == {
        "81": [64, 35]
    }
    ours = paired_mod.ours_record(tmp_path, "ours-s0", 372_350, record="2026-12-06-teacher-columns")
    assert (
        ours["record"] == "2026-12-06-teacher-columns"
        and ours["train_summary"] == summary
        and ours["wall_s"] == 3103.0
    )

    theirs, ours = paired_mod.with_speeds(theirs, 200), paired_mod.with_speeds(ours, 200)
    assert theirs["tokens_per_s"] == 100.0 and theirs["tokens_per_step_s"] == round(372_350 / 3600, 1)
    assert ours["tokens_per_s"] == 120.0 and ours["tokens_per_step_s"] == round(372_350 / 3000, 1)
    assert paired_mod.side_by_side(ours, theirs) == {
        "tokens_per_s": 1.2,
        "steps_tokens_per_s": round(124.1 / 103.4, 3),
        "peak_rss": round(2583.4 / 3229.3, 3),
    }
