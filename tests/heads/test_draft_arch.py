"""draft_arch: EAGLE / EAGLE-3 heads with a Llama draft layer over targets of other families (Qwen3,
Qwen3-MoE, Mixtral, Phi-3, Gemma-3 text). The layer is sized from the target's config; every family's
heads export to eagle, eagle3 and speculators with the files a Llama target's heads give, import back
exactly, and decode as the target's generate(). Heads of the target's own family ("target") keep
today's behaviour, and head configs written before draft_arch was recorded load as it."""

import copy
import json

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from specheads.core.target import FrozenTarget
from specheads.decode import SpeculativeDecoder, default_tree
from specheads.decode.eagle_drafter import EagleDrafter
from specheads.heads import (
    Eagle3Config,
    Eagle3Head,
    EagleConfig,
    EagleHead,
    draft_layer_config,
    layer_config_from,
    llama_layer_config_from,
    load_heads,
    save_heads,
)
from specheads.heads.eagle3 import rms_norm_state_like
from specheads.heads.formats import FormatError, export_heads, import_heads
from specheads.methods import methods
from specheads.train.recipe import load_config

from helpers import OTHER_FAMILIES, causal_mask, perturbed, tiny_config, tiny_model, tiny_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")

V = len(tiny_tokenizer())
T = 7
VD = 100
FAMILIES = sorted(OTHER_FAMILIES)
FORMAT_METHOD = {"eagle": "eagle", "eagle3": "eagle3", "speculators": "eagle3"}


def family_target(family: str) -> FrozenTarget:
    return FrozenTarget(tiny_model(family, vocab_size=V, **OTHER_FAMILIES.get(family, {})), tiny_tokenizer())


@pytest.fixture(scope="module")
def targets() -> dict:
    return {family: family_target(family) for family in [*FAMILIES, "llama"]}


def llama_heads(method: str, target: FrozenTarget, seed: int = 0) -> nn.Module:
    """Perturbed heads with a Llama draft layer over `target` (as training would leave them)."""
    torch.manual_seed(seed)
    layer_config = draft_layer_config(target.config, "llama")
    if method == "eagle":
        return perturbed(EagleHead(EagleConfig(layer_config, draft_arch="llama", fc_bias=False)))
    head = Eagle3Head(
        Eagle3Config(layer_config, draft_arch="llama", draft_vocab_size=VD, target_layers=(1, 2, 3))
    )
    head.set_draft_vocab(torch.randperm(V, generator=torch.Generator().manual_seed(1))[:VD].sort().values)
    return perturbed(head)


