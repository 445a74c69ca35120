"""`specheads compare` end to end on a tiny random target: peers and heads side by side.

Speed is reported, never asserted. What is pinned: every figure recomputed from the per-prompt records,
greedy identity of every method with the baseline, the rotated interleaving, multi-turn prompts built
from each method's own answers, the report's tables, valid PNGs, Spec-Bench answer files, and errors.
"""

import argparse
import json
import shlex
from pathlib import Path

import pytest
import torch
from compare_helpers import (
    QUESTIONS,
    SOURCES,
    check_entry,
    compare_args,
    compare_cli,
)

from specheads.cli import compare as compare_command
from specheads.core.target import FrozenTarget
from specheads.evaluate import compare
from specheads.evaluate import prompts as prompt_io
from specheads.evaluate.conversations import (
    Conversation,
    TurnSettings,
    prompt_set_path,
    read_conversations,
    render_turn,
)
from specheads.evaluate.peers import AssistedPeer, Decoded, GeneratePeer, PromptLookupPeer, load_draft_model
from specheads.evaluate.plots import PLOTS
from specheads.evaluate.report import DRAFT_DEFINITIONS, draft_figures

from helpers import tiny_model

METHODS = ["generate", "prompt-lookup", "assisted", "medusa", "eagle"]
ANSWER_KEYS = {"question_id", "category", "answer_id", "model_id", "choices", "tstamp"}
CHOICE_KEYS = {"index", "turns", "decoding_steps", "new_tokens", "wall_time", "accept_lengths"}


@pytest.fixture(scope="module")
def questions_run(compare_setup, tmp_path_factory) -> tuple[Path, dict, list[str]]:
    out = tmp_path_factory.mktemp("run") / "out"
    argv = compare_args(
        compare_setup, out, compare_setup["questions"], "--heads", str(compare_setup["root"] / "medusa")
    )
    argv += [
        str(compare_setup["root"] / "eagle"),
        "--draft-model",
        str(compare_setup["root"] / "draft"),
        "--warmup",
        "1",
    ]
    argv += ["--threads", "1"]  # tiny models gain nothing from more, and lose much on a busy machine
    assert compare_cli(argv) == 0
    return out, json.loads((out / "results.json").read_text()), argv


def test_one_entry_per_method_with_every_figure(questions_run):
    _, results, _ = questions_run
    entries = results["methods"]
    assert [m["name"] for m in entries] == METHODS and results["baseline"] == "generate"
    assert [m["method"] for m in entries] == METHODS  # the heads' names are their methods when unique
    design_fields = {"method", "mean_accept_length", "accept_rate_per_depth", "new_tokens", "steps"}
    design_fields |= {"tokens_per_second", "baseline_tokens_per_second", "speedup", "identical_to_baseline"}
    for entry in entries:
        assert design_fields | {"acceptance_rate", "draft_efficiency", "per_category"} <= set(entry)
        check_entry(entry, entries[0]["per_prompt"])
    baseline = entries[0]
    assert baseline["speedup"] == 1.0 and baseline["mean_accept_length"] == 1.0
    assert baseline["acceptance_rate"] is None and baseline["draft_efficiency"] == 1.0
    by_name = {m["name"]: m for m in entries}
    assert len(by_name["medusa"]["accept_rate_per_depth"]) == 3  # medusa-31 for three heads
    assert by_name["medusa"]["draft_tokens_per_step"] == 31.0
    assert by_name["prompt-lookup"]["settings"]["prompt_lookup_num_tokens"] == 10
    assert by_name["assisted"]["settings"]["num_assistant_tokens"] == 20  # transformers' default
    assert by_name["assisted"]["settings"]["draft_layers"] == 1
    assert set(results["definitions"]) >= set(DRAFT_DEFINITIONS) | {"mean_accept_length", "speedup"}


