"""Engine formats: export -> import is exact, the written keys and config fields are the published ones,
and heads a format cannot express are refused with nothing written."""

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from specheads.core.target import FrozenTarget
from specheads.heads import (
    Eagle3Config,
    Eagle3Head,
    EagleConfig,
    EagleHead,
    MedusaConfig,
    MedusaHeads,
    layer_config_from,
    save_heads,
)
from specheads.heads.formats import FORMATS, FormatError, export_heads, format_method, import_heads
from specheads.heads.formats import io as formats_io
from specheads.methods import methods

from helpers import perturbed, tiny_model, tiny_tokenizer

H, V, VD, T = 64, 264, 100, 7
K, L = 3, 2  # Medusa heads and blocks per head

# -- the published layouts, written out ------------------------------------------------------------

# FasterDecoding/Medusa medusa_model.py v0.1 (TGI layers/medusa.py, TensorRT-LLM medusa/weight.py)
MEDUSA_FILE_KEYS = sorted(
    [f"{h}.{b}.linear.{p}" for h in range(K) for b in range(L) for p in ("weight", "bias")]
    + [f"{h}.{L}.weight" for h in range(K)]
)
# vLLM model_executor/models/medusa.py
VLLM_MEDUSA_FILE_KEYS = sorted(
    [f"blocks.{h}.layers.{b}.{p}" for h in range(K) for b in range(L) for p in ("weight", "bias")]
    + [f"lm_heads.{h}.weight" for h in range(K)]
)
LLAMA_LAYER_KEYS = [
    "mlp.down_proj.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "post_attention_layernorm.weight",
    "self_attn.k_proj.weight",
    "self_attn.o_proj.weight",
    "self_attn.q_proj.weight",
    "self_attn.v_proj.weight",
]
# EAGLE cnets1.py / SGLang llama_eagle.py: fc with bias, one layer without input_layernorm
EAGLE_FILE_KEYS = sorted(["fc.weight", "fc.bias", *(f"layers.0.{k}" for k in LLAMA_LAYER_KEYS)])
EAGLE3_LAYER_KEYS = [*LLAMA_LAYER_KEYS, "input_layernorm.weight", "hidden_norm.weight"]
# SGLang llama_eagle3.py / EAGLE cnets.py
EAGLE3_FILE_KEYS = sorted(
    [
        "fc.weight",
        "norm.weight",
        "lm_head.weight",
        "d2t",
        "t2d",
        *(f"midlayer.{k}" for k in EAGLE3_LAYER_KEYS),
    ]
)
# speculators Eagle3 (vLLM renames midlayer. to layers.0. itself)
SPECULATORS_FILE_KEYS = sorted(
    [
        "fc.weight",
        "norm.weight",
        "lm_head.weight",
        "d2t",
        "t2d",
        *(f"layers.0.{k}" for k in EAGLE3_LAYER_KEYS),
    ]
)
EAGLE3_SHAPES = {
    "fc.weight": (H, 3 * H),
    "midlayer.self_attn.q_proj.weight": (H, 2 * H),
    "midlayer.self_attn.k_proj.weight": (32, 2 * H),  # 2 KV heads x 16
    "midlayer.self_attn.o_proj.weight": (H, H),
    "lm_head.weight": (VD, H),
    "d2t": (VD,),
    "t2d": (V,),
}


# -- fixtures --------------------------------------------------------------------------------------


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def target():
    tokenizer = tiny_tokenizer()
    return FrozenTarget(
        tiny_model("llama", vocab_size=len(tokenizer)), tokenizer, name_or_path="org/tiny-llama"
    )


def make_heads(method, target, share_lm_head=False, layers=(1, 2, 3), family_target=None):
    torch.manual_seed(0)
    if method == "medusa":
        heads = MedusaHeads(MedusaConfig(H, V, num_heads=K, num_layers=L, share_lm_head=share_lm_head))
        if not share_lm_head:
            heads.init_lm_heads_from(target.lm_head)
        return perturbed(heads)
    layer_config = layer_config_from((family_target or target).config)
    if method == "eagle":
        return perturbed(EagleHead(EagleConfig(layer_config)))
    head = Eagle3Head(Eagle3Config(layer_config, draft_vocab_size=VD, target_layers=layers))
    head.set_draft_vocab(torch.randperm(V, generator=torch.Generator().manual_seed(1))[:VD].sort().values)
    return perturbed(head)


