"""`specheads eval` end to end on a tiny random target with fresh Medusa heads.

Speed is reported by the command, never asserted here; what is pinned is the arithmetic of every
figure, greedy identity with the target's own `generate`, and the errors.
"""

import argparse
import json
import shlex
import shutil
from functools import partial
from pathlib import Path

import pytest
import torch

from specheads.cli import compare as compare_command
from specheads.cli import eval as eval_command
from specheads.cli import main as cli
from specheads.core.target import FrozenTarget, TargetMismatchError
from specheads.decode import DecodeOutput
from specheads.decode.drafter_factory import EAGLE_TOTAL_TOKENS, draft_vocab_mask, drafter_for
from specheads.evaluate import evaluate
from specheads.evaluate import prompts as prompt_io
from specheads.evaluate.report import coverage_lines as report_lines
from specheads.evaluate.report import prompt_record, summarize
from specheads.heads import MedusaConfig, MedusaHeads, load_heads, save_heads
from specheads.methods import methods

from helpers import stop_at_call, target_with_heldout

# A small subset in the MT-Bench format (questions 81, 101, 121 of MT-Bench; two categories).
QUESTIONS = [
    {
        "question_id": 81,
        "category": "writing",
        "turns": ["Compose a short travel blog post about Hawaii.", "Rewrite it."],
    },
    {
        "question_id": 101,
        "category": "reasoning",
        "turns": ["You overtake the second person in a race. What is your position now?", "And the last?"],
    },
    {"question_id": 121, "category": "writing", "turns": ["Write a haiku about Python.", "Another one."]},
]
SOURCES = {
    "pkg/long.py": "import os\n\n\ndef join(a, b):\n    return os.path.join(a, b)\n" * 4,
    "short.py": "x = 1\n",
    "pkg/__init__.py": "",  # empty: skipped, it is no prompt
}
NUM_HEADS = 3


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def setup(tiny_target_dirs, tmp_path_factory) -> dict:
    """A copy of the tiny llama target with a heldout_files.json, fresh heads, and a questions file."""
    root = tmp_path_factory.mktemp("eval")
    target_dir = target_with_heldout(tiny_target_dirs["llama"], root, SOURCES, train_files=0)

    target = FrozenTarget.from_pretrained(str(target_dir))
    heads = MedusaHeads(MedusaConfig(target.hidden_size, target.vocab_size, num_heads=NUM_HEADS))
    save_heads(heads.init_lm_heads_from(target.lm_head), root / "heads", target.record())
    return {
        "root": root,
        "target": target_dir,
        "record": target.record(),
        "heads": root / "heads",
        "questions": write_jsonl(root / "questions.jsonl", QUESTIONS),
    }


def eval_args(setup, out: Path, prompts, *extra: str) -> list[str]:
    return [
        "eval",
        "--target",
        str(setup["target"]),
        "--heads",
        str(setup["heads"]),
        "--prompts",
        str(prompts),
        "--out",
        str(out),
        "--max-new-tokens",
        "10",
        "--no-progress",
        *extra,
    ]


def check_figures(results: dict, tree_depth: int) -> None:
    """Every headline figure recomputed from the per-prompt records."""
    rows = results["per_prompt"]
    accept_lengths = [n for r in rows for n in r["accept_lengths"]]
    steps = len(accept_lengths)
    assert results["steps"] == steps == sum(r["steps"] for r in rows)
    assert results["new_tokens"] == sum(r["new_tokens"] for r in rows)
    assert results["baseline_new_tokens"] == sum(r["baseline_new_tokens"] for r in rows)
    for r in rows:  # the first token of each prompt comes from prefill, not a step
        assert r["new_tokens"] == 1 + sum(r["accept_lengths"]) <= 10
    assert results["mean_accept_length"] == pytest.approx(sum(accept_lengths) / steps)
    assert results["mean_accept_length"] >= 1.0
    rates = results["accept_rate_per_depth"]
    assert len(rates) == tree_depth
    assert rates == pytest.approx(
        [sum(n > d for n in accept_lengths) / steps for d in range(1, tree_depth + 1)]
    )
    assert all(0 <= b <= a <= 1 for a, b in zip(rates, rates[1:]))
    assert results["seconds"] == pytest.approx(sum(r["seconds"] for r in rows))
    assert results["tokens_per_second"] == pytest.approx(results["new_tokens"] / results["seconds"])
    assert results["baseline_tokens_per_second"] == pytest.approx(
        results["baseline_new_tokens"] / results["baseline_seconds"]
    )
    assert results["speedup"] == pytest.approx(
        results["tokens_per_second"] / results["baseline_tokens_per_second"]
    )
    n = len(rows)
    assert results["num_prompts"] == n and results["identical_to_baseline"] == f"{n}/{n}"
    assert all(r["identical_to_baseline"] and r["first_mismatch"] is None for r in rows)
    assert results["new_tokens"] == results["baseline_new_tokens"]


