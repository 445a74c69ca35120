"""`specheads train` of EAGLE / EAGLE-3 heads on tiny random targets of other families (Qwen3, Qwen3-MoE,
Mixtral, Phi-3, Gemma-3 text), brought as HF directories: the recipe's default draft_arch (llama) trains a
Llama draft layer online, the checkpoint records it, `specheads export` writes the engines' formats, and
the trained head decodes as the target's generate()."""

import json
from pathlib import Path

import pytest
import torch

from specheads.cli import main as cli_main
from specheads.core.target import FrozenTarget
from specheads.decode import SpeculativeDecoder, default_tree
from specheads.decode.eagle_drafter import EagleDrafter
from specheads.heads import MedusaConfig, MedusaHeads, load_heads, save_heads
from specheads.methods import methods
from specheads.train.checkpointing import check_resumable
from specheads.train.recipe import load_config

from helpers import OTHER_FAMILIES, save_tiny_target, tiny_model, train_with_qwen3_8b_recipe

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("families")
    return {f: save_tiny_target(f, root / f, **overrides) for f, overrides in OTHER_FAMILIES.items()}


def train(recipe: str, target: Path, data: Path, out: Path, *extra: str) -> list[dict]:
    args = [
        str(REPO / "recipes" / "tiny" / recipe),
        f"target={target}",
        f"data={data}",
        "max_length=64",
        "batch_size=8",
        "lr=0.01",
        "optimizer=adamw",
        "warmup_steps=1",
        "max_steps=8",
        "eval_fraction=0.1",
        "eval_data=[]",
        "eval_every=8",
        "eval_batches=1",
        "log_every=4",
        f"output_dir={out}",
        *extra,
    ]
    assert cli_main(["train", *args, "--no-progress"]) == 0
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def greedy_equals_generate(target: FrozenTarget, drafter) -> list[int]:
    accepted = []
    for seed in (1, 2):
        prompt = torch.tensor([list(b"abcdefghij0123"[seed:])])  # the training text's bytes
        out = SpeculativeDecoder(target, drafter).generate(prompt, max_new_tokens=24)
        reference = target.model.generate(prompt, max_new_tokens=24, do_sample=False)[:, prompt.shape[1] :]
        assert torch.equal(out.tokens, reference), prompt.tolist()
        accepted += out.accept_lengths
    return accepted


def exports(heads: Path, target_dir: Path, out: Path, formats: tuple[str, ...]) -> None:
    for fmt in formats:
        flags = ["--target", str(target_dir)] if fmt == "speculators" else []
        args = ["export", "--heads", str(heads), "--format", fmt, "--out", str(out / fmt), *flags]
        assert cli_main(args) == 0
        layer = json.loads((out / fmt / "config.json").read_text())
        layer = layer.get("transformer_layer_config", layer)
        assert (layer["model_type"], layer["num_hidden_layers"]) == ("llama", 1)


@pytest.mark.parametrize("family", sorted(OTHER_FAMILIES))
def test_eagle3_trains_a_llama_draft_over_every_family(family_dirs, text_data, tmp_path, family):
    target_dir = family_dirs[family]
    out = tmp_path / "eagle3"
    metrics = train("eagle3.yaml", target_dir, text_data, out, "ttt_steps=2", "draft_vocab_size=200")
    steps = [m for m in metrics if m["split"] == "train"]
    assert [m["step"] for m in steps] == [4, 8] and steps[-1]["loss"] < steps[0]["loss"]
    target = FrozenTarget.from_pretrained(str(target_dir), dtype="float32")
    head, config = load_heads(out, target, methods=methods())
    assert config["head_config"]["draft_arch"] == "llama"
    assert type(head.layer).__name__ == "LlamaDecoderLayer" and type(head.layer.mlp).__name__ == "LlamaMLP"
    assert head.layer.mlp.gate_proj.out_features == target.config.intermediate_size
    assert config["training"]["eagle3"]["draft_arch"] == "llama"
    exports(out, target_dir, tmp_path / "exports", ("eagle3", "speculators"))
    greedy_equals_generate(target, EagleDrafter(head.eval(), target, top_k=4, depth=4, total_tokens=16))


@pytest.mark.parametrize("family", ["qwen3_moe", "gemma3_text"])
def test_eagle_trains_a_llama_draft(family_dirs, text_data, tmp_path, family):
    target_dir = family_dirs[family]
    out = tmp_path / "eagle"
    metrics = train("eagle.yaml", target_dir, text_data, out, "fc_bias=false")
    steps = [m for m in metrics if m["split"] == "train"]
    assert steps[-1]["feature_loss"] < steps[0]["feature_loss"]
    target = FrozenTarget.from_pretrained(str(target_dir), dtype="float32")
    head, config = load_heads(out, target, methods=methods())
    assert config["head_config"]["draft_arch"] == "llama" and type(head.layer).__name__ == "LlamaDecoderLayer"
    exports(out, target_dir, tmp_path / "exports", ("eagle",))
    greedy_equals_generate(target, EagleDrafter(head.eval(), target, default_tree("medusa-15")))


