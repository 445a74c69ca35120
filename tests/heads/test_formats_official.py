"""Official checkpoints, written here by hand from the published layouts with random weights, import
into heads that compute what the official definitions compute and decode to the target's own greedy
output; the CLI wraps both directions; malformed checkpoints are refused with errors that say why."""

import json
import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from specheads.cli import main
from specheads.core.target import FrozenTarget
from specheads.decode import EagleDrafter, MedusaDrafter, SpeculativeDecoder, default_tree
from specheads.heads import load_heads
from specheads.heads.formats import FormatError, import_heads
from specheads.methods import methods

T = 9  # positions in the reference checks
PROMPT_LEN, NEW_TOKENS = 6, 16


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def target_dir(tiny_target_dirs):
    return tiny_target_dirs["llama"]


@pytest.fixture(scope="module")
def target(target_dir):
    return FrozenTarget.from_pretrained(str(target_dir), dtype="float32")


def rand(g, *shape, scale=0.08, dtype=torch.float16):
    return (scale * torch.randn(*shape, generator=g)).to(dtype)


def norm_weight(g, n, dtype=torch.float16):
    return (1 + 0.1 * torch.randn(n, generator=g)).to(dtype)


# A draft layer whose sizes differ from the target's (MLP width, norm eps, rope base), as official heads may.
DRAFT = dict(
    hidden_size=64,
    intermediate_size=96,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-5,
    rope_theta=50000.0,
    max_position_embeddings=512,
    hidden_act="silu",
)


def llama_layer(g, prefix, attention_input, dtype=torch.float16):
    """A Llama decoder layer's weights under the names every EAGLE checkpoint uses."""
    h, i, q, kv = 64, DRAFT["intermediate_size"], 64, 32
    return {
        f"{prefix}self_attn.q_proj.weight": rand(g, q, attention_input, dtype=dtype),
        f"{prefix}self_attn.k_proj.weight": rand(g, kv, attention_input, dtype=dtype),
        f"{prefix}self_attn.v_proj.weight": rand(g, kv, attention_input, dtype=dtype),
        f"{prefix}self_attn.o_proj.weight": rand(g, h, q, dtype=dtype),
        f"{prefix}mlp.gate_proj.weight": rand(g, i, h, dtype=dtype),
        f"{prefix}mlp.up_proj.weight": rand(g, i, h, dtype=dtype),
        f"{prefix}mlp.down_proj.weight": rand(g, h, i, dtype=dtype),
        f"{prefix}post_attention_layernorm.weight": norm_weight(g, h, dtype=dtype),
    }


def write_eagle1(path, target, seed=0):
    """yuhuili/EAGLE-* layout: Llama config (+ `bias`), pytorch_model.bin with embed_tokens, fc, layers.0."""
    g = torch.Generator().manual_seed(seed)
    path.mkdir()
    tensors = {
        "embed_tokens.weight": target.embed_tokens.weight.detach().half(),
        "fc.weight": rand(g, 64, 128),
        "fc.bias": rand(g, 64),
        **llama_layer(g, "layers.0.", 64),
    }
    torch.save(tensors, path / "pytorch_model.bin")
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "bias": True, **DRAFT}
    config.update(num_hidden_layers=1, vocab_size=target.vocab_size, torch_dtype="float16")
    (path / "config.json").write_text(json.dumps(config))
    return tensors, config