def test_every_method_runs_each_prompt_in_rotated_order(questions_run):
    _, results, _ = questions_run
    assert [o["id"] for o in results["order"]] == ["81", "101", "121"]
    for i, order in enumerate(results["order"]):
        assert order["methods"] == METHODS[i:] + METHODS[:i]
    for entry in results["methods"]:
        slots = [r["slot"] for r in entry["per_prompt"]]
        assert slots == [o["methods"].index(entry["name"]) for o in results["order"]]


def test_our_decoders_report_where_a_step_goes_and_transformers_methods_do_not(questions_run):
    out, results, _ = questions_run
    report = (out / "report.md").read_text().split("\n## ")[1]  # the overall table
    for entry in results["methods"]:
        for figures in [entry, *entry["per_category"].values()]:
            shares, outside = figures["step_phase_fraction"], figures["outside_forward_fraction"]
            if entry["name"] in ("medusa", "eagle"):
                assert set(shares) == {"draft", "tree_inputs", "tree_forward", "verify", "compact", "rest"}
                assert sum(shares.values()) == pytest.approx(1.0) and min(shares.values()) >= 0
                assert 0 < outside < 1 and outside == pytest.approx(1 - shares["tree_forward"])
                assert all(r["phase_seconds"]["tree_forward"] > 0 for r in entry["per_prompt"])
            else:
                assert shares is None and outside is None
        cell = (
            "–" if entry["step_phase_fraction"] is None else f"{100 * entry['outside_forward_fraction']:.0f}%"
        )
        assert (
            f"| {entry['draft_tokens_per_step']:.1f} | {cell} | {entry['tokens_per_second']:.1f} |" in report
        )


def test_per_category_figures_and_tables(questions_run):
    out, results, _ = questions_run
    report = (out / "report.md").read_text()
    header = (
        "| method | prompts | τ | accept rate | draft eff. | drafts/step | outside forward | tokens/s | speedup "
        "| identical |"
    )
    sections = report.split("\n## ")
    tables = {s.split("\n", 1)[0]: s for s in sections[1:]}
    assert {"Overall", "writing", "reasoning", "Acceptance per draft position"} <= set(tables)
    for entry in results["methods"]:
        per = entry["per_category"]
        assert list(per) == ["writing", "reasoning"]
        assert per["writing"]["num_prompts"] == 2 and per["reasoning"]["num_prompts"] == 1
        assert per["writing"]["new_tokens"] + per["reasoning"]["new_tokens"] == entry["new_tokens"]
        assert per["writing"]["steps"] + per["reasoning"]["steps"] == entry["steps"]
        for name, figures in [("Overall", entry), *per.items()]:
            assert header in tables[name]
            row = f"| {entry['name']} | {figures['num_prompts']} | {figures['mean_accept_length']:.2f} |"
            assert row in tables[name]
            assert f"{figures['speedup']:.2f}x | {figures['identical_to_baseline']} |" in tables[name]
    for m in results["methods"][1:]:
        assert (
            f"| {m['name']} | {m['accept_rate_per_depth'][0]:.2f} |"
            in tables["Acceptance per draft position"]
        )
    assert results["command"] in report and "evaluation/speed.py" in report


def test_plots_are_valid_pngs(questions_run):
    from PIL import Image

    out, results, _ = questions_run
    assert results["plots"] == PLOTS
    for name in PLOTS.values():
        with Image.open(out / name) as image:
            assert image.format == "PNG" and image.size[0] > 300 and image.size[1] > 150
            image.verify()
        with Image.open(out / name) as image:
            assert image.mode == "P" and len(image.getcolors(256)) > 8  # 256 colours at most, yet drawn
        assert f"]({name})" in (out / "report.md").read_text()