def outputs(head: nn.Module, target: FrozenTarget) -> list[torch.Tensor]:
    """What the head computes on a fixed input (its output, logits and target ids)."""
    tokens = torch.randint(0, 256, (1, T + 1), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        features = target(tokens[:, :T], capture=head.capture_layers).hidden
        embeds = head.embed(target.embed_tokens, tokens[:, 1:])
        out = head(head.input_hidden(features), embeds, torch.arange(T)[None], causal_mask(T))
        logits = head.logits(out, target.lm_head)
    return [out, logits, head.to_target_ids(logits.argmax(-1))]


def exported(tmp_path, head: nn.Module, target: FrozenTarget, fmt: str, name: str):
    save_heads(head, tmp_path / f"{name}-native", target.record())
    export_heads(
        tmp_path / f"{name}-native",
        fmt,
        tmp_path / name,
        target=target if fmt == "speculators" else None,
        methods=methods(),
    )
    config = json.loads((tmp_path / name / "config.json").read_text())
    return config, load_file(str(tmp_path / name / "model.safetensors"))


# -- the Llama draft layer ------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_the_llama_layer_takes_the_targets_sizes(family):
    config = tiny_config(family, vocab_size=V, **OTHER_FAMILIES[family])
    layer = llama_layer_config_from(config)
    assert layer["model_type"] == "llama" and layer["hidden_act"] == "silu"
    assert not layer["attention_bias"] and not layer["mlp_bias"]
    expected = {
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,  # Qwen3-MoE: the dense width, not an expert's
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
        "rms_norm_eps": config.rms_norm_eps,
        "max_position_embeddings": config.max_position_embeddings,
        "vocab_size": V,
        "num_hidden_layers": 4,  # the target's: layer ids are read against it
        "eos_token_id": 257,
    }
    assert {k: layer[k] for k in expected} == expected
    theta = 1e6 if family in ("mixtral", "gemma3_text") else 1e4  # Gemma-3: its full-attention layers' theta
    assert layer["rope_parameters"] == {"rope_type": "default", "rope_theta": theta}
    if family == "qwen3_moe":
        assert layer["intermediate_size"] == 128 != config.moe_intermediate_size


def test_the_llama_layer_keeps_a_rope_scaling():
    config = tiny_config("qwen3", rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5})
    layer = llama_layer_config_from(config)
    assert layer["rope_parameters"] == {"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5}
    head = EagleHead(EagleConfig(layer, draft_arch="llama"))
    assert head.rotary_emb.rope_type == "linear"


@pytest.mark.parametrize(
    "family, overrides, rope_type, theta",
    [
        ("gpt_oss", dict(head_dim=16, num_local_experts=4), "yarn", 150000.0),
        ("gemma2", dict(head_dim=16), "default", 10000.0),
    ],
)
def test_configs_of_families_built_with_eager_attention_give_a_llama_layer(
    family, overrides, rope_type, theta
):
    """gpt-oss (YaRN rope, experts of the config's intermediate size) and Gemma-2 need eager attention in
    the target; their Llama draft layer is built from the config alone, its rope the target's."""
    config = tiny_config(family, **overrides)
    layer = llama_layer_config_from(config)
    assert (layer["rope_parameters"]["rope_type"], layer["rope_parameters"]["rope_theta"]) == (
        rope_type,
        theta,
    )
    assert layer["intermediate_size"] == config.intermediate_size and layer["hidden_act"] == "silu"
    head = Eagle3Head(Eagle3Config(layer, draft_arch="llama", draft_vocab_size=VD))
    assert head.rotary_emb.rope_type == rope_type and type(head.layer.mlp).__name__ == "LlamaMLP"


@pytest.mark.parametrize("family", FAMILIES)
def test_heads_of_every_family_are_llama_layers_and_the_moe_head_no_mixture(targets, family):
    target = targets[family]
    for method in ("eagle", "eagle3"):
        head = llama_heads(method, target)
        assert (
            type(head.layer).__name__ == "LlamaDecoderLayer" and type(head.layer.mlp).__name__ == "LlamaMLP"
        )
        assert not [n for n, _ in head.named_parameters() if "expert" in n or "router" in n or ".gate." in n]
    if family in ("qwen3_moe", "mixtral"):  # the target's own family: a draft that is a mixture of experts
        own = Eagle3Head(Eagle3Config(layer_config_from(target.config), draft_vocab_size=VD))
        assert any("expert" in n for n, _ in own.named_parameters())


def test_phi3_fused_qkv_refuses_a_target_layer_and_takes_a_llama_one(targets):
    target = targets["phi3"]
    with pytest.raises(TypeError, match="separate q/k/v projections.*draft_arch: llama"):
        Eagle3Head(Eagle3Config(layer_config_from(target.config), draft_vocab_size=VD))
    head = llama_heads("eagle3", target)
    assert head.layer.self_attn.q_proj.in_features == 2 * target.hidden_size


def test_a_config_without_the_sizes_is_refused_naming_draft_arch_target():
    class CustomConfig:  # a remote-code family that names its MLP width otherwise
        hidden_size, num_attention_heads, num_hidden_layers, vocab_size, ffn_dim = 64, 4, 4, 264, 128

    with pytest.raises(
        ValueError, match=r"CustomConfig has no \['intermediate_size'\]: train with draft_arch: target"
    ):
        llama_layer_config_from(CustomConfig())


def test_draft_arch_is_checked():
    llama = llama_layer_config_from(tiny_config("qwen3"))
    with pytest.raises(ValueError, match="draft_arch must be one of"):
        EagleConfig(llama, draft_arch="qwen")
    with pytest.raises(ValueError, match="needs a Llama layer config, got model_type 'qwen3'"):
        EagleConfig(layer_config_from(tiny_config("qwen3")), draft_arch="llama")
    with pytest.raises(ValueError, match="draft_arch must be one of"):
        draft_layer_config(tiny_config("qwen3"), "gemma")
    for method in ("eagle", "eagle3"):
        assert (
            load_config(None, {"method": method}, methods=methods()).settings.draft_arch == "llama"
        )  # new runs
        with pytest.raises(ValueError, match=rf"{method}.draft_arch must be one of .*, got 'qwen3'"):
            load_config(None, [f"method={method}", f"{method}.draft_arch=qwen3"], methods=methods())


# -- what a Llama draft reads from other families' targets -----------------------------------------


def test_a_llama_draft_reads_the_embedding_table_as_the_engines_do(targets):
    """Gemma scales its embeddings by sqrt(H) inside the model; the engines' draft reads the table."""
    target = targets["gemma3_text"]
    ids = torch.tensor([[5, 6, 7]])
    table = target.embed_tokens.weight[ids]
    assert not torch.equal(target.embed_tokens(ids), table)  # the target's scaled embedding
    assert torch.equal(llama_heads("eagle3", target).embed(target.embed_tokens, ids), table)
    own = EagleHead(EagleConfig(layer_config_from(target.config)))  # draft_arch target: as before
    assert torch.equal(own.embed(target.embed_tokens, ids), target.embed_tokens(ids))


@pytest.mark.parametrize("family", ["gemma3_text", "qwen3", "phi3"])
def test_eagle3_starts_its_llama_norm_from_the_targets_final_norm(targets, family):
    """Gemma's x·(1 + w), Qwen3's and Phi-3's own RMSNorm classes: the draft's LlamaRMSNorm computes the same."""
    target = targets[family]
    norm = perturbed(copy.deepcopy(target.norm))  # trained: off its initial ones (Gemma: zeros)
    head = llama_heads("eagle3", target)
    head.init_from_target(target.lm_head, norm)
    x = torch.randn(5, target.hidden_size)
    with torch.no_grad():
        assert torch.allclose(head.norm(x), norm(x), atol=1e-6, rtol=1e-5)
    assert torch.equal(head.lm_head.weight, target.lm_head.weight[head.vocab_target_ids()])


def test_a_norm_no_rms_norm_reproduces_is_refused(targets):
    head = llama_heads("eagle3", targets["qwen3"])
    before = head.norm.weight.clone()
    with pytest.raises(ValueError, match="not an RMSNorm.*draft_head_init: random"):
        head.init_from_target(targets["qwen3"].lm_head, perturbed(nn.LayerNorm(64)))
    assert torch.equal(head.norm.weight, before)
    with pytest.raises(ValueError, match="not an RMSNorm"):
        rms_norm_state_like(head.norm, nn.Identity())


# -- exports ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["eagle", "eagle3", "speculators"])
@pytest.mark.parametrize("family", FAMILIES)
def test_every_familys_export_is_a_llama_targets_and_imports_back_exactly(tmp_path, targets, family, fmt):
    """The export holds what a Llama target's heads of the same sizes export: the same tensor names and
    shapes, the same config keys, a Llama config transformers parses; and it imports back bit for bit."""
    from transformers import AutoConfig

    method, target = FORMAT_METHOD[fmt], targets[family]
    head = llama_heads(method, target)
    config, tensors = exported(tmp_path, head, target, fmt, "family")
    ref_config, ref_tensors = exported(
        tmp_path, llama_heads(method, targets["llama"]), targets["llama"], fmt, "llama"
    )
    assert {k: tuple(v.shape) for k, v in tensors.items()} == {
        k: tuple(v.shape) for k, v in ref_tensors.items()
    }
    assert {k: v.dtype for k, v in tensors.items()} == {k: v.dtype for k, v in ref_tensors.items()}
    assert set(config) == set(ref_config)
    layer = config if fmt != "speculators" else config["transformer_layer_config"]
    assert (layer["model_type"], layer["num_hidden_layers"], layer["hidden_act"]) == ("llama", 1, "silu")
    assert layer["head_dim"] == head.layer.self_attn.head_dim
    assert layer["rope_theta"] == head.config.layer_config["rope_parameters"]["rope_theta"]
    if fmt != "speculators":
        parsed = AutoConfig.from_pretrained(tmp_path / "family")
        assert (
            type(parsed).__name__ == "LlamaConfig"
            and parsed.intermediate_size == target.config.intermediate_size
        )
    if fmt == "speculators":
        assert torch.equal(tensors["embed_tokens.weight"], target.embed_tokens.weight)  # the table, unscaled
        assert config["speculators_config"]["verifier"]["architectures"] == [type(target.model).__name__]
    back = import_heads(tmp_path / "family", fmt, target, tmp_path / "back")
    assert back.config.draft_arch == "llama"
    assert head.state_dict().keys() == back.state_dict().keys()
    for key, value in head.state_dict().items():
        assert torch.equal(value, back.state_dict()[key]), key
    for a, b in zip(outputs(head, target), outputs(back, target), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("fmt", ["eagle", "eagle3", "speculators"])
def test_a_target_family_layer_still_refuses_to_export_and_names_draft_arch_llama(tmp_path, targets, fmt):
    target = targets["qwen3"]
    layer_config = layer_config_from(target.config)
    if fmt == "eagle":
        head = EagleHead(EagleConfig(layer_config, draft_arch="target", fc_bias=False))
    else:
        head = Eagle3Head(Eagle3Config(layer_config, draft_arch="target", draft_vocab_size=VD))
    save_heads(head, tmp_path / "native", target.record())
    with pytest.raises(FormatError, match="'qwen3' layer .*Train the head with draft_arch: llama"):
        export_heads(tmp_path / "native", fmt, tmp_path / "out", target=target, methods=methods())
    assert not (tmp_path / "out").exists()


# -- checkpoints -----------------------------------------------------------------------------------


def test_a_head_config_without_draft_arch_loads_as_the_targets_family(tmp_path, targets):
    """Checkpoints written before draft_arch was recorded hold the target's own layer: they load as it."""
    target = targets["qwen3"]
    torch.manual_seed(0)
    head = perturbed(Eagle3Head(Eagle3Config(layer_config_from(target.config), draft_vocab_size=VD)))
    save_heads(head, tmp_path / "old", target.record())
    path = tmp_path / "old" / "config.json"
    config = json.loads(path.read_text())
    assert config["head_config"].pop("draft_arch") == "target"
    path.write_text(json.dumps(config))
    loaded, _ = load_heads(tmp_path / "old", target, methods=methods())
    assert loaded.config.draft_arch == "target" and type(loaded.layer).__name__ == "Qwen3DecoderLayer"
    for a, b in zip(outputs(head, target), outputs(loaded, target), strict=True):
        assert torch.equal(a, b)


def test_a_llama_draft_arch_is_recorded_and_loads_back(tmp_path, targets):
    target = targets["qwen3_moe"]
    head = llama_heads("eagle3", target)
    save_heads(head, tmp_path / "new", target.record())
    recorded = json.loads((tmp_path / "new" / "config.json").read_text())["head_config"]
    assert recorded["draft_arch"] == "llama" and recorded["layer_config"]["model_type"] == "llama"
    loaded, _ = load_heads(tmp_path / "new", target, methods=methods())
    assert loaded.config == head.config and type(loaded.layer).__name__ == "LlamaDecoderLayer"


# -- decoding --------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
@pytest.mark.parametrize("family", FAMILIES)
def test_llama_heads_over_every_family_decode_as_generate(targets, family, method):
    target = targets[family]
    head = llama_heads(method, target).eval()
    drafter = (
        EagleDrafter(head, target, top_k=4, depth=4, total_tokens=16)
        if method == "eagle3"
        else EagleDrafter(head, target, default_tree("medusa-15"))
    )
    decoder = SpeculativeDecoder(target, drafter)
    for seed in (1, 2):
        prompt = torch.randint(0, 256, (1, 9), generator=torch.Generator().manual_seed(seed))
        out = decoder.generate(prompt, max_new_tokens=20)
        reference = target.model.generate(prompt, max_new_tokens=20, do_sample=False)[:, 9:]
        assert torch.equal(out.tokens, reference), (family, method, prompt.tolist())