def write_eagle3(path, target, sglang_ids, draft_vocab=120, seed=0, drop=(), **config_overrides):
    """SpecForge / SGLang `LlamaForCausalLMEagle3` layout: midlayer.*, d2t, t2d, model.safetensors."""
    g = torch.Generator().manual_seed(seed)
    path.mkdir()
    vocab = target.vocab_size
    ids = torch.randperm(vocab, generator=g)[:draft_vocab].sort().values  # ascending target ids
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[ids] = True
    tensors = {
        "fc.weight": rand(g, 64, 192, dtype=torch.bfloat16),
        **llama_layer(g, "midlayer.", 128, dtype=torch.bfloat16),
        "midlayer.input_layernorm.weight": norm_weight(g, 64, dtype=torch.bfloat16),
        "midlayer.hidden_norm.weight": norm_weight(g, 64, dtype=torch.bfloat16),
        "norm.weight": norm_weight(g, 64, dtype=torch.bfloat16),
        "lm_head.weight": rand(g, draft_vocab, 64, scale=0.3, dtype=torch.bfloat16),
        "d2t": ids - torch.arange(draft_vocab),
        "t2d": t2d,
    }
    tensors = {k: v for k, v in tensors.items() if k not in drop}
    save_file(tensors, str(path / "model.safetensors"))
    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", **DRAFT}
    config.update(
        num_hidden_layers=1, vocab_size=vocab, draft_vocab_size=draft_vocab, tie_word_embeddings=False
    )
    config["eagle_config"] = {
        "eagle_aux_hidden_state_layer_ids": list(sglang_ids),
        "use_aux_hidden_state": True,
    }
    config.update(config_overrides)
    (path / "config.json").write_text(json.dumps(config))
    return tensors, config


def write_medusa(path, target, heads=3, layers=2, seed=0, lm_heads=True, vocab=None, config_layers=None):
    """FasterDecoding Medusa v0.1: medusa_lm_head.pt with {h}.{l}.linear.* and {h}.{layers}.weight."""
    g = torch.Generator().manual_seed(seed)
    path.mkdir()
    tensors = {}
    for h in range(heads):
        for layer in range(layers):
            tensors[f"{h}.{layer}.linear.weight"] = rand(g, 64, 64)
            tensors[f"{h}.{layer}.linear.bias"] = rand(g, 64)
        if lm_heads:
            tensors[f"{h}.{layers}.weight"] = rand(g, vocab or target.vocab_size, 64, scale=0.3)
    torch.save(tensors, path / "medusa_lm_head.pt")
    config = {"medusa_num_heads": heads, "medusa_num_layers": config_layers or layers}
    config["base_model_name_or_path"] = "lmsys/vicuna-7b-v1.3"
    (path / "config.json").write_text(json.dumps(config))
    return tensors


# -- the official definitions, from the raw tensors ------------------------------------------------


def rms(x, w, eps):
    return w.float() * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope(x, theta):
    """Llama rotary embedding at positions 0..T-1 on x (heads, T, d)."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2).float() / d)
    freqs = torch.arange(x.shape[1]).float()[:, None] * inv[None]
    cos, sin = torch.cat([freqs, freqs], -1).cos(), torch.cat([freqs, freqs], -1).sin()
    return x * cos + torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1) * sin


def llama_layer_ref(w, p, attn_in, residual):
    """residual + attention(attn_in), then + MLP(post norm): the engines' Llama draft layer, causal."""
    n = attn_in.shape[0]
    q = (attn_in @ w[f"{p}self_attn.q_proj.weight"].float().T).view(n, 4, 16).transpose(0, 1)
    k = (attn_in @ w[f"{p}self_attn.k_proj.weight"].float().T).view(n, 2, 16).transpose(0, 1)
    v = (attn_in @ w[f"{p}self_attn.v_proj.weight"].float().T).view(n, 2, 16).transpose(0, 1)
    q, k = rope(q, DRAFT["rope_theta"]), rope(k, DRAFT["rope_theta"])
    k, v = k.repeat_interleave(2, 0), v.repeat_interleave(2, 0)
    scores = (q @ k.transpose(1, 2)) / math.sqrt(16)
    scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    attended = (scores.softmax(-1) @ v).transpose(0, 1).reshape(n, 64) @ w[
        f"{p}self_attn.o_proj.weight"
    ].float().T
    h = residual + attended
    x = rms(h, w[f"{p}post_attention_layernorm.weight"], DRAFT["rms_norm_eps"])
    gate, up = x @ w[f"{p}mlp.gate_proj.weight"].float().T, x @ w[f"{p}mlp.up_proj.weight"].float().T
    return h + (F.silu(gate) * up) @ w[f"{p}mlp.down_proj.weight"].float().T


