"""`specheads eval --temperature/--top-k/--top-p/--seed`: both sides sample, seeded; identical_to_baseline is
null; results.json records the settings; the command line reproduces the run."""

import argparse
import json
import shlex

import pytest
import torch

from specheads.cli import eval as eval_command
from specheads.cli import main as cli_main
from specheads.core.target import FrozenTarget
from specheads.decode.sampling import SamplingParams
from specheads.evaluate import evaluate
from specheads.heads import MedusaConfig, MedusaHeads, save_heads

QUESTIONS = [
    {"question_id": 1, "category": "writing", "turns": ["Write a haiku about Python."]},
    {"question_id": 2, "category": "math", "turns": ["What is 2 + 2?"]},
]
SAMPLED = ["--temperature", "0.8", "--top-k", "20", "--top-p", "0.9", "--seed", "3"]


@pytest.fixture(scope="module")
def setup(tiny_target_dirs, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("eval-sampling")
    target = FrozenTarget.from_pretrained(str(tiny_target_dirs["llama"]))
    heads = MedusaHeads(MedusaConfig(target.hidden_size, target.vocab_size, num_heads=2))
    save_heads(heads.init_lm_heads_from(target.lm_head), root / "heads", target.record())
    questions = root / "questions.jsonl"
    questions.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    return {"target": tiny_target_dirs["llama"], "heads": root / "heads", "questions": questions}


def cli(args: list[str]) -> int:
    """`specheads eval ...` (its own entry point: the rest of the CLI is not needed here)."""
    assert args[0] == "eval"
    return cli_main(args)


def eval_args(setup, out, *extra: str) -> list[str]:
    return [
        "eval",
        "--target",
        str(setup["target"]),
        "--heads",
        str(setup["heads"]),
        "--prompts",
        str(setup["questions"]),
        "--out",
        str(out),
        "--max-new-tokens",
        "12",
        "--warmup",
        "0",
        "--no-progress",
        *extra,
    ]


def test_sampled_eval_records_its_settings_and_is_reproducible(setup, tmp_path):
    runs = []
    for name in ("a", "b"):
        assert cli(eval_args(setup, tmp_path / name, *SAMPLED)) == 0
        runs.append(json.loads((tmp_path / name / "results.json").read_text()))
    results = runs[0]
    assert results["sampling"] == {
        "do_sample": True,
        "temperature": 0.8,
        "top_k": 20,
        "top_p": 0.9,
        "seed": 3,
        "acceptance": "exact",
        "baseline": "generate(do_sample=True, temperature=0.8, top_k=20, top_p=0.9)",
    }
    assert results["identical_to_baseline"] is None
    assert all(f["identical_to_baseline"] is None for f in results["per_category"].values())
    assert all(
        r["identical_to_baseline"] is None and r["first_mismatch"] is None for r in results["per_prompt"]
    )
    rows = results["per_prompt"]
    assert results["new_tokens"] == sum(r["new_tokens"] for r in rows) > 0
    assert all(r["new_tokens"] == 1 + sum(r["accept_lengths"]) for r in rows)
    # the same seed draws the same outputs, on both sides
    again = runs[1]["per_prompt"]
    for key in ("accept_lengths", "new_tokens", "baseline_new_tokens"):
        assert [r[key] for r in rows] == [r[key] for r in again], key
    report = (tmp_path / "a" / "report.md").read_text()
    assert "- sampled: temperature 0.8, top-k 20, top-p 0.9, seed 3" in report
    assert "| medusa | 2 |" in report and report.count("| – |") >= 3  # identical is not measured
    # the speedup is over the sampled baseline, and the report says so (it named the greedy one)
    assert "- speedup: tokens/s over the target's own `generate(do_sample=True, temperature=0.8" in report
    assert "do_sample=False" not in report
    # the command spells out the sampling flags: parsed again, it gives this run's arguments
    parser = argparse.ArgumentParser()
    eval_command.add_arguments(parser)
    again_args = vars(parser.parse_args(shlex.split(results["command"])[2:]))
    given = vars(parser.parse_args(eval_args(setup, tmp_path / "a", *SAMPLED)[1:]))
    assert again_args == {**given, "tree": "medusa-15", "no_progress": False}


def test_greedy_runs_record_no_sampling():
    assert evaluate.sampling_record(None, seed=3) == {
        "do_sample": False,
        "temperature": 0.0,
        "top_k": None,
        "top_p": None,
        "seed": None,
        "acceptance": "greedy",
        "baseline": "generate(do_sample=False)",
    }


def test_the_baseline_samples_with_the_seed(setup):
    target = FrozenTarget.from_pretrained(str(setup["target"]))
    prompt = torch.randint(0, 256, (1, 6), generator=torch.Generator().manual_seed(0))
    params = SamplingParams(temperature=1.5)
    draws = [evaluate.baseline_generate(target, prompt, 16, params, seed) for seed in (4, 4, 5)]
    assert draws[0] == draws[1] and draws[0] != draws[2]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--temperature", "-1"], "temperature > 0"),
        (["--top-p", "0"], r"top_p must lie in \(0, 1\]"),
        (["--temperature", "0.7", "--top-k", "-2"], "top_k must be an int >= 0"),
    ],
)
def test_bad_sampling_flags_fail_before_anything_is_written(setup, tmp_path, flags, message):
    with pytest.raises(ValueError, match=message):
        cli(eval_args(setup, tmp_path / "out", *flags))
    assert not (tmp_path / "out").exists()
