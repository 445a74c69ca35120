"""Offline training through the real entry points: `specheads cache RECIPE` then `specheads train RECIPE
mode=offline cache_dir=...` logs the losses online training logs on the same batches (fp32 cache),
ends with the same heads (both within what reordering the online run's sums moves them: its twin, see
tests/equivalence.py; the rows are cut to max_length, so all hold as many labels), and never loads the target's decoder layers; a cache made for other data or
another method is refused before any step."""

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from specheads.train.hidden_cache import CacheError, TokenMismatchError

from equivalence import assert_same_weights, assert_within_rounding, max_value_gap
from helpers import command

cache_main, train_main = command("cache"), command("train")

REPO = Path(__file__).resolve().parents[2]
# Clock readings, not results.
TIMINGS = {"labels_per_second"}


pytestmark = pytest.mark.usefixtures("one_thread")


def recipe_args(recipe: str, target: Path, data: Path, *extra: str) -> list[str]:
    return [
        str(REPO / "recipes" / "tiny" / recipe),
        f"target={target}",
        f"data={data}",
        "max_length=48",
        "batch_size=4",
        "lr=0.01",
        "warmup_steps=2",
        "max_steps=4",
        "eval_fraction=0.1",
        "eval_data=[]",  # the recipe evaluates on stdlib; these runs on a split of their data
        "eval_every=4",
        "eval_batches=2",
        "log_every=1",
        "report_to=none",
        *extra,
    ]


@pytest.fixture(scope="module")
def equal_rows(tmp_path_factory) -> Path:
    """64 rows of cyclic text, each exactly max_length (48) byte tokens: every micro-batch of any size
    holds as many labels, so the twin with smaller micro-batches computes the same losses."""
    words = ["abcdefghij", "0123456789", "klmnopqrst", "uvwxyz!?.,"]
    path = tmp_path_factory.mktemp("rows") / "rows.jsonl"
    path.write_text("".join(json.dumps({"text": (words[i % 4] * 8)[i % 7 :][:48]}) + "\n" for i in range(64)))
    return path


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


METHODS = [
    # labels=target: the offline target computes the logits from the cached last hidden state
    ("medusa.yaml", ("num_heads=3", "labels=target")),
    # Muon's Newton-Schulz products in fp32 whatever the CPU: bf16's (muon_dtype "auto" on a CPU with bf16
    # units) turn the twin's roundings into whole steps, past what tells reordering from another computation
    # draft_head_init=target as the SmolLM2 recipe: the offline target's lm_head and norm start the head
    (
        "eagle3.yaml",
        (
            "eagle3_layers=1,2,3",
            "ttt_steps=3",
            "draft_vocab_size=264",
            "muon_dtype=float32",
            "draft_head_init=target",
        ),
    ),
]


@pytest.mark.parametrize("recipe, extra", METHODS, ids=["medusa", "eagle3"])
def test_offline_training_logs_the_online_losses(
    recipe, extra, tiny_target_dirs, equal_rows, tmp_path, monkeypatch
):
    from transformers import AutoModelForCausalLM

    args = recipe_args(recipe, tiny_target_dirs["llama"], equal_rows, *extra)
    cache = tmp_path / "cache"
    assert cache_main([*args, "--out", str(cache), "--dtype", "float32", "--no-progress"]) == 0
    assert train_main([*args, f"output_dir={tmp_path / 'online'}", "--no-progress"]) == 0
    twin = [*args, "batch_size=2", "grad_accum=2", f"output_dir={tmp_path / 'twin'}", "--no-progress"]
    assert train_main(twin) == 0  # online again, the same rows in micro-batches of 2

    def refuse(*a, **kw):
        raise AssertionError("offline training must not load the whole target")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", refuse)
    offline_args = [*args, "mode=offline", f"cache_dir={cache}", f"output_dir={tmp_path / 'offline'}"]
    assert train_main([*offline_args, "--no-progress"]) == 0

    online, offline, twin = (records(tmp_path / d) for d in ("online", "offline", "twin"))
    assert [(r["step"], r["split"]) for r in online] == [(r["step"], r["split"]) for r in offline]
    assert [r["split"] for r in online] == ["train"] * 4 + ["eval"]
    assert [r["step"] for r in twin if r["split"] == "train"] == [r["step"] for r in online[:4]]
    for a, b in zip(online, offline):
        assert a.keys() == b.keys()
    # Losses and norms move by roundings: within the twin's reordering (its train records alone measure
    # it: eval rows depend on the batch size). Accuracies move only where a rounding flips a near-tie in
    # an argmax: at most two labels of a record. Counts, rates and learning rates are exact. tau_sim is
    # a function of the top-1 accuracies.
    noises = {
        key: max_value_gap([r[key] for r in online[:4]], [r[key] for r in twin[:4]])
        for key in online[0].keys() - TIMINGS - {"step", "split"}
    }
    for a, b in zip(online, offline):
        for key in a.keys() - TIMINGS - {"tau_sim"}:
            if "top" in key:
                assert abs(a[key] - b[key]) * a["tokens"] <= 2 + 1e-6, (a["step"], a["split"], key)
            elif key.endswith(("loss", "grad_norm")):
                assert_within_rounding(abs(a[key] - b[key]), noises.get(key, noises["loss"]), key)
            else:
                assert a[key] == b[key], (a["step"], a["split"], key)
    assert online[-1]["tokens"] > 0 and online[0]["loss"] > 1  # real losses over real labels
    # the same heads at the end, and they did move off their start
    wa, wb, wc = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("online", "offline", "twin"))
    assert_same_weights(wa, wb, wc)
    assert online[1]["grad_norm"] > 0
    # offline holds the embedding, final norm and lm_head only
    summaries = [json.loads((tmp_path / d / "train_summary.json").read_text()) for d in ("online", "offline")]
    on_params, off_params = (s["target_parameters"] for s in summaries)
    assert off_params < on_params / 2
    assert json.loads((tmp_path / "offline" / "config.json").read_text())["training"]["mode"] == "offline"


def test_a_cache_of_other_data_or_layers_is_refused_before_training(tiny_target_dirs, text_data, tmp_path):
    medusa = recipe_args("medusa.yaml", tiny_target_dirs["llama"], text_data, "num_heads=2")
    cache = tmp_path / "cache"
    assert cache_main([*medusa, "--out", str(cache), "--dtype", "float32", "--no-progress"]) == 0
    offline = ["mode=offline", f"cache_dir={cache}", "--no-progress"]

    out = tmp_path / "eagle3"
    eagle3 = recipe_args("eagle3.yaml", tiny_target_dirs["llama"], text_data, "eagle3_layers=1,2,3")
    with pytest.raises(CacheError, match=r"holds layers \[4\], not \[1, 2, 3\]"):
        train_main([*eagle3, f"output_dir={out}", *offline])
    assert not (out / "metrics.jsonl").exists()

    out = tmp_path / "shorter"  # other max_length: other rows than the cache was built from
    with pytest.raises(TokenMismatchError, match="rebuild it with `specheads cache`"):
        train_main([*medusa, "max_length=40", f"output_dir={out}", *offline])
    assert not (out / "metrics.jsonl").exists()
