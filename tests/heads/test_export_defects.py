"""Defects a consumer's own loader found in our exports, each pinned here.

- EAGLE-3 layer ids: engines capture each layer once, ascending; the default must give three distinct
  ascending ids even on shallow targets, and anything else is refused (recipe, head config, export).
- `eagle3` config without `target_hidden_size`: with it, the EAGLE repo's cnets.py `Model` skips loading
  the target's embedding and expects the draft's own, which the export does not carry.
- `eagle` with a nonzero fc bias: vLLM's EAGLE layer has no fc bias and silently skips it, so the export
  refuses such heads (naming the recipe key) unless told to keep the bias (SGLang only) or drop it.
- `speculators` carries the target's embedding when given the target: speculators 0.9.0's from_pretrained
  leaves a missing one uninitialised (tests/consumers/ loads it with the library itself).
- `vllm-medusa` says that vLLM 0.33.0 has no MedusaModel (scripts/check_engines.py audits its wheel).
- `medusa` writes medusa_lm_head.pt too: FasterDecoding's `MedusaModel.from_pretrained` reads only it.
"""

import json

import pytest
import torch
from safetensors.torch import load_file

from specheads.cli import main
from specheads.core.target import FrozenTarget
from specheads.heads import (
    Eagle3Config,
    Eagle3Head,
    EagleConfig,
    EagleHead,
    MedusaConfig,
    MedusaHeads,
    default_eagle3_layers,
    layer_config_from,
    save_heads,
)
from specheads.heads.formats import FormatError, export_heads, import_heads
from specheads.heads.formats.eagle3 import check_layer_ids
from specheads.methods import methods
from specheads.train.config import TrainConfig
from specheads.train.recipe import check_method

from helpers import tiny_config, tiny_model, tiny_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def target():
    tokenizer = tiny_tokenizer()
    return FrozenTarget(tiny_model("llama", vocab_size=len(tokenizer)), tokenizer, name_or_path="org/tiny")


# -- EAGLE-3 layer ids -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "num_layers, expected",
    [(4, (1, 2, 3)), (5, (1, 2, 4)), (6, (1, 3, 5)), (7, (2, 3, 4)), (8, (2, 4, 5)), (32, (2, 16, 29))],
)
def test_default_layers_are_distinct_ascending_and_capturable(num_layers, expected):
    """(2, L//2, L-3) (vLLM, SGLang, SpecForge) from L = 7; below it repeats a layer, so (1, L//2, L-1)."""
    layers = default_eagle3_layers(num_layers)
    assert layers == expected
    assert list(layers) == sorted(set(layers)) and 1 <= layers[0] and layers[-1] <= num_layers - 1
    assert check_layer_ids(list(layers), num_layers, "default") == list(layers)  # exportable as it is


def test_default_layers_refuse_a_target_too_shallow():
    with pytest.raises(ValueError, match="3-layer target"):
        default_eagle3_layers(3)


def test_the_tiny_target_default_head_exports(tmp_path, target):
    """The 4-layer tiny target's default head once fused (2, 2, 1); now it exports as it trains."""
    head = Eagle3Head(Eagle3Config(layer_config_from(target.config), draft_vocab_size=100))
    assert head.capture_layers == (1, 2, 3)
    save_heads(head, tmp_path / "native", target.record())
    export_heads(tmp_path / "native", "eagle3", tmp_path / "out", methods=methods())
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]


@pytest.mark.parametrize("layers", [(3, 1, 2), (1, 2, 2), (2, 1, 3)])
def test_unordered_or_repeated_layers_are_refused_everywhere(tmp_path, target, layers):
    with pytest.raises(ValueError, match=r"eagle3.layers \[.*\] must be distinct and ascending"):
        check_method(TrainConfig(method="eagle3", settings={"layers": list(layers)}), methods())
    bad = rf"EAGLE-3 layer ids \[{layers[0]}, {layers[1]}, {layers[2]}\] must be distinct and ascending"
    with pytest.raises(ValueError, match=bad):
        Eagle3Config(layer_config_from(tiny_config("llama")), draft_vocab_size=10, target_layers=layers)
    with pytest.raises(FormatError, match=bad):
        check_layer_ids(list(layers), 4, "export")
    # a checkpoint written before the check (its config edited here) is refused by the export too
    save_heads(
        Eagle3Head(Eagle3Config(layer_config_from(target.config), draft_vocab_size=100)),
        tmp_path / "native",
        target.record(),
    )
    config_file = tmp_path / "native" / "config.json"
    config = json.loads(config_file.read_text())
    config["head_config"]["target_layers"] = list(layers)
    config_file.write_text(json.dumps(config))
    with pytest.raises(FormatError, match=bad):
        export_heads(tmp_path / "native", "eagle3", tmp_path / "out", methods=methods())
    assert not (tmp_path / "out").exists()


def test_mixed_sign_recipe_ids_wait_for_the_target():
    """[2, 16, -3] names ascending layers of a 32-layer target: the recipe cannot tell before the target."""
    cfg = TrainConfig(method="eagle3", settings={"layers": [2, 16, -3]})
    check_method(cfg, methods())
    assert cfg.settings.layers == [2, 16, -3]


# -- eagle3 and the EAGLE repo's embedding -----------------------------------------------------------