def target_states(target, tokens):
    with torch.no_grad():
        out = target.model(tokens, output_hidden_states=True)
    return out.hidden_states  # HF indexing: 0 = embeddings, L = after the final norm


def head_logits(head, target, tokens):
    """Our imported head over positions 0..T-1 (feature t with the embedding of token t+1)."""
    features = target(tokens[:, :T], capture=head.capture_layers).hidden
    embeds = target.embed_tokens(tokens[:, 1 : T + 1])
    mask = torch.zeros(T, T).masked_fill(
        ~torch.ones(T, T, dtype=torch.bool).tril(), torch.finfo(torch.float32).min
    )
    out = head(head.input_hidden(features), embeds, torch.arange(T)[None], mask[None, None])
    return head.logits(out, target.lm_head)[0]


def tokens_for(target, seed=0):
    return torch.randint(0, 256, (1, T + 1), generator=torch.Generator().manual_seed(seed))


def greedy_equal(target, drafter, seed=0):
    prompt = torch.randint(0, 256, (1, PROMPT_LEN), generator=torch.Generator().manual_seed(seed))
    out = SpeculativeDecoder(target, drafter).generate(prompt, max_new_tokens=NEW_TOKENS)
    reference = target.model.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False)[:, PROMPT_LEN:]
    assert torch.equal(out.tokens, reference), (out.tokens.tolist(), reference.tolist())
    assert out.tokens.shape[1] == 1 + sum(out.accept_lengths)


def cli_import(fmt, checkpoint, target_dir, out):
    args = ["import-heads", "--format", fmt, "--checkpoint", str(checkpoint), "--target", str(target_dir)]
    assert main([*args, "--out", str(out)]) == 0
    return out


# -- official layouts in, greedy output out --------------------------------------------------------


def test_official_eagle1_imports_computes_the_reference_and_decodes(tmp_path, target, target_dir):
    w, _ = write_eagle1(tmp_path / "EAGLE-llama", target)
    native = cli_import("eagle", tmp_path / "EAGLE-llama", target_dir, tmp_path / "native")
    head, config = load_heads(native, target, methods=methods())  # what `specheads eval --heads` does
    assert config["method"] == "eagle" and head.capture_layers == (target.num_layers,)
    tokens = tokens_for(target)
    with torch.no_grad():
        f = target_states(target, tokens[:, :T])[-1][0]  # last hidden state after the final norm
        x = (
            torch.cat([target.embed_tokens(tokens[0, 1:]), f], -1) @ w["fc.weight"].float().T
            + w["fc.bias"].float()
        )
        ref = target.lm_head(llama_layer_ref(w, "layers.0.", x, x))  # no input norm on layer 0
        torch.testing.assert_close(head_logits(head, target, tokens), ref, rtol=1e-4, atol=1e-4)
    greedy_equal(target, EagleDrafter(head, target, default_tree("medusa-15")))


def test_eagle_checkpoint_with_another_embedding_warns(tmp_path, target):
    """The EAGLE repo drafts with the checkpoint's own embed_tokens, the engines and we with the target's:
    a copy that is not the target's (made for another target of the same shape) is named; the target's
    own embedding stored in fp16 (what the official releases ship) is not."""
    write_eagle1(tmp_path / "same", target)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        import_heads(tmp_path / "same", "eagle", target, tmp_path / "same-out")
    other = tmp_path / "other"
    write_eagle1(other, target)
    tensors = torch.load(other / "pytorch_model.bin")
    tensors["embed_tokens.weight"] = tensors["embed_tokens.weight"] * 1.01
    torch.save(tensors, other / "pytorch_model.bin")
    with pytest.warns(UserWarning, match=r"embed_tokens.weight is not the target's \(max \|diff\|"):
        import_heads(other, "eagle", target, tmp_path / "other-out")


