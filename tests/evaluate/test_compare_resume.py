"""`specheads compare` stopped and resumed, with `--tree auto` and with a draft vocabulary (shared: the
compare_setup fixture in conftest.py, compare_helpers.py)."""

import json
import shlex
from types import SimpleNamespace

import pytest
import torch
from compare_helpers import check_entry, compare_args, compare_cli

from specheads.core.target import FrozenTarget
from specheads.evaluate import compare
from specheads.evaluate.compare_records import Run, records_for
from specheads.evaluate.conversations import Conversation
from specheads.evaluate.peers import Decoded
from specheads.heads import load_heads, save_heads
from specheads.methods import methods

from helpers import stop_at_call

TIMINGS = {"seconds", "baseline_seconds", "turn_seconds", "phase_seconds"}


def outputs(results: dict) -> dict:
    """Every method's per-prompt records without timings, and the order: what a resume must reproduce."""
    methods = {
        m["name"]: [{k: v for k, v in r.items() if k not in TIMINGS} for r in m["per_prompt"]]
        for m in results["methods"]
    }
    return {"methods": methods, "order": results["order"]}


def test_a_stopped_compare_keeps_whole_conversations_and_resumes(
    compare_setup, tmp_path, monkeypatch, capsys
):
    args = ["--heads", str(compare_setup["root"] / "medusa"), "--peers", "generate", "--tree", "chain-4"]
    args += ["--warmup", "0", "--no-plots", "--max-turns", "1", "--num-prompts", "2"]
    whole = tmp_path / "whole"
    assert compare_cli(compare_args(compare_setup, whole, compare_setup["questions"], *args)) == 0
    assert not (whole / "progress.jsonl").exists()

    out = tmp_path / "stopped"
    stop_at_call(monkeypatch, compare, "run_conversation", 4)  # the second conversation's second method
    with pytest.raises(KeyboardInterrupt):
        compare_cli(compare_args(compare_setup, out, compare_setup["questions"], *args))
    monkeypatch.undo()
    assert not (out / "results.json").exists()
    lines = [json.loads(line) for line in (out / "progress.jsonl").read_text().splitlines()]
    assert lines[0]["progress"] == "compare" and len(lines) == 2  # only the finished conversation
    assert sorted(lines[1]["runs"]) == ["generate", "medusa"]
    assert "stopped after 1 of 2 prompts" in capsys.readouterr().out

    with pytest.raises(ValueError, match="max_new_tokens"):
        compare_cli(
            compare_args(compare_setup, out, compare_setup["questions"], *args, "--max-new-tokens", "3")
        )
    assert compare_cli(compare_args(compare_setup, out, compare_setup["questions"], *args, "--resume")) == 0
    assert not (out / "progress.jsonl").exists()
    resumed, reference = (json.loads((d / "results.json").read_text()) for d in (out, whole))
    assert outputs(resumed) == outputs(reference)
    answers = [json.loads(line)["choices"][0]["turns"] for line in (out / "answers/medusa.jsonl").open()]
    assert answers == [
        json.loads(line)["choices"][0]["turns"] for line in (whole / "answers/medusa.jsonl").open()
    ]


def test_compare_tree_auto_calibrates_each_heads_and_resumes_with_its_trees(
    compare_setup, tmp_path, monkeypatch
):
    """`--tree auto`: each heads directory's tree calibrated on the held-out last prompts, which are not
    compared; a stopped run keeps the trees and a resumed one decodes with them, whatever it would time."""
    from specheads.evaluate import calibrate

    def timings_favouring(largest: bool) -> list:
        timed = []

        def measure(nodes, drafters):
            timed.append(list(nodes))
            return [1e-3 / n if largest else 1e-3 * n for n in nodes], [1e-4] * len(drafters)

        monkeypatch.setattr(calibrate, "measured_timer", lambda *a: SimpleNamespace(measure=measure))
        return timed

    heads = ["--heads", str(compare_setup["root"] / "medusa"), str(compare_setup["root"] / "eagle")]
    args = [*heads, "--peers", "generate", "--tree", "auto", "--calibration-prompts", "1"]
    args += ["--warmup", "0", "--no-plots", "--max-turns", "1"]
    whole = tmp_path / "whole"
    timings_favouring(largest=True)
    assert compare_cli(compare_args(compare_setup, whole, compare_setup["questions"], *args)) == 0
    reference = json.loads((whole / "results.json").read_text())
    assert reference["prompts"]["calibration"] == ["121"] and [o["id"] for o in reference["order"]] == [
        "81",
        "101",
    ]
    for entry in reference["methods"][1:]:
        settings = entry["settings"]
        assert settings["calibration"]["prompts"]["ids"] == ["121"]
        assert settings["tree"] == settings["calibration"]["chosen"] and settings["tree"]["nodes"] > 2
        assert entry["identical_to_baseline"] == "2/2"
    command = shlex.split(reference["command"])
    assert command[command.index("--tree") + 1] == "auto" and "--calibration-prompts" in command
    report = (whole / "report.md").read_text()
    assert f"tree `{reference['methods'][1]['settings']['tree']['name']}` chosen by `--tree auto`" in report

    out = tmp_path / "stopped"
    stop_at_call(monkeypatch, compare, "run_conversation", 5)  # the second conversation's second method
    args.append("--recalibrate")  # measures again (else it takes the calibration the whole run kept)
    with pytest.raises(KeyboardInterrupt):
        compare_cli(compare_args(compare_setup, out, compare_setup["questions"], *args))
    header = json.loads((out / "progress.jsonl").read_text().splitlines()[0])
    assert sorted(header["kept"]) == ["calibration:eagle", "calibration:medusa"]
    assert header["settings"]["methods"]["medusa"]["tree"] == "auto"

    monkeypatch.undo()
    timed = timings_favouring(largest=False)  # a second calibration would choose the smallest trees
    assert compare_cli(compare_args(compare_setup, out, compare_setup["questions"], *args, "--resume")) == 0
    assert timed == []
    resumed = json.loads((out / "results.json").read_text())
    assert outputs(resumed) == outputs(reference)
    for mine, theirs in zip(resumed["methods"][1:], reference["methods"][1:]):
        assert mine["settings"]["tree"] == theirs["settings"]["tree"]
        mine, theirs = (dict(e["settings"]["calibration"], seconds=None) for e in (mine, theirs))
        assert mine == theirs  # measured once, by the first part: a resume takes it even with --recalibrate


