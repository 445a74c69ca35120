"""Our exports, loaded and run by the code that consumes them: speculators, eagle-llm, medusa-llm.

Each case perturbs fresh heads of the tiny random Llama target (as training would move them), exports
them with `specheads export`, loads the export with the consumer's own class and loader
(consumer_run.py, in the consumer packages from consumer_env.py), runs the consumer's forward on the
inputs our heads see, and compares:

| format        | consumer (pinned)                              | compared                                  |
| ------------- | ---------------------------------------------- | ----------------------------------------- |
| `speculators` | speculators 0.9.0 `Eagle3DraftModel`           | draft logits; target ids via its own d2t  |
| `eagle3`      | speculators 0.9.0 `Eagle3Converter`, then the above | the same                             |
| `eagle`       | eagle-llm 1.2.1 `eagle.model.cnets.Model`      | predicted features                        |
| `medusa`      | medusa-llm 0.1 `MedusaModel.from_pretrained`   | every head's logits                       |

Every parameter the consumer owns must come from our files (the embedding the engines share: from the
target), with no key of ours left unused. Outputs agree to fp32 round-off (TOL): the same math in another
order (the consumers' own attention, rotary and RMSNorm code).

The EAGLE cases run again with a Llama draft layer (draft_arch: llama) over tiny Qwen3-MoE, Gemma-3 and
Phi-3 targets (FAMILY_CASES): their exports are Llama drafts, loaded by the same consumers.

Each check also runs on exports broken on purpose (a layer id shifted by one, two norms swapped, a key
renamed, a bias dropped) and must fail. All cases run in one consumer process (torch imported once).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from specheads.cli import main as formats_cli
from specheads.core.target import FrozenTarget
from specheads.decode import EagleDrafter, MedusaDrafter, SpeculativeDecoder, default_tree
from specheads.heads import (
    Eagle3Config,
    Eagle3Head,
    EagleConfig,
    EagleHead,
    MedusaConfig,
    MedusaHeads,
    draft_layer_config,
    save_heads,
)
from specheads.heads.checkpoint import load_heads
from specheads.methods import methods

from consumer_env import run_consumers
from helpers import OTHER_FAMILIES, causal_mask, edit_weights, max_diff, perturbed, save_tiny_target

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]  # slow: CI's second stage

T = 9
TOL = 1e-5  # fp32; measured: 7e-7 (speculators), 4e-7 (eagle-llm), 0 (medusa-llm)


def left_over(got: dict) -> str:
    return ", ".join(f"{k} {got[k]}" for k in ("missing", "unexpected", "mismatched") if got.get(k))


# -- the cases: heads, the inputs the consumer gets, what our heads compute ------------------------


def eagle3_case(target, tokens, draft_arch="target"):
    torch.manual_seed(0)
    layer_config = draft_layer_config(target.config, draft_arch)
    head = Eagle3Head(Eagle3Config(layer_config, draft_arch=draft_arch, draft_vocab_size=100))
    draft_vocab = torch.randperm(target.vocab_size, generator=torch.Generator().manual_seed(1))[:100]
    head = perturbed(head.set_draft_vocab(draft_vocab.sort().values))
    every_layer = tuple(range(target.num_layers + 1))
    hidden = target(tokens[:, :T], capture=every_layer, logits=False).hidden  # HF id -> (1, T, H)
    embeds = head.embed(target.embed_tokens, tokens[:, 1:])
    with torch.no_grad():
        logits = head.logits(head(head.input_hidden(hidden), embeds, torch.arange(T)[None], causal_mask(T)))
    inputs = {
        "every_layer": torch.stack([hidden[i] for i in every_layer]),  # the consumer picks its own ids
        "input_ids": tokens[:, 1:],
        "position_ids": torch.arange(T)[None],
    }
    expected = {
        "logits": logits,
        "target_ids": head.to_target_ids(logits.argmax(-1)),
        "layer_ids": list(head.capture_layers),
    }
    return head, inputs, expected


def eagle_case(target, tokens, fc_bias: bool, draft_arch="target"):
    torch.manual_seed(0)
    layer_config = draft_layer_config(target.config, draft_arch)
    head = perturbed(EagleHead(EagleConfig(layer_config, draft_arch=draft_arch, fc_bias=fc_bias)))
    L = target.num_layers
    features = target(tokens[:, :T], capture=(L,), logits=False).hidden[L]  # after the final norm
    embeds = head.embed(target.embed_tokens, tokens[:, 1:])
    with torch.no_grad():
        predicted = head(features, embeds, torch.arange(T)[None], causal_mask(T))
    return head, {"features": features, "input_ids": tokens[:, 1:]}, {"features": predicted}


def medusa_case(target, tokens):
    torch.manual_seed(0)
    heads = MedusaHeads(MedusaConfig(target.hidden_size, target.vocab_size, num_heads=3, num_layers=1))
    heads.init_lm_heads_from(target.lm_head)
    heads = perturbed(heads)
    L = target.num_layers
    hidden = target(tokens[:, :T], capture=(L,), logits=False).hidden[L]
    with torch.no_grad():
        logits = heads(hidden)  # (K, 1, T, V)
    return heads, {"hidden": hidden}, {"logits": logits}


# -- the checks ------------------------------------------------------------------------------------


def check_speculators(got: dict, expected: dict) -> float:
    assert got["missing"] == got["unexpected"] == got["mismatched"] == [], left_over(got)
    assert got["embed_matches_target"], "the draft's embedding is not the verifier's"
    diff = max_diff(got["logits"], expected["logits"])
    assert diff <= TOL, f"speculators logits differ by {diff} (its layer ids {got['layer_ids']})"
    assert got["layer_ids"] == expected["layer_ids"], f"layer ids {got['layer_ids']}"
    assert torch.equal(got["target_ids"], expected["target_ids"])
    return diff


def check_eagle(got: dict, expected: dict) -> float:
    assert got["missing"] == got["unexpected"] == [], left_over(got)
    diff = max_diff(got["features"], expected["features"])
    assert diff <= TOL, f"eagle-llm features differ by {diff}"
    return diff


def check_medusa(got: dict, expected: dict) -> float:
    assert got["missing"] == got["unexpected"] == [], left_over(got)
    diff = max_diff(got["logits"], expected["logits"])
    assert diff <= TOL, f"medusa-llm logits differ by {diff}"
    return diff


CHECKS = {
    "speculators": check_speculators,
    "speculators-converter": check_speculators,
    "eagle": check_eagle,
    "medusa": check_medusa,
}


# -- breakages -------------------------------------------------------------------------------------


def shift_layer_id(path: Path) -> None:
    """The low layer one lower: (1, 2, 3) -> (0, 2, 3)."""
    config = json.loads((path / "config.json").read_text())
    config["eagle_aux_hidden_state_layer_ids"][0] -= 1
    (path / "config.json").write_text(json.dumps(config))


def swap_norms(path: Path) -> None:
    a, b = "layers.0.input_layernorm.weight", "layers.0.hidden_norm.weight"
    edit_weights(path, lambda t: t.update({a: t[b], b: t[a]}))


def rename_eagle_key(path: Path) -> None:
    edit_weights(path, lambda t: t.update({"layers.0.mlp.up.weight": t.pop("layers.0.mlp.up_proj.weight")}))


def drop_fc_bias(path: Path) -> None:
    edit_weights(path, lambda t: t.pop("fc.bias"))


def rename_medusa_key(path: Path) -> None:
    tensors = torch.load(path / "medusa_lm_head.pt", weights_only=True)
    tensors["1.0.linear.w"] = tensors.pop("1.0.linear.weight")
    torch.save(tensors, path / "medusa_lm_head.pt")


# (case, consumer, format, export flags, breakage or None)
CASES = {
    "speculators": ("eagle3", "speculators", "speculators", ("--target", "TARGET"), None),
    "eagle3-via-speculators-converter": ("eagle3", "speculators-converter", "eagle3", (), None),
    "eagle-no-fc-bias": ("eagle", "eagle", "eagle", (), None),
    "eagle-fc-bias-kept": ("eagle-bias", "eagle", "eagle", ("--fc-bias", "keep"), None),
    "medusa": ("medusa", "medusa", "medusa", (), None),
    "speculators-shift_layer_id": (
        "eagle3",
        "speculators",
        "speculators",
        ("--target", "TARGET"),
        shift_layer_id,
    ),
    "speculators-swap_norms": ("eagle3", "speculators", "speculators", ("--target", "TARGET"), swap_norms),
    "eagle3-shift_layer_id": ("eagle3", "speculators-converter", "eagle3", (), shift_layer_id),
    "eagle-rename_key": ("eagle-bias", "eagle", "eagle", ("--fc-bias", "keep"), rename_eagle_key),
    "eagle-drop_fc_bias": ("eagle-bias", "eagle", "eagle", ("--fc-bias", "keep"), drop_fc_bias),
    "medusa-rename_key": ("medusa", "medusa", "medusa", (), rename_medusa_key),
}
# The other direction: (consumer job writing the checkpoint, our format, heads whose inputs it gets)
WRITTEN = {
    "written-by-medusa-llm": ("write-medusa", "medusa", "medusa"),
    "written-by-eagle-llm": ("write-eagle", "eagle", "eagle"),
    "written-by-speculators": ("write-speculators", "speculators", "eagle3"),
}
# Heads with a Llama draft layer (draft_arch: llama) over targets of other families, exported as a Llama
# target's: Qwen3-MoE (a mixture-of-experts target), Gemma-3 (embeddings scaled inside the model, a 1 + w
# final norm) and Phi-3 (fused qkv). Not eagle-llm over Gemma-3: cnets rotates with theta 10000 whatever
# the config says (consumer_run.py), and the Gemma-3 draft's is its target's 1e6 (vLLM and SGLang read it).
# case name -> (family, heads, consumer, format, export flags)
FAMILY_CASES = {
    f"{family}-{name}": (family, *CASES[name][:4])
    for family in ("qwen3_moe", "gemma3_text", "phi3")
    for name in ("speculators", "eagle3-via-speculators-converter", "eagle-no-fc-bias")
    if (family, name) != ("gemma3_text", "eagle-no-fc-bias")
}
WORKING = [name for name, case in CASES.items() if case[-1] is None]
BROKEN = [name for name, case in CASES.items() if case[-1] is not None]


@pytest.fixture(scope="module")
def consumed(consumer_env, tiny_target_dirs, tmp_path_factory) -> dict:
    """case -> (what the consumer computed, what our heads computed): every case in one consumer run."""
    target_dir = tiny_target_dirs["llama"]
    target = FrozenTarget.from_pretrained(str(target_dir), dtype="float32")
    tokens = torch.randint(0, 256, (1, T + 1), generator=torch.Generator().manual_seed(3))
    builders = {
        "eagle3": lambda: eagle3_case(target, tokens),
        "eagle": lambda: eagle_case(target, tokens, fc_bias=False),
        "eagle-bias": lambda: eagle_case(target, tokens, fc_bias=True),
        "medusa": lambda: medusa_case(target, tokens),
    }
    root = tmp_path_factory.mktemp("consumers")
    jobs, expected = [], {}
    for name, (heads_kind, consumer, fmt, flags, breakage) in CASES.items():
        heads, inputs, expected[name] = builders[heads_kind]()
        work = root / name
        save_heads(heads, work / "native", target.record())
        flags = [str(target_dir) if f == "TARGET" else f for f in flags]
        args = ["export", "--heads", str(work / "native"), "--format", fmt, "--out", str(work / fmt)]
        assert formats_cli([*args, *flags]) == 0
        if breakage is not None:
            breakage(work / fmt)
        torch.save(inputs, work / "inputs.pt")
        jobs.append(
            {
                "kind": consumer,
                "export": str(work / fmt),
                "target": str(target_dir),
                "inputs": str(work / "inputs.pt"),
                "out": str(work / "out.pt"),
            }
        )
    for name, (job, _, heads_kind) in WRITTEN.items():
        _, inputs, _ = builders[heads_kind]()
        work = root / name
        work.mkdir()
        torch.save(inputs, work / "inputs.pt")
        jobs.append(
            {
                "kind": job,
                "export": str(work / "checkpoint"),
                "target": str(target_dir),
                "inputs": str(work / "inputs.pt"),
                "out": str(work / "out.pt"),
            }
        )
        expected[name] = inputs
    for name, (family, heads_kind, consumer, fmt, flags) in FAMILY_CASES.items():
        family_dir = root / "targets" / family
        if not family_dir.exists():
            save_tiny_target(family, family_dir, **OTHER_FAMILIES[family])
        family_target = FrozenTarget.from_pretrained(str(family_dir), dtype="float32")
        build = {"eagle3": eagle3_case, "eagle": lambda t, x, **kw: eagle_case(t, x, fc_bias=False, **kw)}
        heads, inputs, expected[name] = build[heads_kind](family_target, tokens, draft_arch="llama")
        work = root / name
        save_heads(heads, work / "native", family_target.record())
        flags = [str(family_dir) if f == "TARGET" else f for f in flags]
        args = ["export", "--heads", str(work / "native"), "--format", fmt, "--out", str(work / fmt)]
        assert formats_cli([*args, *flags]) == 0
        torch.save(inputs, work / "inputs.pt")
        jobs.append(
            {
                "kind": consumer,
                "export": str(work / fmt),
                "target": str(family_dir),
                "inputs": str(work / "inputs.pt"),
                "out": str(work / "out.pt"),
            }
        )
    run_consumers(consumer_env, jobs, root)
    return {
        name: (torch.load(job["out"], weights_only=False), expected[name], Path(job["export"]))
        for name, job in zip([*CASES, *WRITTEN, *FAMILY_CASES], jobs, strict=True)
    }


@pytest.mark.parametrize("name", WORKING)
def test_the_consumer_loads_our_export_and_computes_what_our_heads_do(consumed, name):
    got, expected, _ = consumed[name]
    assert "error" not in got, got.get("error")
    diff = CHECKS[CASES[name][1]](got, expected)
    print(f"{name}: max |diff| {diff:.2e}")


@pytest.mark.parametrize("name", list(FAMILY_CASES))
def test_the_consumer_loads_a_llama_draft_of_another_familys_target(consumed, name):
    """The Llama draft layer of a Qwen3-MoE, Gemma-3 or Phi-3 target's heads, exported as a Llama target's,
    computes in the consumer what our heads do (the embedding read from the target's table, unscaled)."""
    got, expected, _ = consumed[name]
    assert "error" not in got, got.get("error")
    diff = CHECKS[FAMILY_CASES[name][2]](got, expected)
    print(f"{name}: max |diff| {diff:.2e}")


@pytest.mark.parametrize("name", BROKEN)
def test_the_check_fails_on_an_export_broken_on_purpose(consumed, name):
    got, expected, _ = consumed[name]
    assert "error" not in got, got.get("error")  # the consumer still loads it: only the check can tell
    with pytest.raises(AssertionError) as failed:
        CHECKS[CASES[name][1]](got, expected)
    print(f"{name}: {str(failed.value).splitlines()[0][:160]}")


# -- the other direction: checkpoints the consumers' own code wrote, imported and decoded ---------


def greedy_equals_generate(target, drafter, seed=0):
    prompt = torch.randint(0, 256, (1, 6), generator=torch.Generator().manual_seed(seed))
    out = SpeculativeDecoder(target, drafter).generate(prompt, max_new_tokens=20)
    reference = target.model.generate(prompt, max_new_tokens=20, do_sample=False)[:, 6:]
    assert torch.equal(out.tokens, reference), (out.tokens.tolist(), reference.tolist())


@pytest.mark.parametrize("name", list(WRITTEN))
def test_a_checkpoint_the_consumer_wrote_imports_and_decodes_as_generate(
    consumed, tiny_target_dirs, tmp_path, name
):
    """medusa-llm's MedusaModel saved as its trainer saves (medusa_lm_head.pt), eagle-llm's cnets.Model as
    the official EAGLE-1 checkpoints are (pytorch_model.bin), speculators' Eagle3DraftModel by its
    save_pretrained: `import-heads` gives heads that compute what the consumer computed, and our decoder's
    greedy output equals the target's generate()."""
    got, inputs, checkpoint = consumed[name]
    assert "error" not in got, got.get("error")
    _, fmt, _ = WRITTEN[name]
    target_dir = tiny_target_dirs["llama"]
    args = ["import-heads", "--format", fmt, "--checkpoint", str(checkpoint), "--target", str(target_dir)]
    assert formats_cli([*args, "--out", str(tmp_path / "native")]) == 0
    target = FrozenTarget.from_pretrained(str(target_dir), dtype="float32")
    heads, _ = load_heads(tmp_path / "native", target, methods=methods())
    with torch.no_grad():
        if fmt == "medusa":
            diff = max_diff(heads(inputs["hidden"]), got["logits"])
            drafter = MedusaDrafter(heads, default_tree("medusa-15", num_heads=3))
        elif fmt == "eagle":
            embeds = target.embed_tokens(inputs["input_ids"])
            ours = heads(inputs["features"], embeds, torch.arange(T)[None], causal_mask(T))
            diff = max_diff(ours, got["features"])
            drafter = EagleDrafter(heads, target, default_tree("medusa-15"))
        else:
            assert heads.capture_layers == (1, 2, 3)
            hidden = {i: inputs["every_layer"][i] for i in heads.capture_layers}
            embeds = target.embed_tokens(inputs["input_ids"])
            h = heads(heads.input_hidden(hidden), embeds, torch.arange(T)[None], causal_mask(T))
            logits = heads.logits(h)
            diff = max_diff(logits, got["logits"])
            assert torch.equal(heads.to_target_ids(logits.argmax(-1)), got["target_ids"])
            drafter = EagleDrafter(heads, target, top_k=4, depth=3, total_tokens=12)
    assert diff <= TOL, f"imported {name} heads differ from the consumer's by {diff}"
    print(f"{name} checkpoint imported: max |diff| {diff:.2e}")
    greedy_equals_generate(target, drafter)
