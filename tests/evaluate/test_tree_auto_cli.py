"""`specheads eval --tree auto` and `compare` end to end: the calibrated tree recorded and resumed, the errors
before any work, and each method's default tree (auto only where the run can calibrate). The estimates and
the choice themselves: test_calibrate.py."""

import dataclasses
import json
import shlex
import shutil

import pytest
import torch

from specheads.cli import main as cli
from specheads.core.target import FrozenTarget
from specheads.decode import calibrate as decode_calibrate
from specheads.decode.calibrate import CalibrationSettings
from specheads.decode.drafter_factory import tree_by_default
from specheads.evaluate import calibrate as calibrate_module
from specheads.evaluate import evaluate as evaluate_module
from specheads.evaluate.calibrate import holds_out
from specheads.evaluate.eval_drafters import trees_for
from specheads.heads import EagleConfig, EagleHead, MedusaConfig, MedusaHeads, layer_config_from, save_heads
from specheads.methods import methods, register

from helpers import FakeTimer, stop_at_call


def saved_heads(loaded: FrozenTarget, root) -> None:
    """Untrained Medusa (3 heads, the target's lm_head) and EAGLE heads for `loaded`, saved under `root`."""
    medusa = MedusaHeads(MedusaConfig(loaded.hidden_size, loaded.vocab_size, num_heads=3))
    save_heads(medusa.init_lm_heads_from(loaded.lm_head).eval(), root / "medusa", loaded.record())
    torch.manual_seed(0)
    save_heads(
        EagleHead(EagleConfig(layer_config_from(loaded.config))).eval(), root / "eagle", loaded.record()
    )


# -- `specheads eval --tree auto` --------------------------------------------------------------------------------

QUESTIONS = [
    {"question_id": 1, "category": "writing", "turns": ["Write a haiku about rivers."]},
    {"question_id": 2, "category": "writing", "turns": ["Describe a lighthouse in two lines."]},
    {"question_id": 3, "category": "coding", "turns": ["What does a Python dict do?"]},
]


@pytest.fixture(scope="module")
def setup(tiny_target_dirs, tmp_path_factory) -> dict:
    return make_setup(tiny_target_dirs, tmp_path_factory)


def make_setup(tiny_target_dirs, tmp_path_factory) -> dict:
    """A tiny target, untrained Medusa and EAGLE heads for it, and QUESTIONS, in a fresh folder."""
    root = tmp_path_factory.mktemp("calibrate")
    shutil.copytree(tiny_target_dirs["llama"], root / "target")
    loaded = FrozenTarget.from_pretrained(str(root / "target"))
    saved_heads(loaded, root)
    (root / "questions.jsonl").write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    return {"root": root, "target": root / "target", "questions": root / "questions.jsonl", "loaded": loaded}


def eval_args(setup, out, heads="medusa", *extra):
    return [
        "eval", "--target", str(setup["target"]), "--heads", str(setup["root"] / heads),
        "--prompts", str(setup["questions"]), "--out", str(out), "--max-new-tokens", "12", "--warmup", "0",
        "--no-progress", *extra,
    ]  # fmt: skip


@pytest.mark.parametrize("heads", ["medusa", "eagle"])
def test_eval_tree_auto_end_to_end(setup, tmp_path, heads):
    out = tmp_path / "out"
    assert cli(eval_args(setup, out, heads, "--tree", "auto", "--calibration-prompts", "1")) == 0
    results = json.loads((out / "results.json").read_text())
    calibration = results["calibration"]

    # the last question calibrates; the others are evaluated, greedily identical to generate()
    assert calibration["prompts"]["ids"] == ["3"] and [r["id"] for r in results["per_prompt"]] == ["1", "2"]
    assert results["identical_to_baseline"] == "2/2"
    assert results["tree"] == calibration["chosen"] and results["tree"]["name"].startswith("auto-")
    rows = calibration["candidates"]
    assert calibration["settings"]["sizes"] == list(CalibrationSettings().sizes)
    for r in rows:
        assert r["tokens_per_second"] == pytest.approx(
            r["accept_length"] / (r["step_seconds"] + r["draft_seconds"])
        )
        assert 1.0 <= r["accept_length"] <= r["depth"] + 1 and r["step_seconds"] > 0
    best = max(rows, key=lambda r: (r["tokens_per_second"], -r["nodes"], -r["depth"]))
    assert best["name"] == results["tree"]["name"] and best["nodes"] == results["tree"]["nodes"]
    assert len(results["accept_rate_per_depth"]) == results["tree"]["depth"]
    if heads == "medusa":
        assert [r["nodes"] for r in rows] == list(CalibrationSettings().sizes)
        per_head_rank = calibration["acceptance"]["per_head_rank"]
        assert len(per_head_rank) == 3 and all(
            len(row) == 10 and sum(row) <= 1 + 1e-9 for row in per_head_rank
        )
    assert calibration["timing"]["cache_length"] > 0
    report = (out / "report.md").read_text()
    assert f"tree `{results['tree']['name']}` chosen by `--tree auto`" in report
    # the command reproduces the run: it calibrates again rather than naming the chosen tree
    command = shlex.split(results["command"])
    assert command[command.index("--tree") + 1] == "auto" and "--calibration-prompts" in command


