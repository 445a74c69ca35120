"""EAGLE-3 heads trained and exported by NVIDIA Model Optimizer's own code, imported and decoded.

modelopt_run.py (in the modelopt directory of modelopt_env.py: nvidia-modelopt 0.47.0 with the transformers
5.14.1 it supports) converts the tiny random Llama target with `mtsp.convert` (EAGLE3_DEFAULT_CFG, aux
layers 0, 1, 2 = HF hidden_states 1, 2, 3; a 100-token draft vocabulary), trains it 5 steps with its own
training loss on CPU, exports it with `export_speculative_decoding`, and computes its draft logits on
fixed tokens. Then here: `specheads import-heads --format eagle3` reads the export, our heads compute the
same draft logits, and our decoder with them is token-identical to the target's generate().

What "the same" means. modelopt's own training forward and the engines read the exported layer
differently: modelopt's layer 0 is transformers' LlamaDecoderLayer, which applies `input_layernorm` to the
fused hidden state before modelopt's attention pre-hook applies `hidden_norm` to it (and `input_layernorm`
to the embeddings), so modelopt trains hidden_norm(input_layernorm(h)); vLLM's and SGLang's llama_eagle3
layers, the speculators library (test_consumers.py) and our Eagle3Head compute hidden_norm(h). Our heads
match modelopt's forward with that one difference removed (modelopt_run.EmbedsOnlyNorm) to 0; against its
own forward they differ by ~5e-2 after 5 steps (the input_layernorm weights move off 1). A modelopt
behaviour, not our importer's: the exported files mean what the engines compute.

Each check fails on an export broken on purpose: a layer id shifted by one, the two input norms swapped,
a key renamed (import-heads refuses it).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from modelopt_env import ensure_env, run_modelopt
from safetensors.torch import load_file, save_file

from specheads.cli import main as cli
from specheads.core.target import FrozenTarget
from specheads.decode import EagleDrafter, SpeculativeDecoder
from specheads.heads.checkpoint import load_heads
from specheads.methods import methods
from specheads.train.eagle_losses import eagle3_loss

from helpers import causal_mask, edit_weights, max_diff

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]  # slow: CI's second stage

T = 9
STEPS = 5
TOL = 1e-5  # fp32; measured: 0 (the same ops in the same order)


@pytest.fixture(scope="module")
def made(tiny_target_dirs, tmp_path_factory) -> dict:
    """modelopt's run: its exports, its draft logits, and the tokens and target they were computed on."""
    env = ensure_env()
    work = tmp_path_factory.mktemp("modelopt")
    tokens = torch.randint(0, 256, (1, T + 1), generator=torch.Generator().manual_seed(3))
    torch.save(tokens, work / "tokens.pt")
    target_dir = tiny_target_dirs["llama"]
    run_modelopt(env, [str(target_dir), str(work), str(STEPS)])
    out = torch.load(work / "out.pt", weights_only=False)
    return {"work": work, "tokens": tokens, "target_dir": target_dir, "out": out}


def imported(made: dict, export: Path, out: Path):
    target_dir = made["target_dir"]
    args = ["import-heads", "--format", "eagle3", "--checkpoint", str(export), "--target", str(target_dir)]
    assert cli([*args, "--out", str(out)]) == 0
    target = FrozenTarget.from_pretrained(str(target_dir), dtype="float32")
    heads, _ = load_heads(out, target, methods=methods())
    return heads, target


def our_logits(heads, target, tokens: torch.Tensor) -> torch.Tensor:
    """Our heads' first draft step: position t reads the captured layers at t and token t+1's embedding."""
    hidden = target(tokens[:, :T], capture=heads.capture_layers, logits=False).hidden
    embeds = target.embed_tokens(tokens[:, 1:])
    with torch.no_grad():
        return heads.logits(heads(heads.input_hidden(hidden), embeds, torch.arange(T)[None], causal_mask(T)))


def check_drafts(heads, target, made: dict) -> float:
    """Our imported heads compute modelopt's drafts as the engines read its export."""
    logits = our_logits(heads, target, made["tokens"])
    diff = max_diff(logits, made["out"]["logits_engine_norm"])
    assert diff <= TOL, (
        f"our heads differ from modelopt's drafts by {diff} (our layers {heads.capture_layers})"
    )
    return diff