def test_spec_bench_answer_files(questions_run, compare_setup):
    out, results, _ = questions_run
    assert set(results["answers"]) == set(METHODS)
    for entry in results["methods"]:
        lines = (out / results["answers"][entry["name"]]).read_text().splitlines()
        answers = [json.loads(line) for line in lines]
        assert [a["question_id"] for a in answers] == [81, 101, 121]  # as the questions file has them
        for answer, row in zip(answers, entry["per_prompt"]):
            assert set(answer) == ANSWER_KEYS and answer["category"] == row["category"]
            assert answer["model_id"] == f"target-{entry['name']}-float32"
            (choice,) = answer["choices"]
            assert set(choice) == CHOICE_KEYS and choice["index"] == 0
            assert len(choice["turns"]) == len(choice["new_tokens"]) == len(choice["wall_time"]) == 2
            assert (
                choice["new_tokens"] == row["turn_new_tokens"] and choice["wall_time"] == row["turn_seconds"]
            )
            assert sum(choice["decoding_steps"]) == len(choice["accept_lengths"]) == row["steps"]
            assert choice["accept_lengths"] == row["accept_lengths"]
            assert all(isinstance(t, str) for t in choice["turns"])
        # Spec-Bench's speed.py: per question, sum(new_tokens) / sum(wall_time), then the mean.
        speeds = [sum(a["choices"][0]["new_tokens"]) / sum(a["choices"][0]["wall_time"]) for a in answers]
        assert all(s > 0 for s in speeds)


def test_second_turn_follows_the_methods_own_answer(questions_run, compare_setup):
    """Turn 2's prompt is the chat template over (turn 1, the method's turn-1 answer, turn 2)."""
    out, results, _ = questions_run
    tokenizer = FrozenTarget.from_pretrained(str(compare_setup["target"])).tokenizer
    for entry in results["methods"]:
        answers = [json.loads(x) for x in (out / results["answers"][entry["name"]]).read_text().splitlines()]
        for question, answer, row in zip(QUESTIONS, answers, entry["per_prompt"]):
            turns = question["turns"]
            first = answer["choices"][0]["turns"][0]
            messages = [
                {"role": "user", "content": turns[0]},
                {"role": "assistant", "content": first},
                {"role": "user", "content": turns[1]},
            ]
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            assert row["prompt_tokens"][1] == len(tokenizer(text, add_special_tokens=False)["input_ids"])
            assert row["prompt_tokens"][1] > row["prompt_tokens"][0]


def test_command_reproduces_the_run(questions_run):
    _, results, argv = questions_run
    parser = argparse.ArgumentParser()
    compare_command.add_arguments(parser)
    again = vars(parser.parse_args(shlex.split(results["command"])[2:]))
    given = vars(parser.parse_args(argv))
    assert again == {**given, "peers": "generate,prompt-lookup,assisted", "no_progress": False}


def test_heldout_files_with_one_head_and_no_plots(compare_setup, tmp_path):
    out = tmp_path / "out"
    argv = compare_args(
        compare_setup, out, "heldout", "--heads", str(compare_setup["root"] / "medusa"), "--peers", "generate"
    )
    argv += ["--prompt-tokens", "16", "--warmup", "0", "--tree", "chain-4", "--no-plots"]
    assert compare_cli(argv) == 0
    results = json.loads((out / "results.json").read_text())
    assert [m["name"] for m in results["methods"]] == ["generate", "medusa"]
    for entry in results["methods"]:
        check_entry(entry, results["methods"][0]["per_prompt"])
        assert entry["per_category"] == {}
        assert [r["prompt_tokens"] for r in entry["per_prompt"]] == [[16], [len(SOURCES["short.py"])]]
    assert results["methods"][1]["settings"]["tree"]["name"] == "chain-4"
    assert results["prompts"]["chat_template"] is False and results["plots"] == {}
    assert not any(out.glob("*.png"))
    report = (out / "report.md").read_text()
    assert "## Overall" in report and "## Plots" not in report and "## writing" not in report


# -- the pieces --------------------------------------------------------------------------------------