@pytest.mark.parametrize("heads", ["medusa", "eagle"])
def test_eval_tree_auto_over_a_draft_vocabulary(setup, tmp_path, heads):
    """--tree auto --draft-vocab N: every candidate drafts over the N most frequent labels (the rank table of
    Medusa's calibration counts a guess outside them as a miss), the chosen tree decodes over them, and the
    output is still generate()'s."""
    loaded = setup["loaded"]
    counted = tmp_path / f"{heads}-counted"
    shutil.copytree(setup["root"] / heads, counted)
    counts = torch.zeros(loaded.vocab_size, dtype=torch.long)
    counts[::3] = 1  # every third id, the most frequent
    from safetensors.torch import save_file

    save_file({"counts": counts}, str(counted / "label_counts.safetensors"))
    out = tmp_path / "out"
    args = eval_args(setup, out, heads, "--tree", "auto", "--calibration-prompts", "1", "--draft-vocab", "40")
    args[args.index("--heads") + 1] = str(counted)
    assert cli(args) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["calibration"]["draft_vocab"] == 40 and results["heads"]["draft_vocab"] == 40
    assert results["identical_to_baseline"] == "2/2"
    target, vocab = loaded, torch.arange(0, 120, 3)  # the 40 ids --draft-vocab 40 takes here
    from specheads.heads import load_heads

    medusa, _ = load_heads(setup["root"] / "medusa", target, methods=methods())
    sequence = [(decode_calibrate.greedy_sequence(target, torch.tensor([[5, 9, 3, 17]]), 12), 4)]
    whole = decode_calibrate.medusa_ranks(target, medusa, sequence, 5)[0]
    named = decode_calibrate.medusa_ranks(target, medusa, sequence, 5, torch.arange(loaded.vocab_size))[0]
    assert torch.equal(named, whole)
    restricted = decode_calibrate.medusa_ranks(target, medusa, sequence, 5, vocab)[0]
    ids = sequence[0][0][0]
    for i, row in enumerate(restricted.tolist()):
        for k, rank in enumerate(row):
            if rank >= 0 and int(ids[4 - 1 + i + 2 + k]) % 3 != 0:
                assert rank == 5  # a true token outside the draft vocabulary is never guessed


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--calibration-prompts", "2"], "--calibration-prompts must be >= 1, with --tree auto"),
        (["--tree", "auto", "--calibration-prompts", "0"], "--calibration-prompts must be >= 1"),
        (["--tree", "auto", "--batch-size", "2"], "not with --batch-size > 1"),
        (["--tree", "auto", "--temperature", "0.7"], "or --temperature > 0"),
        (
            ["--tree", "auto", "--calibration-prompts", "3"],
            "gives 3: at least one must be calibrated and one",
        ),
    ],
)
def test_tree_auto_errors_before_any_work(setup, tmp_path, extra, message):
    with pytest.raises(ValueError, match=message):
        cli(eval_args(setup, tmp_path / "out", "medusa", *extra))
    assert not (tmp_path / "out").exists()


# -- stopped and resumed: the calibrated tree is kept, not measured again -----------------------------------


def timings_favouring(monkeypatch, largest: bool) -> FakeTimer:
    """Calibrations from now on time a step over N nodes so that the largest tree wins (`largest`), or the
    smallest: two timings of one machine that choose different trees."""
    fake = FakeTimer((lambda n: 1e-3 / n) if largest else (lambda n: 1e-3 * n))
    monkeypatch.setattr(calibrate_module, "measured_timer", lambda *args: fake)
    return fake