def native(tmp_path, method, target, **kw):
    path = tmp_path / f"native-{method}"
    save_heads(make_heads(method, target, **kw), path, target.record(), training={"ttt_steps": 5})
    return path


def outputs(heads, target):
    """Everything the heads compute on a fixed input (logits, features, mapped ids)."""
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, 256, (1, T + 1), generator=g)
    if heads.method == "medusa":
        hidden = target(tokens, capture=(-1,)).hidden[target.num_layers]
        return [heads(hidden, target.lm_head)]
    features = target(tokens[:, :T], capture=heads.capture_layers).hidden
    embeds = target.embed_tokens(tokens[:, 1:])
    mask = torch.zeros(T, T).masked_fill(
        ~torch.ones(T, T, dtype=torch.bool).tril(), torch.finfo(torch.float32).min
    )
    out = heads(heads.input_hidden(features), embeds, torch.arange(T)[None], mask[None, None])
    logits = heads.logits(out, target.lm_head)
    return [out, logits, heads.to_target_ids(logits.argmax(-1))]


METHOD_OF = {fmt: format_method(fmt, methods=methods()) for fmt in FORMATS}


def export(src, fmt, out, **kw):
    """export_heads; EAGLE heads here keep their (nonzero, perturbed) fc bias, which `eagle` refuses by
    default (test_export_defects.py), so that the round trips carry it."""
    if fmt == "eagle":
        kw.setdefault("fc_bias", "keep")
    return export_heads(src, fmt, out, **kw, methods=methods())


# -- round trips -----------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_export_then_import_is_bit_exact(tmp_path, target, fmt):
    """Every tensor and every output of the imported heads equals the original's (torch.equal)."""
    src = native(tmp_path, METHOD_OF[fmt], target)
    export(src, fmt, tmp_path / "engine")
    back = import_heads(tmp_path / "engine", fmt, target, tmp_path / "back")
    original = make_heads(METHOD_OF[fmt], target)
    assert original.state_dict().keys() == back.state_dict().keys()
    for key, value in original.state_dict().items():
        assert torch.equal(value, back.state_dict()[key]), key
    with torch.no_grad():
        for a, b in zip(outputs(original, target), outputs(back, target), strict=True):
            assert torch.equal(a, b)
    # the native checkpoint records the target and where the heads came from
    config = json.loads((tmp_path / "back" / "config.json").read_text())
    assert config["target"] == target.record().to_dict()
    assert config["training"]["imported_from"]["format"] == fmt


@pytest.mark.parametrize("fmt", ["eagle", "eagle3"])
def test_mistral_heads_round_trip_through_the_llama_layer(tmp_path, fmt):
    """A Mistral decoder layer is a Llama layer key for key: it exports, and imports back exactly."""
    mistral = FrozenTarget(tiny_model("mistral", vocab_size=V))
    head = make_heads(fmt, mistral)
    save_heads(head, tmp_path / "native", mistral.record())
    export(tmp_path / "native", fmt, tmp_path / "engine")
    back = import_heads(tmp_path / "engine", fmt, mistral, tmp_path / "back")
    assert back.config.layer_config["model_type"] == "llama"
    with torch.no_grad():
        for a, b in zip(outputs(head, mistral), outputs(back, mistral), strict=True):
            assert torch.equal(a, b)


@pytest.mark.parametrize("fmt", ["medusa", "vllm-medusa"])
def test_shared_lm_head_needs_the_target_and_then_writes_its_copies(tmp_path, target, fmt):
    src = native(tmp_path, "medusa", target, share_lm_head=True)
    with pytest.raises(FormatError, match="share the target's lm_head.*pass --target"):
        export(src, fmt, tmp_path / "refused")
    assert not (tmp_path / "refused").exists()
    export(src, fmt, tmp_path / "engine", target=target)
    if fmt == "vllm-medusa":  # one copy in all, as vLLM's original_lm_head reads it; medusa: one per head
        config, tensors = written(tmp_path / "engine", "model.safetensors")
        assert config["original_lm_head"] is True
        assert [k for k in tensors if k.startswith("lm_heads.")] == ["lm_heads.0.weight"]
    else:
        _, tensors = written(tmp_path / "engine", "medusa_lm_head.safetensors")
        assert all(f"{h}.{L}.weight" in tensors for h in range(K))
    back = import_heads(tmp_path / "engine", fmt, target, tmp_path / "back")
    assert not back.config.share_lm_head
    for h in range(K):
        assert torch.equal(back.lm_heads[h].weight, target.lm_head.weight)
    shared = make_heads("medusa", target, share_lm_head=True)
    with torch.no_grad():
        assert torch.equal(outputs(shared, target)[0], outputs(back, target)[0])