def test_eval_on_questions_writes_results_and_report(setup, tmp_path):
    out = tmp_path / "out"
    assert cli(eval_args(setup, out, setup["questions"], "--warmup", "1")) == 0
    results = json.loads((out / "results.json").read_text())

    check_figures(results, tree_depth=3)
    assert results["method"] == "medusa"
    assert [r["id"] for r in results["per_prompt"]] == ["81", "101", "121"]
    assert [r["category"] for r in results["per_prompt"]] == ["writing", "reasoning", "writing"]
    assert list(results["per_category"]) == ["writing", "reasoning"]
    writing = results["per_category"]["writing"]
    assert writing["num_prompts"] == 2 and writing["identical_to_baseline"] == "2/2"
    assert writing["new_tokens"] + results["per_category"]["reasoning"]["new_tokens"] == results["new_tokens"]
    # Three heads get medusa-31 cut to depth 3 (all of its 31 paths).
    assert results["tree"] == {
        "name": "medusa-31",
        "nodes": 32,
        "depth": 3,
        "choices": results["tree"]["choices"],
    }
    assert len(results["tree"]["choices"]) == 31
    assert results["heads"]["path"] == str(setup["heads"].resolve())
    assert (
        results["heads"]["method"] == "medusa" and results["heads"]["head_config"]["num_heads"] == NUM_HEADS
    )
    record = {k: v for k, v in results["target"].items() if k != "path"}
    assert record == setup["record"].to_dict() and results["target"]["path"] == str(setup["target"])
    assert results["prompts"]["chat_template"] is True
    assert results["device"] == "cpu" and results["dtype"] == "float32"
    assert results["attn_implementation"] == "sdpa" and results["max_new_tokens"] == 10
    assert results["versions"]["torch"] == torch.__version__
    assert set(results["versions"]) == {"specheads", "torch", "transformers", "python"}
    assert set(results["definitions"]) >= {"mean_accept_length", "accept_rate_per_depth", "speedup"}
    for r in results["per_prompt"]:
        assert r["seconds"] > 0 and r["baseline_seconds"] > 0 and r["prompt_tokens"] > 0
        assert r["phase_seconds"]["tree_forward"] > 0 and r["phase_seconds"]["total"] <= r["seconds"]
    shares = results["step_phase_fraction"]  # where the steps' time went, over all prompts
    assert set(shares) == {"draft", "tree_inputs", "tree_forward", "verify", "compact", "rest"}
    assert sum(shares.values()) == pytest.approx(1.0)
    assert results["outside_forward_fraction"] == pytest.approx(1 - shares["tree_forward"])
    assert sorted(p.name for p in out.iterdir()) == ["report.md", "results.json"]  # no temporary files left

    report = (out / "report.md").read_text()
    assert (
        "| method | prompts | τ | outside forward | tokens/s | baseline tokens/s | speedup | identical |"
        in report
    )
    outside = f"{100 * results['outside_forward_fraction']:.0f}%"
    assert f"| medusa | 3 | {results['mean_accept_length']:.2f} | {outside} |" in report
    assert f"{results['speedup']:.2f}x | 3/3 |" in report
    assert "| writing | 2 |" in report and "| reasoning | 1 |" in report
    assert results["command"] in report
    # The command spells out every option: parsed again, it gives this run's arguments.
    parser = argparse.ArgumentParser()
    eval_command.add_arguments(parser)
    again = vars(parser.parse_args(shlex.split(results["command"])[2:]))
    given = vars(parser.parse_args(eval_args(setup, out, setup["questions"], "--warmup", "1")[1:]))
    assert again == {**given, "tree": "medusa-31", "no_progress": False}