@pytest.mark.parametrize("heads", ["medusa", "eagle"])
def test_a_stopped_tree_auto_eval_resumes_with_its_calibrated_tree(
    setup, tmp_path, monkeypatch, capsys, heads
):
    args = ["--tree", "auto", "--calibration-prompts", "1"]
    whole = tmp_path / "whole"
    timings_favouring(monkeypatch, largest=True)
    assert cli(eval_args(setup, whole, heads, *args)) == 0
    reference = json.loads((whole / "results.json").read_text())
    assert reference["tree"]["nodes"] > 2  # a second calibration, timed as below, chooses another tree

    out = tmp_path / "stopped"
    stop_at_call(monkeypatch, evaluate_module, "decode_prompt", 2)  # the second evaluated prompt
    args.append("--recalibrate")  # measures again (else it takes the calibration the whole run kept)
    with pytest.raises(KeyboardInterrupt):
        cli(eval_args(setup, out, heads, *args))
    assert "stopped after 1 of 2 prompts" in capsys.readouterr().out
    header = json.loads((out / "progress.jsonl").read_text().splitlines()[0])
    assert header["settings"]["tree"] == "auto" and header["settings"]["calibration_prompts"] == ["3"]
    assert header["kept"]["calibration"]["chosen"] == reference["tree"]

    monkeypatch.undo()
    second = timings_favouring(monkeypatch, largest=False)
    assert cli(eval_args(setup, out, heads, *args, "--resume")) == 0
    assert second.nodes == []  # nothing was timed again
    resumed = json.loads((out / "results.json").read_text())
    assert resumed["tree"] == reference["tree"]
    calibrations = [
        {k: v for k, v in r["calibration"].items() if k != "seconds"} for r in (resumed, reference)
    ]
    assert calibrations[0] == calibrations[1]  # measured once, by the first part: not again on resume
    timings = {"seconds", "baseline_seconds", "phase_seconds"}
    assert [{k: v for k, v in r.items() if k not in timings} for r in resumed["per_prompt"]] == [
        {k: v for k, v in r.items() if k not in timings} for r in reference["per_prompt"]
    ]
    for key in (
        "new_tokens",
        "steps",
        "mean_accept_length",
        "accept_rate_per_depth",
        "identical_to_baseline",
    ):
        assert resumed[key] == reference[key]


# -- the default tree: the method's `default_tree`, auto only where the run can calibrate ----------------------


@pytest.fixture
def eagle_calibrates_by_default():
    """EAGLE's entry with default_tree "auto" for the test (as the built-in entry has it now; kept so that
    these tests hold whatever the table's default)."""
    entry = methods()["eagle"]
    register(dataclasses.replace(entry, default_tree="auto"), replace=True)
    yield
    register(entry, replace=True)


def test_eagle_heads_calibrate_by_default_and_medusa_heads_do_not():
    """Where `--tree auto` won in every run measured (README: EAGLE and EAGLE-3 on the tiny target and on
    SmolLM2, on the CPU), it is the default; Medusa keeps its fixed tree (auto decoded it 0.84x and 1.06x)."""
    table = methods()
    assert table["eagle"].default_tree == table["eagle3"].default_tree == "auto"
    assert table["medusa"].default_tree is None


def test_tree_by_default_only_where_the_run_can_calibrate(eagle_calibrates_by_default):
    assert tree_by_default("eagle", calibrates=True, methods=methods()) == "auto"
    # sampling, batches: the fixed default
    assert tree_by_default("eagle", calibrates=False, methods=methods()) is None
    assert (
        tree_by_default("medusa", calibrates=True, methods=methods()) is None
        and tree_by_default("hydra", True, methods=methods()) is None
    )
    assert trees_for(None, ["medusa", "eagle"], calibrates=True, methods=methods()) == [None, "auto"]
    assert trees_for(["chain-4"], ["medusa", "eagle"], calibrates=True, methods=methods()) == [
        "chain-4",
        "chain-4",
    ]  # named
    assert holds_out(5, None, None) and not holds_out(4, None, None)  # 4 held out by default, 1 evaluated
    assert holds_out(6, 2, 4) and not holds_out(6, 2, 5)