def test_draft_figures_definitions():
    """acceptance rate = accepted / proposed; efficiency = emitted / Σ(depth + 1); τ = 1 + accepted/steps."""
    rows = [
        {"accept_lengths": [1, 3, 2], "draft_sizes": [4, 4, 4], "draft_depths": [4, 4, 4]},
        {"accept_lengths": [5, 1], "draft_sizes": [6, 0], "draft_depths": [4, 0]},
    ]
    figures = draft_figures(rows)
    assert figures["accepted_draft_tokens"] == 0 + 2 + 1 + 4 + 0 and figures["proposed_draft_tokens"] == 18
    assert figures["acceptance_rate"] == 7 / 18
    assert figures["draft_efficiency"] == 12 / (5 + 5 + 5 + 5 + 1)
    assert figures["draft_tokens_per_step"] == 18 / 5
    assert figures["accept_length_counts"] == [2, 1, 1, 0, 1] and figures["deepest_draft"] == 4
    assert 1 + figures["accepted_draft_tokens"] / 5 == 12 / 5  # vLLM's mean acceptance length is τ
    empty = draft_figures([{"accept_lengths": [], "draft_sizes": [], "draft_depths": []}])
    assert empty["acceptance_rate"] is None and empty["draft_efficiency"] is None


def test_decoded_checks_its_accounting():
    assert Decoded([5, 6, 7], [2], [3], [3], prefill_token=True).tokens == [5, 6, 7]
    with pytest.raises(ValueError, match="emitted 2 tokens"):
        Decoded([5, 6, 7], [2], [3], [3], prefill_token=False)
    with pytest.raises(ValueError, match="one of each per step"):
        Decoded([5, 6], [1], [], [], prefill_token=True)


def test_transformers_steps_are_recorded_exactly(compare_setup):
    """A draft identical to the target: every step but the last accepts its whole chain."""
    target = FrozenTarget.from_pretrained(str(compare_setup["target"]))
    twin, tokenizer = load_draft_model(str(compare_setup["target"]), target.dtype, target.device, "sdpa")
    ids = target.tokenizer("abcabcabc abc", return_tensors="pt")["input_ids"]
    baseline = GeneratePeer(target).generate(ids, 12)
    assisted = AssistedPeer(target, twin, tokenizer, 3, 0.0, "twin").generate(ids, 12)
    lookup = PromptLookupPeer(target, 4).generate(ids, 12)
    assert assisted.tokens == lookup.tokens == baseline.tokens
    assert not assisted.prefill_token and not lookup.prefill_token
    *full, last = zip(assisted.accept_lengths, assisted.draft_sizes)
    assert full and all(a == s + 1 for a, s in full) and last[0] <= last[1] + 1
    assert all(s == 3 for s in assisted.draft_sizes[:-1])
    assert baseline.accept_lengths == [1] * (len(baseline.tokens) - 1) and set(baseline.draft_sizes) == {0}
    assert "_get_candidate_generator" not in target.model.__dict__  # the recorder is gone afterwards


def test_compare_interleaves_and_keeps_warmup_untimed():
    calls = []

    class Echo:
        max_depth = 0

        def __init__(self, name):
            self.name = name

        def generate(self, ids, max_new_tokens):
            calls.append(self.name)
            return Decoded([7, 8], [1], [0], [0], prefill_token=True)

    class Tokenizer:
        chat_template = None

        def __call__(self, text):
            return {"input_ids": [1] + [ord(c) % 50 for c in text]}

        def decode(self, ids, skip_special_tokens=True):
            return "answer"

    conversations = [Conversation(str(i), i, None, ["q one", "q two"], chat=True) for i in range(4)]
    methods = {name: Echo(name) for name in "ABC"}
    settings = TurnSettings(max_new_tokens=2, prompt_tokens=8, templated=False, limit=None, depth=0)
    runs, orders = compare.compare(
        methods, conversations, Tokenizer(), settings, torch.device("cpu"), 1, False
    )
    assert orders == [list("ABC"), list("BCA"), list("CAB"), list("ABC")]
    warmup, timed = calls[:6], calls[6:]
    assert warmup == ["A", "A", "B", "B", "C", "C"]  # two turns each
    assert timed == [name for order in orders for name in order for _ in range(2)]
    assert all(len(runs[name]) == 4 for name in "ABC")
    assert [run.slot for run in runs["C"]] == [2, 1, 0, 2]