def test_eval_on_heldout_files(setup, tmp_path):
    out = tmp_path / "out"
    args = eval_args(
        setup, out, "heldout", "--prompt-tokens", "16", "--warmup", "0", "--tree", "chain-4", "--threads", "1"
    )
    assert cli(args) == 0
    results = json.loads((out / "results.json").read_text())

    check_figures(results, tree_depth=3)  # chain-4 cut to three heads
    assert [r["id"] for r in results["per_prompt"]] == ["pkg/long.py", "short.py"]  # the empty file skipped
    assert [r["prompt_tokens"] for r in results["per_prompt"]] == [16, len(SOURCES["short.py"])]
    assert results["per_category"] == {} and results["prompts"]["chat_template"] is False
    assert results["tree"]["name"] == "chain-4" and results["tree"]["nodes"] == 4
    report = (out / "report.md").read_text()
    assert "| category |" not in report and "| medusa | 2 |" in report


def test_chat_template_and_raw_text(setup):
    tokenizer = FrozenTarget.from_pretrained(str(setup["target"])).tokenizer
    texts = prompt_io.read_prompts(str(setup["questions"]), str(setup["target"]), num_prompts=1)
    chat, templated = prompt_io.encode_prompts(texts, tokenizer, use_chat_template=True, prompt_tokens=4)
    raw, plain = prompt_io.encode_prompts(texts, tokenizer, use_chat_template=False, prompt_tokens=4)
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": QUESTIONS[0]["turns"][0]}], add_generation_prompt=True, tokenize=False
    )
    assert templated and not plain
    assert chat[0].input_ids[0].tolist() == tokenizer(rendered, add_special_tokens=False)["input_ids"]
    # A question is never cut to --prompt-tokens; only whole files are.
    assert raw[0].input_ids[0].tolist() == tokenizer(QUESTIONS[0]["turns"][0])["input_ids"]


def test_category_filter_and_num_prompts(setup):
    texts = prompt_io.read_prompts(str(setup["questions"]), "", category="writing")
    assert [t.id for t in texts] == ["81", "121"]
    assert [t.id for t in prompt_io.read_prompts(str(setup["questions"]), "", num_prompts=2)] == ["81", "101"]


def test_summary_definitions():
    """τ = total accept lengths / steps; rate at depth d = share of steps accepting >= d draft tokens."""
    rows = [
        dict(
            accept_lengths=[1, 3, 2], new_tokens=7, baseline_new_tokens=7, seconds=1.0, baseline_seconds=2.0
        ),
        dict(accept_lengths=[4], new_tokens=5, baseline_new_tokens=5, seconds=1.0, baseline_seconds=1.0),
    ]
    for r in rows:
        r["identical_to_baseline"] = True
    figures = summarize(rows, tree_depth=4)
    assert figures["steps"] == 4 and figures["mean_accept_length"] == 10 / 4
    assert figures["accept_rate_per_depth"] == [3 / 4, 2 / 4, 1 / 4, 0.0]
    assert figures["mean_accept_length"] == 1 + sum(figures["accept_rate_per_depth"])
    assert figures["tokens_per_second"] == 6.0 and figures["baseline_tokens_per_second"] == 4.0
    assert figures["speedup"] == 1.5 and figures["identical_to_baseline"] == "2/2"
    assert figures["draft_vocab_coverage"] is None  # no record counted its tokens in a draft vocabulary
    assert summarize([], tree_depth=2)["mean_accept_length"] is None


def test_records_count_their_tokens_in_the_draft_vocabulary():
    """in_draft_vocab counts the output's tokens the draft can propose; draft_vocab_coverage is their share
    of all new tokens, and null unless every record counted."""
    mask = torch.zeros(10, dtype=torch.bool)
    mask[[1, 3, 5]] = True
    prompt = prompt_io.Prompt("q", "writing", torch.ones(1, 4, dtype=torch.long))
    record = partial(prompt_record, prompt, seconds=1.0, baseline_seconds=1.0)
    first = record([1, 2, 3, 3, 9], [2, 2], reference=[1, 2, 3, 3, 9], draft_vocab=mask)
    second = record([5, 0, 0], [1, 1], reference=[5, 0, 0], draft_vocab=mask)
    assert (first["in_draft_vocab"], second["in_draft_vocab"]) == (3, 1)
    assert record([], [], reference=[], draft_vocab=mask)["in_draft_vocab"] == 0
    assert record([1, 2], [1], reference=[1, 2])["in_draft_vocab"] is None
    assert summarize([first, second], tree_depth=2)["draft_vocab_coverage"] == 4 / 8
    unmasked = record([1, 2], [1], reference=[1, 2])
    assert summarize([first, unmasked], tree_depth=2)["draft_vocab_coverage"] is None
    results = {"draft_vocab_coverage": 0.5, "per_category": {"writing": {"draft_vocab_coverage": 0.5}}}
    assert report_lines(results) == [
        "- draft vocabulary: 50.0% of the new tokens lie in it (writing 50%); a step whose next token lies "
        "outside it accepts no draft token."
    ]
    assert report_lines({"draft_vocab_coverage": None, "per_category": {}}) == []