def test_official_eagle3_imports_computes_the_reference_and_decodes(tmp_path, target, target_dir):
    sglang_ids = [0, 1, 2]  # SGLang's numbering: it captures layers val + 1 (HF hidden_states 1, 2, 3)
    w, _ = write_eagle3(tmp_path / "EAGLE3-llama", target, sglang_ids)
    native = cli_import("eagle3", tmp_path / "EAGLE3-llama", target_dir, tmp_path / "native")
    head, _ = load_heads(native, target, methods=methods())
    assert head.capture_layers == (1, 2, 3) and head.draft_vocab_size == 120
    tokens = tokens_for(target, seed=1)
    with torch.no_grad():
        states = target_states(target, tokens[:, :T])
        g = torch.cat([states[i + 1][0] for i in sglang_ids], -1) @ w["fc.weight"].float().T
        emb = target.embed_tokens(tokens[0, 1:])
        eps = DRAFT["rms_norm_eps"]
        x = torch.cat(
            [
                rms(emb, w["midlayer.input_layernorm.weight"], eps),
                rms(g, w["midlayer.hidden_norm.weight"], eps),
            ],
            -1,
        )
        h = llama_layer_ref(w, "midlayer.", x, g)  # the residual is the raw fused feature
        ref = rms(h, w["norm.weight"], eps) @ w["lm_head.weight"].float().T
        logits = head_logits(head, target, tokens)
        torch.testing.assert_close(logits, ref, rtol=1e-4, atol=1e-4)
        draft = logits.argmax(-1)
        assert torch.equal(head.to_target_ids(draft), draft + w["d2t"][draft])
    greedy_equal(target, EagleDrafter(head, target, top_k=4, depth=3, total_tokens=12), seed=1)


def test_official_medusa_imports_computes_the_reference_and_decodes(tmp_path, target, target_dir):
    w = write_medusa(tmp_path / "medusa-vicuna", target)
    native = cli_import("medusa", tmp_path / "medusa-vicuna", target_dir, tmp_path / "native")
    heads, _ = load_heads(native, target, methods=methods())
    tokens = tokens_for(target, seed=2)
    with torch.no_grad():
        f = target_states(target, tokens)[-1]
        logits = heads(f)
        for h in range(3):
            x = f
            for layer in range(2):
                lin = w[f"{h}.{layer}.linear.weight"].float(), w[f"{h}.{layer}.linear.bias"].float()
                x = x + F.silu(x @ lin[0].T + lin[1])
            torch.testing.assert_close(logits[h], x @ w[f"{h}.2.weight"].float().T, rtol=1e-4, atol=1e-4)
    greedy_equal(target, MedusaDrafter(heads, default_tree("medusa-15", num_heads=3)), seed=2)


def test_medusa_v0_without_lm_heads_shares_the_targets(tmp_path, target):
    write_medusa(tmp_path / "legacy", target, lm_heads=False)
    heads = import_heads(tmp_path / "legacy", "medusa", target, tmp_path / "native")
    assert heads.config.share_lm_head and heads.lm_heads is None


def test_vllm_medusa_without_bias_and_with_one_lm_head(tmp_path, target):
    """vLLM's defaults: medusa_fc_bias false (no bias tensors), original_lm_head (one shared lm_head)."""
    g = torch.Generator().manual_seed(0)
    path = tmp_path / "vllm-medusa"
    path.mkdir()
    tensors = {f"blocks.{h}.layers.0.weight": rand(g, 64, 64) for h in range(2)}
    tensors["lm_heads.0.weight"] = rand(g, target.vocab_size, 64)
    save_file(tensors, str(path / "model.safetensors"))
    config = {"model_type": "medusa", "num_heads": 2, "num_hidden_layers": 1, "original_lm_head": True}
    (path / "config.json").write_text(
        json.dumps(config | {"hidden_size": 64, "vocab_size": target.vocab_size})
    )
    heads = import_heads(path, "vllm-medusa", target, tmp_path / "native")
    assert torch.equal(heads.blocks[1][0].linear.bias, torch.zeros(64))
    assert torch.equal(heads.lm_heads[1].weight, tensors["lm_heads.0.weight"].float())