def test_eagle3_export_leaves_target_hidden_size_out(tmp_path, target):
    """SafeAILab/EAGLE eagle/model/cnets.py: `if load_emb and not hasattr(config, "target_hidden_size")`
    loads the target's embed_tokens; with the key it keeps a random one unless the checkpoint has
    embed_tokens.weight. Our export has no embedding, so the key must be absent (the engines and cnets fall
    back to hidden_size, which is the target's: check_flags refuses any other width on import)."""
    head = Eagle3Head(Eagle3Config(layer_config_from(target.config), draft_vocab_size=100))
    save_heads(head, tmp_path / "native", target.record())
    export_heads(tmp_path / "native", "eagle3", tmp_path / "out", methods=methods())
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert "target_hidden_size" not in config and config["hidden_size"] == target.hidden_size
    weights = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert not any("embed_tokens" in k for k in weights)  # hence: cnets must load the target's


# -- eagle and vLLM's missing fc bias ----------------------------------------------------------------


def biased_eagle(tmp_path, target):
    head = EagleHead(EagleConfig(layer_config_from(target.config), fc_bias=True))  # the tiny recipe's
    with torch.no_grad():
        head.fc.bias.normal_(0, 0.1, generator=torch.Generator().manual_seed(0))
    save_heads(head, tmp_path / "native", target.record())
    return head, tmp_path / "native"


def test_eagle_refuses_a_nonzero_fc_bias_naming_the_recipe_key(tmp_path, target, capsys):
    _, src = biased_eagle(tmp_path, target)
    with pytest.raises(FormatError, match=r"recipe key fc_bias: true.*vLLM.*--fc-bias keep.*--fc-bias drop"):
        export_heads(src, "eagle", tmp_path / "out", methods=methods())
    assert not (tmp_path / "out").exists()
    assert main(["export", "--heads", str(src), "--format", "eagle", "--out", str(tmp_path / "cli")]) == 1
    assert "fc_bias" in capsys.readouterr().err and not (tmp_path / "cli").exists()
    args = [
        "export",
        "--heads",
        str(src),
        "--format",
        "eagle3",
        "--out",
        str(tmp_path / "x"),
        "--fc-bias",
        "keep",
    ]
    assert main(args) == 2  # eagle only


def test_eagle_keeps_the_bias_for_sglang_only(tmp_path, target):
    """Kept: SGLang's architecture name alone, which vLLM's EAGLEConfig turns into an unknown
    EagleLlamaForCausalLMEagle, so vLLM refuses the directory instead of dropping the bias."""
    head, src = biased_eagle(tmp_path, target)
    export_heads(src, "eagle", tmp_path / "out", fc_bias="keep", methods=methods())
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle"]
    assert torch.equal(
        load_file(str(tmp_path / "out" / "model.safetensors"))["fc.bias"], head.fc.bias.detach()
    )
    back = import_heads(tmp_path / "out", "eagle", target, tmp_path / "back")
    assert torch.equal(back.fc.bias, head.fc.bias)


def test_eagle_drops_the_bias_when_told(tmp_path, target):
    _, src = biased_eagle(tmp_path, target)
    assert (
        main(
            [
                "export",
                "--heads",
                str(src),
                "--format",
                "eagle",
                "--out",
                str(tmp_path / "out"),
                "--fc-bias",
                "drop",
            ]
        )
        == 0
    )
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle", "LlamaForCausalLM"]  # every engine
    assert not load_file(str(tmp_path / "out" / "model.safetensors"))["fc.bias"].any()


# -- medusa: FasterDecoding reads a .pt ------------------------------------------------------------


def test_medusa_export_writes_the_torch_file_fasterdecoding_reads(tmp_path, target):
    """medusa_model.py v0.1 `from_pretrained`: torch.load(DIR/medusa_lm_head.pt), then
    `medusa_head.load_state_dict(..., strict=False)`: the same tensors as the safetensors file."""
    heads = MedusaHeads(MedusaConfig(target.hidden_size, target.vocab_size, num_heads=2, num_layers=1))
    save_heads(heads, tmp_path / "native", target.record())
    export_heads(tmp_path / "native", "medusa", tmp_path / "out", methods=methods())
    pt = torch.load(tmp_path / "out" / "medusa_lm_head.pt", map_location="cpu", weights_only=True)
    st = load_file(str(tmp_path / "out" / "medusa_lm_head.safetensors"))
    assert (
        pt.keys()
        == st.keys()
        == {
            "0.0.linear.weight",
            "0.0.linear.bias",
            "0.1.weight",
            "1.0.linear.weight",
            "1.0.linear.bias",
            "1.1.weight",
        }
    )
    assert all(torch.equal(pt[k], st[k]) for k in st)


def test_speculators_carries_the_target_embedding_when_given_the_target(tmp_path, target):
    head = Eagle3Head(Eagle3Config(layer_config_from(target.config), draft_vocab_size=100))
    save_heads(head, tmp_path / "native", target.record())
    with_target = export_heads(
        tmp_path / "native", "speculators", tmp_path / "a", target=target, methods=methods()
    )
    assert with_target.notes == []
    written = load_file(str(tmp_path / "a" / "model.safetensors"))
    assert torch.equal(written["embed_tokens.weight"], target.embed_tokens.weight)
    without = export_heads(tmp_path / "native", "speculators", tmp_path / "b", methods=methods())
    assert "embed_tokens.weight" not in load_file(str(tmp_path / "b" / "model.safetensors"))
    assert "pass --target" in without.notes[0]


def test_vllm_medusa_export_says_current_vllm_cannot_load_it(tmp_path, target):
    heads = MedusaHeads(MedusaConfig(target.hidden_size, target.vocab_size, num_heads=2, num_layers=1))
    save_heads(heads, tmp_path / "native", target.record())
    export = export_heads(tmp_path / "native", "vllm-medusa", tmp_path / "out", methods=methods())
    assert "vLLM 0.33.0 ships no MedusaModel" in export.notes[0]