# -- the written layouts ---------------------------------------------------------------------------


def written(path, weights_file):
    return json.loads((path / "config.json").read_text()), load_file(str(path / weights_file))


def test_medusa_layout(tmp_path, target):
    export(native(tmp_path, "medusa", target), "medusa", tmp_path / "out")
    config, tensors = written(tmp_path / "out", "medusa_lm_head.safetensors")
    assert sorted(tensors) == MEDUSA_FILE_KEYS
    assert tensors["0.0.linear.weight"].shape == (H, H) and tensors[f"2.{L}.weight"].shape == (V, H)
    assert {k: config[k] for k in ("medusa_num_heads", "medusa_num_layers", "base_model_name_or_path")} == {
        "medusa_num_heads": K,
        "medusa_num_layers": L,
        "base_model_name_or_path": "org/tiny-llama",
    }
    # TGI (layers/speculative.py) turns speculation off when config.json names architectures
    assert "architectures" not in config
    # readable by an engine running as another user (mkdtemp and safetensors write private modes)
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "out").stat().st_mode & 0o777 == 0o777 & ~umask
    for f in (tmp_path / "out").iterdir():
        assert f.stat().st_mode & 0o777 == 0o666 & ~umask, f.name


def test_vllm_medusa_layout(tmp_path, target):
    export(native(tmp_path, "medusa", target), "vllm-medusa", tmp_path / "out")
    config, tensors = written(tmp_path / "out", "model.safetensors")
    assert sorted(tensors) == VLLM_MEDUSA_FILE_KEYS
    expected = {
        "model_type": "medusa",
        "architectures": ["MedusaModel"],
        "num_heads": K,
        "num_hidden_layers": L,
        "hidden_size": H,
        "vocab_size": V,
        "medusa_fc_bias": True,
        "original_lm_head": False,  # heads with their own lm_heads: one each
    }
    assert {k: config[k] for k in expected} == expected
    # vLLM's MedusaConfig.from_pretrained renames every top-level key holding "num" and "heads"/"layers"
    assert [k for k in config if "num" in k] == ["num_heads", "num_hidden_layers"]


def test_eagle_layout(tmp_path, target):
    export(native(tmp_path, "eagle", target), "eagle", tmp_path / "out")
    config, tensors = written(tmp_path / "out", "model.safetensors")
    assert sorted(tensors) == EAGLE_FILE_KEYS
    assert tensors["fc.weight"].shape == (H, 2 * H) and tensors["layers.0.self_attn.q_proj.weight"].shape == (
        H,
        H,
    )
    expected = {
        "architectures": ["LlamaForCausalLMEagle"],  # a kept nonzero fc bias: SGLang's name only, not vLLM's
        "model_type": "llama",
        "num_hidden_layers": 1,
        "hidden_size": H,
        "vocab_size": V,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "attention_bias": False,
        "tie_word_embeddings": False,
    }
    assert {k: config[k] for k in expected} == expected
    assert "bias" not in config  # SGLang / vLLM read `bias` as attention bias


def test_eagle_without_fc_bias_writes_a_zero_bias(tmp_path, target):
    head = perturbed(EagleHead(EagleConfig(layer_config_from(target.config), fc_bias=False)))
    save_heads(head, tmp_path / "native", target.record())
    result = export(tmp_path / "native", "eagle", tmp_path / "out")
    assert result.notes == []  # only a nonzero bias differs between engines
    config, _ = written(tmp_path / "out", "model.safetensors")
    assert config["architectures"] == ["LlamaForCausalLMEagle", "LlamaForCausalLM"]  # SGLang's, then vLLM's
    _, tensors = written(tmp_path / "out", "model.safetensors")
    assert torch.equal(tensors["fc.bias"], torch.zeros(H))
    back = import_heads(tmp_path / "out", "eagle", target, tmp_path / "back")
    assert not back.config.fc_bias and "fc.bias" not in back.state_dict()