def test_draft_vocab_mask_is_what_the_drafter_can_propose(setup):
    """An EAGLE-3 head's own vocabulary (t2d), --draft-vocab's ids for EAGLE-1/2 and Medusa, else None."""
    from specheads.decode.drafters import MedusaDrafter
    from specheads.decode.eagle_drafter import EagleDrafter
    from specheads.decode.trees import default_tree
    from specheads.heads import Eagle3Config, Eagle3Head, EagleConfig, EagleHead, layer_config_from

    target = FrozenTarget.from_pretrained(str(setup["target"]))
    V, layers = target.vocab_size, layer_config_from(target.config)
    ids = torch.arange(2, V, 7)  # ascending, as draft_vocab_from_counts gives them
    config = Eagle3Config(layers, draft_vocab_size=ids.numel(), target_layers=(1, 2, 3))
    head3 = Eagle3Head(config).set_draft_vocab(ids)
    mask = draft_vocab_mask(EagleDrafter(head3, target), V)
    assert mask.dtype == torch.bool and torch.equal(mask, head3.t2d)
    assert torch.equal(mask.nonzero().flatten(), ids) and ids.numel() < V
    head = EagleHead(EagleConfig(layers))
    assert draft_vocab_mask(EagleDrafter(head, target), V) is None
    assert torch.equal(draft_vocab_mask(EagleDrafter(head, target, vocab=ids), V), mask)
    heads, _ = load_heads(setup["heads"], target, methods=methods())
    tree = default_tree("medusa-15", num_heads=NUM_HEADS)
    assert draft_vocab_mask(MedusaDrafter(heads, tree, target.lm_head), V) is None
    assert torch.equal(draft_vocab_mask(MedusaDrafter(heads, tree, target.lm_head, vocab=ids), V), mask)


# -- errors: raised before anything is written --------------------------------------------------------


def test_missing_heads_dir(setup, tmp_path):
    out = tmp_path / "out"
    args = eval_args(setup, out, setup["questions"])
    args[args.index("--heads") + 1] = str(tmp_path / "no-heads")
    with pytest.raises(FileNotFoundError, match="no-heads"):
        cli(args)
    assert not out.exists()


def test_heads_for_another_target(setup, tiny_target_dirs, tmp_path):
    other = FrozenTarget.from_pretrained(str(tiny_target_dirs["qwen2"]))
    heads = MedusaHeads(MedusaConfig(other.hidden_size, other.vocab_size, num_heads=2))
    save_heads(heads.init_lm_heads_from(other.lm_head), tmp_path / "qwen2-heads", other.record())
    out = tmp_path / "out"
    args = eval_args(setup, out, setup["questions"])
    args[args.index("--heads") + 1] = str(tmp_path / "qwen2-heads")
    with pytest.raises(TargetMismatchError, match="model_type"):
        cli(args)
    assert not out.exists()


BAD_PROMPTS = {
    "missing.jsonl": (None, FileNotFoundError, "does not exist"),
    "prompts.csv": ("a,b\n", ValueError, "unknown format"),
    "empty.jsonl": ("\n", ValueError, "holds no prompts"),
    "broken.jsonl": ('{"question_id": 1, "turns": ["hi"]}\n{"question_id": 2}\n', ValueError, "line 2"),
    "no-text.jsonl": ('{"question_id": 1, "turns": [""]}\n', ValueError, "non-empty string"),
    "list.json": ('{"files": ["nowhere.py"]}', FileNotFoundError, "nowhere.py"),
}