SIX = QUESTIONS + [
    {"question_id": 4, "category": "coding", "turns": ["What is a list comprehension?"]},
    {"question_id": 5, "category": "writing", "turns": ["Name three rivers."]},
    {"question_id": 6, "category": "coding", "turns": ["Why use a set?"]},
]


def test_eval_takes_the_default_tree_and_a_named_one_over_it(setup, tmp_path, eagle_calibrates_by_default):
    questions = tmp_path / "six.jsonl"
    questions.write_text("".join(json.dumps(q) + "\n" for q in SIX))

    def results(out, *extra):
        args = eval_args(setup, tmp_path / out, "eagle", *extra)
        args[args.index("--prompts") + 1] = str(questions)
        assert cli(args) == 0
        return json.loads((tmp_path / out / "results.json").read_text())

    # no --tree: calibrated on the last 4 prompts, the others evaluated; recorded as `--tree auto` records it
    auto = results("auto")
    assert auto["tree"] == auto["calibration"]["chosen"] and auto["tree"]["name"].startswith("auto-")
    assert auto["calibration"]["prompts"]["ids"] == ["3", "4", "5", "6"]
    assert [r["id"] for r in auto["per_prompt"]] == ["1", "2"] and auto["identical_to_baseline"] == "2/2"
    command = shlex.split(auto["command"])
    assert command[command.index("--tree") + 1] == "auto"
    # --calibration-prompts without --tree: the default calibrates on that many
    assert results("one", "--calibration-prompts", "1")["calibration"]["prompts"]["ids"] == ["6"]
    # a named tree wins over the default; too few prompts to hold 4 out and evaluate 3, or sampling: the
    # fixed default. Nothing is held out: the first prompts are evaluated
    for out, extra, tree in [
        ("named", ["--tree", "dynamic-12", "--num-prompts", "3"], "dynamic-12"),
        ("few", ["--num-prompts", "3"], "dynamic-32"),
        ("sampled", ["--temperature", "0.7", "--num-prompts", "2"], "dynamic-32"),
    ]:
        fixed = results(out, *extra)
        assert fixed["tree"]["name"] == tree and "calibration" not in fixed, out
        assert [r["id"] for r in fixed["per_prompt"]] == ["1", "2", "3"][: 2 if out == "sampled" else 3], out


def test_compare_takes_each_heads_default_tree(setup, tmp_path, eagle_calibrates_by_default):
    questions = tmp_path / "six.jsonl"
    questions.write_text("".join(json.dumps(q) + "\n" for q in SIX))
    out = tmp_path / "out"
    args = ["compare", "--target", str(setup["target"]), "--prompts", str(questions), "--out", str(out)]
    args += ["--heads", str(setup["root"] / "medusa"), str(setup["root"] / "eagle"), "--peers", "generate"]
    args += ["--max-new-tokens", "12", "--warmup", "0", "--no-plots", "--no-progress"]
    assert cli(args) == 0
    results = json.loads((out / "results.json").read_text())
    medusa, eagle = (m["settings"] for m in results["methods"][1:])
    assert medusa["tree"]["name"] == "medusa-31" and "calibration" not in medusa  # Medusa's fixed default
    assert eagle["tree"] == eagle["calibration"]["chosen"] and eagle["tree"]["name"].startswith("auto-")
    assert results["prompts"]["calibration"] == ["3", "4", "5", "6"] and len(results["order"]) == 2
    assert "--tree" not in shlex.split(results["command"])  # the same defaults reproduce it


def test_calibration_prompts_without_tree_need_a_default_auto(setup, tmp_path):
    """Medusa's default tree is fixed: --calibration-prompts without --tree is refused, as with a named tree."""
    with pytest.raises(ValueError, match="--calibration-prompts must be >= 1, with --tree auto"):
        cli(eval_args(setup, tmp_path / "eval", "medusa", "--calibration-prompts", "1"))
    args = ["compare", "--target", str(setup["target"]), "--prompts", str(setup["questions"]), "--out"]
    args += [str(tmp_path / "compare"), "--heads", str(setup["root"] / "medusa"), "--peers", "generate"]
    with pytest.raises(ValueError, match="no heads directory's default tree is auto"):
        cli([*args, "--calibration-prompts", "1", "--no-plots"])