def copy_export(made: dict, tmp_path: Path) -> Path:
    return Path(shutil.copytree(made["work"] / "eagle3", tmp_path / "eagle3"))


def test_modelopt_trained_and_exported_its_eagle3_heads(made):
    out = made["out"]
    assert len(out["losses"]) == STEPS and all(torch.isfinite(torch.tensor(out["losses"])))
    assert out["layer_ids"] == [0, 1, 2]
    config = json.loads((made["work"] / "eagle3" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]
    keys = set(load_file(str(made["work"] / "eagle3" / "model.safetensors")))
    assert {"fc.weight", "d2t", "lm_head.weight", "layers.0.hidden_norm.weight"} <= keys
    print(f"modelopt losses over {STEPS} steps: {[round(x, 3) for x in out['losses']]}")
    print(f"modelopt EAGLE-1 path: {out['eagle1'][:160]}...")
    print(f"modelopt Medusa path: {out['medusa']}")


def test_import_heads_reads_modelopt_export_and_reproduces_its_drafts(made, tmp_path):
    heads, target = imported(made, made["work"] / "eagle3", tmp_path / "native")
    assert heads.capture_layers == (1, 2, 3)  # modelopt's 0-based layer outputs 0, 1, 2
    diff = check_drafts(heads, target, made)
    logits = our_logits(heads, target, made["tokens"])
    own = max_diff(logits, made["out"]["logits"])
    # modelopt's own training forward normalises the fused state twice (module docstring); the check above
    # is against its forward without that; this pins that the difference is that and only that
    assert own > 1e-3, "modelopt's forward now matches the engines' reading: update the docstring and README"
    assert made["out"]["input_layernorm_spread"] > 0  # trained off its initial ones
    assert torch.equal(heads.to_target_ids(logits.argmax(-1)), made["out"]["target_ids"])
    print(
        f"modelopt export imported: max |diff| {diff:.2e} (engines' reading), {own:.2e} (modelopt's own forward)"
    )


def our_training_loss(
    heads, target, tokens: torch.Tensor, steps: int, decay: float, out_of_vocab: str
) -> float:
    """Our EAGLE-3 loss on modelopt's loss batch. modelopt also trains each row's last position, whose label is
    the target's distribution after the row's last token; ours trains position t only where x_{t+2} exists,
    so the rows get one more token (causal: no feature or logit before it changes)."""
    rows = torch.cat([tokens, torch.zeros_like(tokens[:, :1])], dim=1)
    out = target(rows, capture=heads.capture_layers)
    positions = torch.arange(rows.shape[1]).expand_as(rows)
    with torch.no_grad():
        loss, _ = eagle3_loss(heads, out.hidden, rows, torch.ones_like(rows), positions, out.logits,
                              target.embed_tokens, steps=steps, decay=decay, out_of_vocab=out_of_vocab)  # fmt: skip
    return loss.item()


def test_our_eagle3_loss_is_modelopts_on_its_weights_and_batch(made, tmp_path):
    """Our training-time-test loss with modelopt's settings (its 3 steps, its step decay, every position
    trained: `eagle3_out_of_vocab: train`) equals its own training loss on the same weights and tokens, read
    as the engines read its layer. With our default (positions whose target token the draft vocabulary lacks
    left untrained) it does not: with a 100-token draft vocabulary most positions are such. Checked to 1e-5
    relative (measured: 3e-7, modelopt's 1e-5 added to its denominators)."""
    heads, target = imported(made, made["work"] / "eagle3", tmp_path / "native")
    out = made["out"]
    theirs = out["loss_engine_norm"]["loss"]
    args = (heads, target, out["loss_tokens"], out["ttt_steps"], out["loss_decay"])
    ours = our_training_loss(*args, "train")
    assert ours == pytest.approx(theirs, rel=1e-5), (ours, theirs)
    skipped = our_training_loss(*args, "skip")
    assert abs(skipped - theirs) > 10 * 1e-5 * theirs  # measured: 8e-4 relative (a near-uniform draft)
    print(
        f"modelopt's training loss {theirs:.6f}, ours {ours:.6f} (out-of-vocabulary positions skipped: {skipped:.6f})"
    )


def test_modelopt_heads_decode_identically_to_generate(made, tmp_path):
    heads, target = imported(made, made["work"] / "eagle3", tmp_path / "native")
    drafter = EagleDrafter(heads, target, top_k=4, depth=3, total_tokens=12)
    prompt = torch.randint(0, 256, (1, 6), generator=torch.Generator().manual_seed(0))
    out = SpeculativeDecoder(target, drafter).generate(prompt, max_new_tokens=20)
    reference = target.model.generate(prompt, max_new_tokens=20, do_sample=False)[:, 6:]
    assert torch.equal(out.tokens, reference), (out.tokens.tolist(), reference.tolist())


def test_modelopt_default_export_writes_yarn_that_import_reads_as_written(made, tmp_path):
    """modelopt's default `eagle_export_rope_scaling` writes YaRN (factor 32) into the config of a draft
    trained without it; the engines, and our import, apply it, so the drafts are no longer the trained ones."""
    config = json.loads((made["work"] / "eagle3-default-rope" / "config.json").read_text())
    assert config["rope_scaling"]["rope_type"] == "yarn"
    heads, target = imported(made, made["work"] / "eagle3-default-rope", tmp_path / "native")
    layer = heads.config.layer_config
    rope = layer.get("rope_parameters") or layer.get("rope_scaling") or {}
    assert rope.get("rope_type") == "yarn" and rope.get("factor") == 32.0, layer
    with pytest.raises(AssertionError) as failed:
        check_drafts(heads, target, made)
    print(f"modelopt default (YaRN) export: {str(failed.value).splitlines()[0]}")


# -- exports broken on purpose ----------------------------------------------------------------------


def shift_layer_id(path: Path) -> None:
    """The last aux layer one up: modelopt 2 -> 3 (HF 4, the output after the final norm)."""
    config = json.loads((path / "config.json").read_text())
    config["eagle_config"]["eagle_aux_hidden_state_layer_ids"][-1] += 1
    (path / "config.json").write_text(json.dumps(config))


def unshift_layer_id(path: Path) -> None:
    """The first aux layer one down: modelopt 0 -> -1 (HF 0, the embeddings)."""
    config = json.loads((path / "config.json").read_text())
    config["eagle_config"]["eagle_aux_hidden_state_layer_ids"][0] -= 1
    (path / "config.json").write_text(json.dumps(config))


def rename_key(path: Path) -> None:
    tensors = load_file(str(path / "model.safetensors"))
    tensors["layers.0.mlp.up.weight"] = tensors.pop("layers.0.mlp.up_proj.weight")
    save_file(tensors, str(path / "model.safetensors"))


def swap_norms(path: Path) -> None:
    a, b = "layers.0.input_layernorm.weight", "layers.0.hidden_norm.weight"
    edit_weights(path, lambda t: t.update({a: t[b], b: t[a]}))


def test_the_check_fails_on_a_modelopt_export_with_its_norms_swapped(made, tmp_path):
    export = copy_export(made, tmp_path)
    swap_norms(export)
    heads, target = imported(made, export, tmp_path / "native")  # still imports: only the check can tell
    with pytest.raises(AssertionError) as failed:
        check_drafts(heads, target, made)
    print(f"swap_norms: {str(failed.value).splitlines()[0][:160]}")


@pytest.mark.parametrize(
    ("breakage", "why"),
    [(shift_layer_id, r"\[1, 2, 4\]"), (unshift_layer_id, r"\[0, 2, 3\]"), (rename_key, "up_proj")],
    ids=["shift_layer_id", "unshift_layer_id", "rename_key"],
)
def test_import_refuses_a_modelopt_export_broken_on_purpose(made, tmp_path, capsys, breakage, why):
    """On a 4-layer target (1, 2, 3) are the only 3 capturable HF layers: any id shifted by one names the
    embeddings or the normed output, and import-heads refuses it, as it refuses a renamed key."""
    export = copy_export(made, tmp_path)
    breakage(export)
    args = [
        "import-heads",
        "--format",
        "eagle3",
        "--checkpoint",
        str(export),
        "--target",
        str(made["target_dir"]),
    ]
    capsys.readouterr()
    assert cli([*args, "--out", str(tmp_path / "native")]) == 1
    error = capsys.readouterr().err
    assert re.search(why, error), error
    print(f"{breakage.__name__}: {error.strip()[-200:]}")