def test_eagle3_layer_ids_agree_between_sglang_and_vllm_keys(tmp_path, target):
    write_eagle3(tmp_path / "both", target, [0, 1, 2], eagle_aux_hidden_state_layer_ids=[1, 2, 3])
    assert import_heads(tmp_path / "both", "eagle3", target, tmp_path / "a").capture_layers == (1, 2, 3)
    write_eagle3(tmp_path / "vllm-only", target, [], eagle_aux_hidden_state_layer_ids=[1, 2, 3])
    assert import_heads(tmp_path / "vllm-only", "eagle3", target, tmp_path / "b").capture_layers == (1, 2, 3)
    # engines capture ascending: a head whose config lists its layers in another order is refused
    write_eagle3(tmp_path / "unordered", target, [], eagle_aux_hidden_state_layer_ids=[3, 2, 1])
    with pytest.raises(FormatError, match=r"\[3, 2, 1\] must be distinct and ascending"):
        import_heads(tmp_path / "unordered", "eagle3", target, tmp_path / "c")


def test_eagle3_over_the_whole_vocabulary_needs_no_d2t(tmp_path, target):
    write_eagle3(tmp_path / "full", target, [0, 1, 2], draft_vocab=target.vocab_size, drop=("d2t", "t2d"))
    head = import_heads(tmp_path / "full", "eagle3", target, tmp_path / "native")
    assert torch.equal(head.to_target_ids(torch.arange(target.vocab_size)), torch.arange(target.vocab_size))


def test_eagle3_in_model_optimizer_names_imports_as_the_midlayer_one(tmp_path, target):
    """NVIDIA Model Optimizer 0.47.0's export_speculative_decoding names the layer layers.0.* (its eagle_module
    keys without the prefix; vLLM reads both) and writes no t2d: the same heads as the midlayer.* file
    (tests/consumers/test_modelopt.py runs Model Optimizer itself). Both names at once are refused."""
    w, config = write_eagle3(tmp_path / "midlayer", target, [0, 1, 2])
    reference = import_heads(tmp_path / "midlayer", "eagle3", target, tmp_path / "a")
    (tmp_path / "modelopt").mkdir()
    renamed = {k.replace("midlayer.", "layers.0."): v for k, v in w.items() if k != "t2d"}
    save_file(renamed, str(tmp_path / "modelopt" / "model.safetensors"))
    (tmp_path / "modelopt" / "config.json").write_text(json.dumps(config))
    head = import_heads(tmp_path / "modelopt", "eagle3", target, tmp_path / "b")
    ours, theirs = reference.state_dict(), head.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    save_file(
        {**renamed, "midlayer.norm_extra.weight": w["norm.weight"].clone()},
        str(tmp_path / "modelopt" / "model.safetensors"),
    )
    with pytest.raises(FormatError, match="midlayer.self_attn.q_proj.weight"):
        import_heads(tmp_path / "modelopt", "eagle3", target, tmp_path / "c")


# -- refused imports -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(drop=("d2t",)), "no d2t, but the head drafts over 120 of the target's 264 tokens"),
        (dict(hidden_size=32), "32 wide, the target's hidden size is 64"),
        (dict(eagle_aux_hidden_state_layer_ids=[2, 2, 3]), "name different layers"),
        (dict(norm_before_residual=True), "norm_before_residual: true"),
        (dict(num_hidden_layers=2), "2 draft layers"),
    ],
)
def test_malformed_eagle3_is_refused(tmp_path, target, kwargs, match):
    drop = kwargs.pop("drop", ())
    write_eagle3(tmp_path / "ck", target, [0, 1, 2], drop=drop, **kwargs)
    with pytest.raises(FormatError, match=match):
        import_heads(tmp_path / "ck", "eagle3", target, tmp_path / "native")
    assert not (tmp_path / "native").exists()


def test_eagle3_ids_past_the_last_capturable_layer_are_refused(tmp_path, target):
    write_eagle3(tmp_path / "ck", target, [1, 2, 3])  # SGLang 3 is HF 4: after the final norm of 4 layers
    with pytest.raises(FormatError, match=r"\[2, 3, 4\].*must be 3 ids in 1\.\.3"):
        import_heads(tmp_path / "ck", "eagle3", target, tmp_path / "native")