def test_compare_calibration_prompts_need_tree_auto(compare_setup, tmp_path):
    heads = [
        "--heads",
        str(compare_setup["root"] / "medusa"),
        "--tree",
        "chain-4",
        "--calibration-prompts",
        "1",
    ]
    with pytest.raises(ValueError, match="--calibration-prompts must be >= 1, with --tree auto"):
        compare_cli(
            compare_args(compare_setup, tmp_path / "out", compare_setup["questions"], *heads, "--no-plots")
        )
    assert not (tmp_path / "out").exists()


def test_draft_vocab_decodes_medusa_and_eagle_over_their_most_frequent_labels(compare_setup, tmp_path):
    """--draft-vocab N: Medusa and EAGLE heads propose from the N tokens their label counts rank first;
    output stays identical to generate(); the settings and the command record N; heads saved without
    counts are refused by name."""
    target = FrozenTarget.from_pretrained(str(compare_setup["target"]))
    counts = torch.zeros(target.vocab_size, dtype=torch.long)
    counts[torch.arange(0, target.vocab_size, 5)] = 1  # every fifth token, the most frequent
    heads = {}
    for name in ("medusa", "eagle"):
        loaded, config = load_heads(compare_setup["root"] / name, target, methods=methods())
        heads[name] = tmp_path / f"{name}-counted"
        save_heads(loaded, heads[name], target.record(), label_counts=counts)
    out = tmp_path / "out"
    argv = compare_args(compare_setup, out, compare_setup["questions"], "--heads", *map(str, heads.values()))
    argv += ["--peers", "generate", "--warmup", "0", "--no-plots", "--draft-vocab", "20"]
    assert compare_cli(argv) == 0
    results = json.loads((out / "results.json").read_text())
    for entry in results["methods"][1:]:
        check_entry(entry, results["methods"][0]["per_prompt"])
        assert entry["settings"]["heads"]["draft_vocab"] == 20
        counted = [r["in_draft_vocab"] for r in entry["per_prompt"]]
        assert all(0 <= n <= r["new_tokens"] for n, r in zip(counted, entry["per_prompt"]))
        assert entry["draft_vocab_coverage"] == sum(counted) / entry["new_tokens"]
    # the same outputs (greedy, lossless) and the same 20 tokens: the same counts; generate() drafts nothing
    medusa, eagle = (results["methods"][i]["per_prompt"] for i in (1, 2))
    assert [r["in_draft_vocab"] for r in medusa] == [r["in_draft_vocab"] for r in eagle]
    assert results["methods"][0]["draft_vocab_coverage"] is None
    assert "--draft-vocab 20" in results["command"]
    report = (out / "report.md").read_text()  # each drafting method's coverage, under its settings
    for entry in results["methods"][1:]:
        assert f"  - draft vocabulary: {100 * entry['draft_vocab_coverage']:.1f}% of the new tokens" in report
    assert report.count("- draft vocabulary:") == 2
    argv = compare_args(
        compare_setup,
        tmp_path / "none",
        compare_setup["questions"],
        "--heads",
        str(compare_setup["root"] / "medusa"),
    )
    with pytest.raises(ValueError, match="has no label_counts.safetensors"):
        compare_cli([*argv, "--peers", "generate", "--draft-vocab", "20", "--debug"])


def test_records_count_each_turns_tokens_in_the_draft_vocabulary():
    """records_for: in_draft_vocab counts every turn's output tokens that lie in the method's draft vocabulary."""
    mask = torch.zeros(12, dtype=torch.bool)
    mask[[2, 4]] = True

    def run(*turns: list[int]) -> Run:
        decoded = [Decoded(t, [1] * (len(t) - 1), [1] * (len(t) - 1), [1] * (len(t) - 1)) for t in turns]
        return Run(0, [3] * len(turns), decoded, [1.0] * len(turns), ["a"] * len(turns))

    conversations = [Conversation("q", "q", "writing", ["one", "two"], True)]
    mine, base = run([2, 4, 5], [4, 11]), run([2, 4, 5], [4, 11])
    (record,) = records_for([mine], [base], conversations, mask)
    assert record["in_draft_vocab"] == 3 and record["new_tokens"] == 5
    (record,) = records_for([mine], [base], conversations)
    assert record["in_draft_vocab"] is None