def test_draft_arch_target_trains_the_targets_family_and_its_export_is_refused(
    family_dirs, text_data, tmp_path, capsys
):
    target_dir = family_dirs["qwen3"]
    out = tmp_path / "eagle3"
    train(
        "eagle3.yaml", target_dir, text_data, out, "ttt_steps=1", "draft_vocab_size=200", "draft_arch=target"
    )
    head, config = load_heads(
        out, FrozenTarget.from_pretrained(str(target_dir), dtype="float32"), methods=methods()
    )
    assert (
        config["head_config"]["draft_arch"] == "target" and type(head.layer).__name__ == "Qwen3DecoderLayer"
    )
    capsys.readouterr()
    args = ["export", "--heads", str(out), "--format", "eagle3", "--out", str(tmp_path / "eagle3-export")]
    assert cli_main(args) != 0
    assert "Train the head with draft_arch: llama" in capsys.readouterr().err
    assert not (tmp_path / "eagle3-export").exists()


@pytest.mark.parametrize("family", ["phi3", "qwen3_moe"])
def test_offline_training_of_a_llama_draft_logs_the_online_losses(family_dirs, text_data, tmp_path, family):
    """From a hidden-state cache, the Llama draft of a Phi-3 or Qwen3-MoE target (final norms of their own
    RMSNorm classes, which start the draft's LlamaRMSNorm: draft_head_init=target) trains as online: the
    first step's losses agree, before any update could part them."""
    target_dir = family_dirs[family]
    extra = ("ttt_steps=2", "draft_vocab_size=200", "draft_head_init=target", "max_steps=2", "log_every=1")
    args = [
        str(REPO / "recipes" / "tiny" / "eagle3.yaml"),
        f"target={target_dir}",
        f"data={text_data}",
        "max_length=64",
        "batch_size=8",
        "optimizer=adamw",
        "eval_fraction=0.1",
        "eval_data=[]",
        "eval_every=2",
        "eval_batches=1",
        *extra,
    ]
    cache = tmp_path / "cache"
    assert cli_main(["cache", *args, "--out", str(cache), "--dtype", "float32", "--no-progress"]) == 0
    runs = {}
    for mode in ("online", "offline"):
        more = ["mode=offline", f"cache_dir={cache}"] if mode == "offline" else []
        assert cli_main(["train", *args, *more, f"output_dir={tmp_path / mode}", "--no-progress"]) == 0
        runs[mode] = [
            json.loads(line) for line in (tmp_path / mode / "metrics.jsonl").read_text().splitlines()
        ]
        recorded = json.loads((tmp_path / mode / "config.json").read_text())["head_config"]
        assert recorded["draft_arch"] == "llama"
    first = {mode: records[0] for mode, records in runs.items()}
    for key in ("loss", "step0/top1", "step1/top1"):
        assert first["online"][key] == pytest.approx(first["offline"][key], rel=1e-4, abs=1e-6), key


@pytest.fixture
def fresh_accelerator_state():
    """The recipe's bf16 autocast needs an accelerate state of its own in this process (earlier runs made
    one without); reset before and after."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


@pytest.mark.usefixtures("fresh_accelerator_state")
def test_the_qwen3_8b_eagle3_recipe_trains_a_llama_draft_that_exports(tmp_path):
    """recipes/qwen3-8b/eagle3.yaml as written (bf16 target and autocast, layers (2, 18, 33), chat data
    with assistant-only loss), on a tiny random 36-layer Qwen3 and a few chat rows for a few steps: the
    head is a Llama draft and exports to eagle3 and speculators with the recipe's layer ids."""
    target_dir = save_tiny_target("qwen3", tmp_path / "qwen3-36", num_hidden_layers=36)
    out = train_with_qwen3_8b_recipe(target_dir, tmp_path)
    config = json.loads((out / "config.json").read_text())
    assert config["head_config"]["draft_arch"] == "llama"
    assert config["head_config"]["layer_config"]["model_type"] == "llama"
    exports(out, target_dir, tmp_path / "exports", ("eagle3", "speculators"))
    for fmt in ("eagle3", "speculators"):
        written = json.loads((tmp_path / "exports" / fmt / "config.json").read_text())
        assert written["eagle_aux_hidden_state_layer_ids"] == [2, 18, 33]


def test_resuming_a_run_written_before_draft_arch_needs_draft_arch_target(tmp_path):
    """A checkpoint's config without draft_arch holds the target's own layer: resuming it as a Llama draft
    is refused with the key to set; a Medusa run's is not concerned."""
    target = FrozenTarget(tiny_model("qwen3"))
    save_heads(MedusaHeads(MedusaConfig(64, 264, num_heads=1)), tmp_path / "ckpt", target.record())
    table = methods()
    for method in ("eagle", "eagle3", "medusa"):
        cfg = load_config(None, {"method": method}, methods=table)
        old = cfg.to_dict()
        old.get(method, {}).pop("draft_arch", None)  # as written before the key existed
        state = {"num_processes": 1, "config": old}
        if method == "medusa":
            check_resumable(state, cfg, 1, target.record(), tmp_path / "ckpt", method=table[method])
            continue
        with pytest.raises(ValueError, match=rf"{method}.draft_arch: checkpoint 'target', this run 'llama'"):
            check_resumable(state, cfg, 1, target.record(), tmp_path / "ckpt", method=table[method])
        as_before = load_config(None, {"method": method, method: {"draft_arch": "target"}}, methods=table)
        # the recipes agree; the check goes on to the heads (Medusa heads here, which it then refuses)
        with pytest.raises(ValueError, match="unknown method 'medusa'"):
            check_resumable(state, as_before, 1, target.record(), tmp_path / "ckpt", method=table[method])