@pytest.mark.parametrize("fmt", ["eagle3", "speculators"])
def test_eagle3_layouts(tmp_path, target, fmt):
    export(native(tmp_path, "eagle3", target), fmt, tmp_path / "out")
    config, tensors = written(tmp_path / "out", "model.safetensors")
    assert sorted(tensors) == (EAGLE3_FILE_KEYS if fmt == "eagle3" else SPECULATORS_FILE_KEYS)
    prefix = "midlayer." if fmt == "eagle3" else "layers.0."
    for key, shape in EAGLE3_SHAPES.items():
        assert tuple(tensors[key.replace("midlayer.", prefix)].shape) == shape, key
    assert tensors["d2t"].dtype == torch.int64 and tensors["t2d"].dtype == torch.bool
    head = make_heads("eagle3", target)
    assert torch.equal(torch.arange(VD) + tensors["d2t"], head.to_target_ids(torch.arange(VD)))
    assert int(tensors["t2d"].sum()) == VD
    layer = config if fmt == "eagle3" else config["transformer_layer_config"]
    assert (layer["model_type"], layer["num_hidden_layers"], layer["tie_word_embeddings"]) == (
        "llama",
        1,
        False,
    )
    assert config["draft_vocab_size"] == VD
    # eagle3: absent, or the EAGLE repo skips loading the target's embedding (test_export_defects.py)
    assert config.get("target_hidden_size") == (None if fmt == "eagle3" else H)
    assert config["norm_before_residual"] is False  # vLLM's speculators loader defaults it to true
    # HF hidden_states ids (1, 2, 3): vLLM reads them as they are, SGLang adds one to its own
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    if fmt == "eagle3":
        assert config["architectures"] == ["LlamaForCausalLMEagle3"]
        assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]
        assert "bias" not in config
    else:
        assert config["speculators_model_type"] == "eagle3"
        spec = config["speculators_config"]
        assert spec["algorithm"] == "eagle3" and spec["default_proposal_method"] == "greedy"
        assert spec["proposal_methods"][0]["speculative_tokens"] == 5  # the training-time-test steps
        assert spec["verifier"] == {"name_or_path": "org/tiny-llama", "architectures": ["LlamaForCausalLM"]}


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_provenance_in_every_export(tmp_path, target, fmt):
    method = METHOD_OF[fmt]
    export(native(tmp_path, method, target), fmt, tmp_path / "out")
    record = json.loads((tmp_path / "out" / "config.json").read_text())["specheads_provenance"]
    assert record["target"] == target.record().to_dict()
    assert record["specheads_version"] and record["format"] == fmt and record["method"] == method
    if method != "medusa":
        assert record["capture_layers"] == list(make_heads(method, target).capture_layers)
        assert "hidden_states indexing" in record["capture_layers_indexing"]
    if method == "eagle3":
        assert record["draft_vocab_size"] == VD
        assert record["layer_ids"]["sglang_eagle_config"] == [0, 1, 2]