def test_turns_and_prompt_sets(compare_setup, tmp_path, monkeypatch):
    tokenizer = FrozenTarget.from_pretrained(str(compare_setup["target"])).tokenizer
    conversations = read_conversations(
        str(compare_setup["questions"]), str(compare_setup["target"]), "writing", None, None
    )
    assert [c.id for c in conversations] == ["81", "121"] and conversations[0].turns == QUESTIONS[0]["turns"]
    assert (
        read_conversations(str(compare_setup["questions"]), "", None, 1, 1)[0].turns
        == QUESTIONS[0]["turns"][:1]
    )
    # Turn 1 tokenizes as `specheads eval` does.
    texts = prompt_io.read_prompts(str(compare_setup["questions"]), "", num_prompts=1)
    (first,), _ = prompt_io.encode_prompts(texts, tokenizer, use_chat_template=True, prompt_tokens=8)
    assert torch.equal(render_turn(tokenizer, conversations[0], [], True, 8), first.input_ids)

    monkeypatch.setenv("SPECHEADS_DATA", str(tmp_path))
    (tmp_path / "mt_bench_question.jsonl").write_text(compare_setup["questions"].read_text())
    assert prompt_set_path("mt-bench") == str(tmp_path / "mt_bench_question.jsonl")
    assert prompt_set_path("other.jsonl") == "other.jsonl"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question_id": 1, "turns": ["hi", ""]}\n')
    with pytest.raises(ValueError, match="line 1: turn 2 must be a non-empty string"):
        read_conversations(str(bad), "", None, None, None)


# -- errors: raised before anything is written --------------------------------------------------------


def test_peer_and_argument_errors(compare_setup, tmp_path):
    out = tmp_path / "out"
    heads = ["--heads", str(compare_setup["root"] / "medusa")]
    cases = [
        (["--peers", "generate,assisted"], "needs --draft-model"),
        (["--peers", "generate,medusa"], r"unknown \['medusa'\]"),
        (
            ["--peers", "generate", "--draft-model", str(compare_setup["root"] / "draft")],
            "only used by the assisted",
        ),
        ([*heads, "--tree", "chain-4", "medusa-15"], "one name or one per --heads"),
        (["--max-turns", "0"], "--max-turns must be >= 1"),
        (["--assistant-confidence", "2"], r"must be in \[0, 1\]"),
        ([*heads, str(compare_setup["root"] / "medusa")], r"both be called \['medusa:medusa'\]"),
    ]
    for extra, message in cases:
        with pytest.raises(ValueError, match=message):
            compare_cli(compare_args(compare_setup, out, compare_setup["questions"], *extra))
    assert not out.exists()


def test_a_draft_of_another_vocabulary_is_refused(compare_setup, tmp_path):
    tiny_model("llama", seed=2, vocab_size=300, num_hidden_layers=1).save_pretrained(tmp_path / "foreign")
    args = compare_args(
        compare_setup,
        tmp_path / "out",
        compare_setup["questions"],
        "--draft-model",
        str(tmp_path / "foreign"),
    )
    with pytest.raises(ValueError, match="300 output rows, the target 2"):
        compare_cli(args)
    assert not (tmp_path / "out").exists()


def test_long_prompts_fail_early_or_are_skipped(compare_setup, tmp_path):
    rows = [*QUESTIONS[:1], {"question_id": "long", "category": "writing", "turns": ["word " * 200, "more"]}]
    path = tmp_path / "long.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match="'long' .* max_position_embeddings=512; pass --skip-long"):
        compare_cli(compare_args(compare_setup, tmp_path / "out", path, "--peers", "generate"))
    assert not (tmp_path / "out").exists()
    argv = compare_args(
        compare_setup, tmp_path / "out", path, "--peers", "generate", "--no-plots", "--skip-long"
    )
    assert compare_cli(argv) == 0
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["prompts"]["skipped"] == ["long"] and results["prompts"]["num_prompts"] == 1


# -- stopped and resumed (evaluate/progress.py) -----------------------------------------------------