@pytest.mark.parametrize("name", sorted(BAD_PROMPTS))
def test_bad_prompts_file(setup, tmp_path, name):
    text, error, message = BAD_PROMPTS[name]
    if text is not None:
        (tmp_path / name).write_text(text)
    with pytest.raises(error, match=message):
        cli(eval_args(setup, tmp_path / "out", tmp_path / name))
    assert not (tmp_path / "out").exists()


def test_errors_found_after_loading_the_target(setup, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=r"category 'coding'.*\['reasoning', 'writing'\]"):
        cli(eval_args(setup, out, setup["questions"], "--category", "coding"))
    long = write_jsonl(tmp_path / "long.jsonl", [{"question_id": "long-1", "turns": ["word " * 200]}])
    with pytest.raises(ValueError, match="'long-1' is .* max_position_embeddings=512"):
        cli(eval_args(setup, out, long))
    with pytest.raises(ValueError, match="unknown tree 'medusa-7'"):
        cli(eval_args(setup, out, setup["questions"], "--tree", "medusa-7"))
    bare = tmp_path / "bare-target"
    shutil.copytree(setup["target"], bare, ignore=shutil.ignore_patterns(prompt_io.HELDOUT_FILE))
    args = eval_args(setup, out, "heldout")
    args[args.index("--target") + 1] = str(bare)
    with pytest.raises(FileNotFoundError, match="heldout_files.json"):
        cli(args)
    assert not out.exists()


def test_unknown_method_has_no_drafter(setup):
    with pytest.raises(ValueError, match="no drafter for heads of method 'hydra'"):
        drafter_for(None, {"method": "hydra"}, None, None, methods=methods())


@pytest.mark.parametrize("method, tree", [("eagle", "dynamic-12"), ("eagle3", None), ("eagle", "medusa-15")])
def test_eval_takes_eagle_heads_with_the_same_flags(setup, tmp_path, method, tree):
    from specheads.heads import Eagle3Config, Eagle3Head, EagleConfig, EagleHead, layer_config_from

    target = FrozenTarget.from_pretrained(str(setup["target"]))
    torch.manual_seed(0)
    layers = layer_config_from(target.config)
    if method == "eagle":
        head = EagleHead(EagleConfig(layers))
    else:
        head = Eagle3Head(Eagle3Config(layers, draft_vocab_size=target.vocab_size, target_layers=(1, 2, 3)))
    save_heads(head, tmp_path / "heads", target.record())
    args = eval_args(setup, tmp_path / "out", setup["questions"], *(["--tree", tree] if tree else []))
    args[args.index("--heads") + 1] = str(tmp_path / "heads")
    assert cli(args) == 0
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["method"] == method
    assert results["tree"]["name"] == (tree or f"dynamic-{EAGLE_TOTAL_TOKENS}")
    check_figures(results, results["tree"]["depth"])
    assert results["draft_vocab_coverage"] is None  # both draft over the whole vocabulary here
    assert "draft vocabulary" not in (tmp_path / "out" / "report.md").read_text()


def test_eval_draft_vocab_records_it_and_refuses_eagle3_heads(setup, tmp_path):
    from specheads.heads import Eagle3Config, Eagle3Head, layer_config_from

    target = FrozenTarget.from_pretrained(str(setup["target"]))
    heads, _ = load_heads(setup["heads"], target, methods=methods())
    counts = torch.arange(target.vocab_size, dtype=torch.long)  # the last ids, the most frequent
    save_heads(heads, tmp_path / "counted", target.record(), label_counts=counts)
    args = eval_args(setup, tmp_path / "out", setup["questions"], "--draft-vocab", "30")
    args[args.index("--heads") + 1] = str(tmp_path / "counted")
    assert cli(args) == 0
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["heads"]["draft_vocab"] == 30 and "--draft-vocab 30" in results["command"]
    check_figures(results, results["tree"]["depth"])
    counted = [r["in_draft_vocab"] for r in results["per_prompt"]]  # only the last 30 ids can be proposed
    assert all(0 <= n <= r["new_tokens"] for n, r in zip(counted, results["per_prompt"]))
    assert results["draft_vocab_coverage"] == sum(counted) / results["new_tokens"]
    writing = [r for r in results["per_prompt"] if r["category"] == "writing"]
    assert results["per_category"]["writing"]["draft_vocab_coverage"] == sum(
        r["in_draft_vocab"] for r in writing
    ) / sum(r["new_tokens"] for r in writing)
    assert "- draft vocabulary: " in (tmp_path / "out" / "report.md").read_text()
    every = eval_args(setup, tmp_path / "every", setup["questions"], "--draft-vocab", str(target.vocab_size))
    every[every.index("--heads") + 1] = str(tmp_path / "counted")
    assert cli(every) == 0  # a draft vocabulary of every token holds every output token
    results = json.loads((tmp_path / "every" / "results.json").read_text())
    assert results["draft_vocab_coverage"] == 1.0
    assert all(r["in_draft_vocab"] == r["new_tokens"] for r in results["per_prompt"])
    head = Eagle3Head(
        Eagle3Config(layer_config_from(target.config), draft_vocab_size=50, target_layers=(1, 2, 3))
    )
    save_heads(head, tmp_path / "eagle3", target.record(), label_counts=counts)
    args = eval_args(setup, tmp_path / "out3", setup["questions"], "--draft-vocab", "30", "--debug")
    args[args.index("--heads") + 1] = str(tmp_path / "eagle3")
    with pytest.raises(
        ValueError, match="eagle3: EAGLE-3 heads draft over the vocabulary they were trained on"
    ):
        cli(args)