def test_speculators_without_explicit_norm_before_residual_is_refused(tmp_path, target):
    """vLLM reads a missing norm_before_residual as true, the speculators library as false."""
    w, config = write_eagle3(tmp_path / "eagle3", target, [0, 1, 2])
    path = tmp_path / "spec"
    path.mkdir()
    save_file({k.replace("midlayer.", "layers.0."): v for k, v in w.items()}, str(path / "model.safetensors"))
    layer = {
        k: v for k, v in config.items() if k not in ("eagle_config", "architectures", "draft_vocab_size")
    }
    spec = {"speculators_model_type": "eagle3", "transformer_layer_config": layer, "draft_vocab_size": 120}
    (path / "config.json").write_text(json.dumps(spec | {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}))
    with pytest.raises(FormatError, match="norm_before_residual is not set"):
        import_heads(path, "speculators", target, tmp_path / "native")
    (path / "config.json").write_text(json.dumps(spec | {"norm_before_residual": False}))
    head = import_heads(path, "speculators", target, tmp_path / "native")
    # no ids: our default, (2, L//2, L-3) from L = 7; this 4-layer target's (1, 2, 3) (the engines'
    # (2, 2, 1) would repeat a layer)
    assert head.capture_layers == (1, 2, 3)


def test_medusa_layers_or_vocabulary_that_do_not_match_are_refused(tmp_path, target):
    write_medusa(tmp_path / "layers", target, layers=2, config_layers=1)
    with pytest.raises(FormatError, match="medusa_num_layers 1, head 0 has 2 residual blocks"):
        import_heads(tmp_path / "layers", "medusa", target, tmp_path / "a")
    write_medusa(tmp_path / "vocab", target, vocab=target.vocab_size + 8)
    with pytest.raises(FormatError, match=r"0\.2\.weight is \(272, 64\), expected \(264, 64\)"):
        import_heads(tmp_path / "vocab", "medusa", target, tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


# -- the CLI ---------------------------------------------------------------------------------------


def test_cli_round_trip_reproduces_the_official_files(tmp_path, target, target_dir):
    """official -> import-heads -> export (bf16, as shipped) gives back the very same tensors and ids."""
    official, config = write_eagle3(tmp_path / "official", target, [0, 1, 2])
    native = cli_import("eagle3", tmp_path / "official", target_dir, tmp_path / "native")
    out = tmp_path / "sglang"
    args = ["export", "--heads", str(native), "--format", "eagle3", "--out", str(out), "--dtype", "bfloat16"]
    assert main(args) == 0
    exported = load_file(str(out / "model.safetensors"))
    assert exported.keys() == official.keys()
    for key, value in official.items():
        assert torch.equal(exported[key], value), key
    written = json.loads((out / "config.json").read_text())
    assert written["eagle_config"] == config["eagle_config"]
    for key in ("intermediate_size", "rms_norm_eps", "rope_theta", "draft_vocab_size", "num_key_value_heads"):
        assert written[key] == config[key], key


def test_cli_refuses_cleanly(tmp_path, target, target_dir, capsys):
    write_eagle3(tmp_path / "official", target, [0, 1, 2])
    native = cli_import("eagle3", tmp_path / "official", target_dir, tmp_path / "native")
    assert main(["export", "--heads", str(native), "--format", "medusa", "--out", str(tmp_path / "no")]) == 1
    assert "holds eagle3 heads" in capsys.readouterr().err and not (tmp_path / "no").exists()
    args = ["export", "--heads", str(native), "--format", "eagle3", "--out", str(tmp_path / "x")]
    assert main([*args, "--num-speculative-tokens", "4"]) == 2 and not (tmp_path / "x").exists()
    missing = ["import-heads", "--format", "eagle3", "--checkpoint", str(tmp_path / "nowhere")]
    assert main([*missing, "--target", str(target_dir), "--out", str(tmp_path / "y")]) == 1
    assert "is not a directory" in capsys.readouterr().err and not (tmp_path / "y").exists()
