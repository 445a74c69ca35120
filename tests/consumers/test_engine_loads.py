"""Heads trained with recipes/qwen3-8b/eagle3.yaml, as the recipe is written (bf16 target and autocast,
layers (2, 18, 33), draft vocabulary 32000 keys, chat data with assistant-only loss), on a tiny random
36-layer Qwen3 whose vocabulary holds the recipe's draft vocabulary, for a few steps: exported to `eagle3`
and `speculators`, each is loaded by vLLM's and SGLang's own classes (scripts/check_engines.py: every
parameter filled and equal to our files, every key landed, d2t the engine's map; SGLang reads no
speculators config) and the speculators export by the speculators library, whose logits must be our
head's. Slow: it installs the engines' wheels (once, under the specheads cache) and trains 36 layers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from scripts import check_engines
from specheads.builders.tiny_target import default_cache_dir
from specheads.cli import main as cli_main
from specheads.core.target import FrozenTarget
from specheads.heads.checkpoint import load_heads
from specheads.methods import methods

from consumer_env import run_consumers
from helpers import causal_mask, max_diff, tiny_model, tiny_tokenizer, train_with_qwen3_8b_recipe

REPO = Path(__file__).resolve().parents[2]
T = 9
TOL = 1e-5  # fp32, as the consumer tests


pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]  # slow: CI's second stage


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict:
    """The recipe's run on the tiny Qwen3, and its eagle3 and speculators exports."""
    from accelerate.state import AcceleratorState

    root = tmp_path_factory.mktemp("qwen3-8b-recipe")
    # 36 layers as Qwen3-8B (the recipe's layer ids), a vocabulary past its draft_vocab_size of 32000
    target_dir = root / "target"
    tiny_model("qwen3", num_hidden_layers=36, vocab_size=40000).save_pretrained(target_dir)
    tiny_tokenizer().save_pretrained(target_dir)
    AcceleratorState._reset_state(reset_partial_state=True)
    try:
        run = train_with_qwen3_8b_recipe(target_dir, root)
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    exports = {}
    for fmt in ("eagle3", "speculators"):
        flags = ["--target", str(target_dir)] if fmt == "speculators" else []
        assert (
            cli_main(["export", "--heads", str(run), "--format", fmt, "--out", str(root / fmt), *flags]) == 0
        )
        exports[fmt] = root / fmt
    return {"root": root, "target": target_dir, "run": run, "exports": exports}


def test_the_recipe_trained_a_llama_draft_of_its_shape(trained):
    config = json.loads((trained["run"] / "config.json").read_text())
    head = config["head_config"]
    assert head["draft_arch"] == "llama" and head["layer_config"]["model_type"] == "llama"
    assert (head["draft_vocab_size"], head["target_layers"]) == (32000, [2, 18, 33])
    for fmt, export in trained["exports"].items():
        written = json.loads((export / "config.json").read_text())
        assert written["eagle_aux_hidden_state_layer_ids"] == [2, 18, 33], fmt
        assert written["draft_vocab_size"] == 32000, fmt


def test_vllm_and_sglang_load_the_recipes_exports_whole(trained):
    wheels = check_engines.wheels(default_cache_dir() / "engine-wheels")
    reports = {}
    for engine, wheel in wheels.items():
        paths = check_engines.engine_env(engine, wheel, default_cache_dir() / "engine-wheels" / "envs")
        work = trained["root"] / "loads" / engine
        work.mkdir(parents=True)
        jobs = [
            {
                "format": fmt,
                "export": str(trained["exports"][fmt]),
                "target": str(trained["target"]),
                "out": str(work / f"{fmt}.json"),
            }
            for fmt in check_engines.LOADED[engine]
            if fmt in trained["exports"]
        ]
        check_engines.run_engine(engine, paths, jobs, work)
        for job in jobs:
            reports[engine, job["format"]] = check_engines.judged(job["format"], Path(job["out"]))
    assert sorted(reports) == [("sglang", "eagle3"), ("vllm", "eagle3"), ("vllm", "speculators")]
    for (engine, fmt), report in reports.items():
        assert report["ok"], (engine, fmt, report.get("error") or report)
        assert report["d2t_to_target_ids_equal"] is True, (engine, fmt)
        assert report["our_keys_not_landed"] == [] and report["params_wrong"] == [], (engine, fmt)
    # the speculators export holds the target's embedding (--target): vLLM loads it too
    embed = reports["vllm", "speculators"]["params"]["model.embed_tokens.weight"]
    assert embed["from"] == ["embed_tokens.weight"] and embed["max_abs_diff"] == 0.0


def test_the_speculators_library_computes_the_recipes_heads_logits(trained, consumer_env):
    target = FrozenTarget.from_pretrained(str(trained["target"]), dtype="float32")
    head, _ = load_heads(trained["run"], target, dtype=torch.float32, methods=methods())
    tokens = torch.randint(0, 256, (1, T + 1), generator=torch.Generator().manual_seed(3))
    every_layer = tuple(range(target.num_layers + 1))
    hidden = target(tokens[:, :T], capture=every_layer, logits=False).hidden
    embeds = head.embed(target.embed_tokens, tokens[:, 1:])
    with torch.no_grad():
        logits = head.logits(head(head.input_hidden(hidden), embeds, torch.arange(T)[None], causal_mask(T)))
    work = trained["root"] / "speculators-consumer"
    work.mkdir()
    inputs = {
        "every_layer": torch.stack([hidden[i] for i in every_layer]),
        "input_ids": tokens[:, 1:],
        "position_ids": torch.arange(T)[None],
    }
    torch.save(inputs, work / "inputs.pt")
    job = {
        "kind": "speculators",
        "export": str(trained["exports"]["speculators"]),
        "target": str(trained["target"]),
        "inputs": str(work / "inputs.pt"),
        "out": str(work / "out.pt"),
    }
    run_consumers(consumer_env, [job], work)
    got = torch.load(work / "out.pt", weights_only=False)
    assert "error" not in got, got.get("error")
    assert got["missing"] == got["unexpected"] == got["mismatched"] == [], got
    assert got["embed_matches_target"], "the draft's embedding is not the verifier's"
    assert got["layer_ids"] == [2, 18, 33]
    assert max_diff(got["logits"], logits) <= TOL
    assert torch.equal(got["target_ids"], head.to_target_ids(logits.argmax(-1)))