def test_order_alternates_and_warmup_is_untimed(monkeypatch):
    """The decoder goes first on even prompts, the baseline on odd ones; warmup prompts leave no record."""
    calls = []

    class Decoder:
        def generate(self, ids, max_new_tokens):
            calls.append("method")
            return DecodeOutput(tokens=torch.tensor([[5, 6]]), accept_lengths=[1])

    monkeypatch.setattr(evaluate, "baseline_generate", lambda *a: calls.append("baseline") or [5, 6])
    target = argparse.Namespace(device=torch.device("cpu"))
    prompts = [prompt_io.Prompt(str(i), None, torch.tensor([[1, 2]])) for i in range(3)]
    run = evaluate.EvalRun(warmup=1, progress=False)
    records = evaluate.evaluate(Decoder(), target, prompts, max_new_tokens=2, run=run)
    warmup, timed = calls[:2], calls[2:]
    assert warmup == ["method", "baseline"] and len(records) == 3
    assert timed == ["method", "baseline", "baseline", "method", "method", "baseline"]
    assert all(r["identical_to_baseline"] for r in records)


def test_heldout_file_name_is_the_one_tiny_target_writes():
    from specheads.builders.tiny_target import HELDOUT_FILE  # decode/ does not import train/: a copy

    assert prompt_io.HELDOUT_FILE == HELDOUT_FILE


def test_eval_and_compare_take_one_tree_argument():
    """`--tree` is defined once (cli/eval_flags.add_tree_argument): eval takes a name (or auto), compare one
    per --heads directory, and both read dynamic[-N] the same way."""
    import argparse

    from specheads.decode.drafter_factory import EAGLE_TOTAL_TOKENS, dynamic_size

    def tree_action(add):
        p = argparse.ArgumentParser()
        add(p)
        return next(a for a in p._actions if "--tree" in a.option_strings)

    eval_tree, compare_tree = (
        tree_action(eval_command.add_arguments),
        tree_action(compare_command.add_arguments),
    )
    assert eval_tree.nargs is None and compare_tree.nargs == "*"
    assert "auto" in eval_tree.help and eval_tree.help.startswith(
        compare_tree.help.split("; or auto")[0][:60]
    )
    assert dynamic_size("dynamic-20") == 20 and dynamic_size("dynamic") == EAGLE_TOTAL_TOKENS
    assert dynamic_size("medusa-15") is None and dynamic_size(None) is None


# -- stopped and resumed (evaluate/progress.py) -----------------------------------------------------

TIMINGS = {"seconds", "baseline_seconds", "phase_seconds"}


def outputs(results: dict) -> list[dict]:
    """The per-prompt records without their timings: what a resumed run must reproduce exactly."""
    return [{k: v for k, v in r.items() if k not in TIMINGS} for r in results["per_prompt"]]


def stop_on_prompt(monkeypatch, n: int) -> None:
    """decode_prompt raises KeyboardInterrupt (as Ctrl-C or SIGTERM does) when called for the n-th time."""
    stop_at_call(monkeypatch, evaluate, "decode_prompt", n)