@pytest.mark.parametrize("fmt", ["eagle", "eagle3"])
def test_llama_configs_parse_in_transformers_with_unknown_keys_kept(tmp_path, target, fmt):
    """SGLang and vLLM read these configs through transformers: it must build a LlamaConfig of the one
    draft layer and keep the keys it does not know (eagle_config, provenance) instead of failing."""
    from transformers import AutoConfig

    export(native(tmp_path, METHOD_OF[fmt], target), fmt, tmp_path / "out")
    config = AutoConfig.from_pretrained(tmp_path / "out")
    assert type(config).__name__ == "LlamaConfig"
    assert (config.hidden_size, config.num_hidden_layers, config.vocab_size) == (H, 1, V)
    assert config.specheads_provenance["format"] == fmt
    if fmt == "eagle3":
        assert config.eagle_config["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]


def test_dtype_casts_weights_not_vocab_maps(tmp_path, target):
    export(native(tmp_path, "eagle3", target), "eagle3", tmp_path / "out", dtype=torch.bfloat16)
    _, tensors = written(tmp_path / "out", "model.safetensors")
    assert tensors["fc.weight"].dtype == torch.bfloat16 and tensors["lm_head.weight"].dtype == torch.bfloat16
    assert tensors["d2t"].dtype == torch.int64 and tensors["t2d"].dtype == torch.bool


# -- refusals: nothing is written ------------------------------------------------------------------


def refused(tmp_path, src, fmt, match, **kw):
    out = tmp_path / "refused"
    with pytest.raises(FormatError, match=match):
        export(src, fmt, out, **kw)
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left


def test_refuses_heads_of_another_method(tmp_path, target):
    refused(tmp_path, native(tmp_path, "medusa", target), "eagle3", "holds eagle3 heads.*medusa heads")
    refused(tmp_path, native(tmp_path, "eagle3", target), "eagle", "holds eagle heads.*eagle3 heads")


def test_refuses_eagle1_in_speculators(tmp_path, target):
    refused(
        tmp_path, native(tmp_path, "eagle", target), "speculators", "speculators_model_type 'eagle3' only"
    )


@pytest.mark.parametrize("layers", [(1, 2, 4), (0, 2, 3)])
def test_refuses_eagle3_layers_engines_cannot_capture(tmp_path, target, layers):
    """HF id L is after the final norm and 0 the embeddings: engines capture streams entering layers 1..L-1."""
    src = native(tmp_path, "eagle3", target, layers=layers)
    for fmt in ("eagle3", "speculators"):
        refused(tmp_path, src, fmt, r"must be 3 ids in 1\.\.3")


def test_refuses_a_non_llama_draft_layer(tmp_path, target):
    qwen2 = FrozenTarget(tiny_model("qwen2", vocab_size=V))  # q/k/v biases: no Llama layer holds them
    head = make_heads("eagle", target, family_target=qwen2)
    save_heads(head, tmp_path / "qwen2-eagle", qwen2.record())
    refused(tmp_path, tmp_path / "qwen2-eagle", "eagle", "'qwen2' layer")


def test_refuses_inconsistent_draft_vocabulary(tmp_path, target):
    head = make_heads("eagle3", target)
    head.t2d[head.t2d.nonzero()[0]] = False  # one draft token no longer marked in t2d
    save_heads(head, tmp_path / "bad", target.record())
    refused(tmp_path, tmp_path / "bad", "eagle3", "t2d does not mark exactly")


def test_a_draft_vocabulary_in_frequency_order_imports_as_the_same_head(tmp_path, target):
    """Model Optimizer's calibration writes d2t most frequent first (the engines read any order): the import
    sorts lm_head's rows with it, so every draft token keeps its logit and the head equals the original."""
    export(native(tmp_path, "eagle3", target), "eagle3", tmp_path / "engine")
    config, tensors = written(tmp_path / "engine", "model.safetensors")
    perm = torch.randperm(VD, generator=torch.Generator().manual_seed(0))
    ids = torch.arange(VD) + tensors["d2t"]
    tensors["d2t"] = ids[perm] - torch.arange(VD)
    tensors["lm_head.weight"] = tensors["lm_head.weight"][perm]
    assert (tensors["d2t"][1:] + torch.arange(1, VD) < tensors["d2t"][:-1] + torch.arange(VD - 1)).any()
    save_file(tensors, tmp_path / "engine" / "model.safetensors")
    back = import_heads(tmp_path / "engine", "eagle3", target, tmp_path / "back")
    original = make_heads("eagle3", target)
    for key, value in original.state_dict().items():
        assert torch.equal(value, back.state_dict()[key]), key
    # an id given twice is still refused, not sorted
    tensors["d2t"][1] = tensors["d2t"][0] - 1
    save_file(tensors, tmp_path / "engine" / "model.safetensors")
    with pytest.raises(FormatError, match="strictly ascending"):
        import_heads(tmp_path / "engine", "eagle3", target, tmp_path / "back2")


def test_refuses_an_existing_output(tmp_path, target):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not an empty directory"):
        export(native(tmp_path, "eagle", target), "eagle", out)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_a_failure_while_writing_leaves_nothing(tmp_path, target, monkeypatch):
    def half_written(tensors, filename, metadata=None):
        open(filename, "wb").write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(formats_io, "save_file", half_written)
    with pytest.raises(OSError, match="disk full"):
        export(native(tmp_path, "eagle", target), "eagle", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
