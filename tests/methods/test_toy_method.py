"""Adding a method is one module and one table entry: a toy method (tests/methods/toy_method.py) trains,
is saved, loaded and decoded through the real CLI, with nothing else changed."""

import json

import pytest
from toy_method import BIGRAM, BigramHead

from specheads.cli import main as cli_main
from specheads.core.target import FrozenTarget
from specheads.heads import load_heads
from specheads.heads.methods import methods, register, unregister

pytestmark = pytest.mark.usefixtures("one_thread")

QUESTIONS = [
    {"question_id": 1, "category": "writing", "turns": ["abcdefghij abcdefghij abcdefghij"]},
    {"question_id": 2, "category": "coding", "turns": ["0123456789 0123456789"]},
]


@pytest.fixture
def bigram():
    register(BIGRAM)
    yield BIGRAM
    unregister(BIGRAM.name)


def test_toy_method_trains_and_decodes_through_the_cli(bigram, tiny_target_dirs, tmp_path, capsys):
    target_dir, out = tiny_target_dirs["llama"], tmp_path / "heads"
    text_data = tmp_path / "cycles.jsonl"  # every byte determines the next ones: t + 2 is learnable
    words = ["abcdefghij", "0123456789", "klmnopqrst", "uvwxyz!?.,"]
    rows = [{"text": (words[i % 4] * 8)[i % 7 :]} for i in range(64)]
    text_data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = tmp_path / "bigram.yaml"
    recipe.write_text(f"method: bigram\ntarget: {target_dir}\ndata: [{text_data}]\nreport_to: none\n")
    train = [str(recipe), "max_length=64", "batch_size=8", "lr=0.01", "warmup_steps=2", "max_steps=30"]
    train += ["eval_fraction=0.1", "eval_every=30", "eval_batches=2", "log_every=10", f"output_dir={out}"]
    assert cli_main(["train", *train, "--no-progress"]) == 0
    assert "held-out top-1 per head" in capsys.readouterr().out
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [m["loss"] for m in metrics if m["split"] == "train"]
    assert len(losses) == 3 and losses[-1] < 0.5 * losses[0]  # it learned the cycles' t + 2

    heads, config = load_heads(out, FrozenTarget.from_pretrained(str(target_dir)))
    assert isinstance(heads, BigramHead) and config["method"] == "bigram"

    questions = tmp_path / "questions.jsonl"
    questions.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    evaluated = tmp_path / "eval"
    argv = ["eval", "--target", str(target_dir), "--heads", str(out), "--prompts", str(questions)]
    assert cli_main([*argv, "--out", str(evaluated), "--max-new-tokens", "12", "--no-progress"]) == 0
    results = json.loads((evaluated / "results.json").read_text())
    assert results["method"] == "bigram" and results["tree"]["name"] == "chain-2"
    assert results["identical_to_baseline"] == "2/2"  # lossless whatever the head guesses
    assert 1.0 <= results["mean_accept_length"] <= 2.0 and len(results["accept_rate_per_depth"]) == 1


def test_the_table_is_the_only_list_of_methods(bigram):
    """The built-ins and the toy, in one table; recipe validation reads it."""
    from specheads.train.config import load_config

    assert list(methods()) == ["medusa", "medusa2", "eagle", "eagle3", "bigram"]
    assert load_config(None, ["method=bigram"]).method == "bigram"
    unregister("bigram")
    with pytest.raises(ValueError, match="method must be one of .*'eagle3'\\), got 'bigram'"):
        load_config(None, ["method=bigram"])
    register(BIGRAM)
    with pytest.raises(ValueError, match="already registered"):
        register(BIGRAM)