@pytest.mark.parametrize("sampled", [[], ["--temperature", "0.8", "--seed", "3"]], ids=["greedy", "sampled"])
def test_a_stopped_eval_keeps_its_prompts_and_resumes(setup, tmp_path, monkeypatch, capsys, sampled):
    args = ["--warmup", "0", "--max-new-tokens", "8", "--tree", "chain-4", *sampled]
    whole = tmp_path / "whole"
    assert cli(eval_args(setup, whole, setup["questions"], *args)) == 0
    assert not (whole / "progress.jsonl").exists()  # removed once results.json is written

    out = tmp_path / "stopped"
    stop_on_prompt(monkeypatch, 2)
    with pytest.raises(KeyboardInterrupt):
        cli(eval_args(setup, out, setup["questions"], *args))
    monkeypatch.undo()
    assert not (out / "results.json").exists()
    lines = [json.loads(line) for line in (out / "progress.jsonl").read_text().splitlines()]
    assert lines[0]["progress"] == "eval" and lines[0]["settings"]["max_new_tokens"] == 8
    assert [r["id"] for r in lines[1:]] == [
        r["id"] for r in json.loads((whole / "results.json").read_text())["per_prompt"][:1]
    ]
    printed = capsys.readouterr().out
    assert "stopped after 1 of 3 prompts" in printed and "--resume" in printed

    with pytest.raises(ValueError, match="max_new_tokens: 8 there, 6 now"):  # other settings: refused
        cli(eval_args(setup, out, setup["questions"], *args, "--max-new-tokens", "6"))
    assert cli(eval_args(setup, out, setup["questions"], *args, "--resume")) == 0
    assert "resuming: 1 of 3 prompts already done" in capsys.readouterr().out
    assert not (out / "progress.jsonl").exists()
    resumed, reference = (json.loads((d / "results.json").read_text()) for d in (out, whole))
    assert outputs(resumed) == outputs(reference)
    for key in (
        "new_tokens",
        "steps",
        "mean_accept_length",
        "accept_rate_per_depth",
        "identical_to_baseline",
    ):
        assert resumed[key] == reference[key]


def test_a_rerun_with_the_same_settings_resumes_and_a_torn_line_is_dropped(setup, tmp_path, monkeypatch):
    args = ["--warmup", "0", "--max-new-tokens", "8", "--num-prompts", "2"]
    out = tmp_path / "out"
    stop_on_prompt(monkeypatch, 2)
    with pytest.raises(KeyboardInterrupt):
        cli(eval_args(setup, out, setup["questions"], *args))
    monkeypatch.undo()
    progress = out / "progress.jsonl"
    with progress.open("a") as f:  # a run killed inside its append
        f.write('{"id": "torn", "new_')
    assert cli(eval_args(setup, out, setup["questions"], *args)) == 0  # no --resume: same settings go on
    assert [r["id"] for r in json.loads((out / "results.json").read_text())["per_prompt"]] == ["81", "101"]

    with pytest.raises(ValueError, match="nothing to resume"):
        cli(eval_args(setup, tmp_path / "empty", setup["questions"], *args, "--resume"))
    with pytest.raises(ValueError, match="give one of them"):
        cli(eval_args(setup, out, setup["questions"], *args, "--resume", "--overwrite"))
    stop_on_prompt(monkeypatch, 1)
    with pytest.raises(KeyboardInterrupt):
        cli(eval_args(setup, out, setup["questions"], *args, "--overwrite"))
    monkeypatch.undo()
    assert len(progress.read_text().splitlines()) == 1  # --overwrite started over: a header only


def test_sigterm_stops_as_ctrl_c_does():
    import os
    import signal

    from specheads.evaluate.progress import stop_on_sigterm

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt), stop_on_sigterm():
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # the handler runs between bytecodes
            pass
    assert signal.getsignal(signal.SIGTERM) is before


def test_named_question_sets_are_read_as_compare_reads_them(setup, tmp_path, monkeypatch):
    # `--prompts mt-bench` is the file of that name in $SPECHEADS_DATA (else the shipped copy), for eval too
    monkeypatch.setenv("SPECHEADS_DATA", str(tmp_path))
    (tmp_path / "mt_bench_question.jsonl").write_text(Path(setup["questions"]).read_text())
    named = prompt_io.read_prompts("mt-bench", "", category="writing")
    assert [t.id for t in named] == ["81", "121"]
