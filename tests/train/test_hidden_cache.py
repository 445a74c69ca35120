"""The hidden-state cache: offline losses equal online ones on the same batches, a killed job resumes
to the same bytes, corruption and token mismatches are caught, and OfflineTarget reads only the
embedding, final norm and lm_head."""

import json
from functools import partial
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from torch.utils.data import DataLoader

from specheads.core.target import FrozenTarget, TargetMismatchError
from specheads.data import collate, load_rows, tokenize_rows
from specheads.methods import method_named, methods
from specheads.train import prepare
from specheads.train.cached_rows import CachedRows, collate_cached
from specheads.train.eagle_losses import eagle3_loss, eagle_loss
from specheads.train.hidden_cache import (
    CacheCorruptError,
    CacheError,
    OfflineTarget,
    TokenMismatchError,
    build_cache,
    cache_layers,
    read_index,
    target_output,
)
from specheads.train.losses import medusa_loss
from specheads.train.recipe import load_config

from helpers import command, save_tiny_target, tiny_cache_args

cache_main = command("cache")

REPO = Path(__file__).resolve().parents[2]
MAX_LENGTH = 48


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def rows(text_data, llama_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(llama_dir)
    return tokenize_rows(load_rows(str(text_data)), tokenizer, max_length=MAX_LENGTH, loss_on="all")


def build(target, rows, out, layers=(-1,), **kw):
    kw = {"max_length": MAX_LENGTH, "dtype": torch.float32, "shard_tokens": 600, "batch_size": 5, **kw}
    return build_cache(target, rows, layers, out, progress=False, **kw)


def heads_loss_via(cfg, heads, target, batch):
    """The method's loss with the target's forward through target_output (online or offline)."""
    eagle = cfg.method in ("eagle", "eagle3")
    out = target_output(
        target,
        batch,
        capture=heads.capture_layers if eagle else (-1,),
        logits=eagle or cfg.settings.labels == "target",
    )
    ids, mask, positions = batch["input_ids"], batch["loss_mask"], batch["position_ids"]
    if cfg.method == "eagle":
        hidden = out.hidden[target.num_layers]
        return eagle_loss(
            heads,
            hidden,
            ids,
            mask,
            positions,
            out.logits,
            target.embed_tokens,
            target.lm_head,
            attention_mask=batch["attention_mask"],
        )
    if cfg.method == "eagle3":
        return eagle3_loss(
            heads,
            out.hidden,
            ids,
            mask,
            positions,
            out.logits,
            target.embed_tokens,
            attention_mask=batch["attention_mask"],
            steps=cfg.settings.ttt_steps,
        )
    hidden = out.hidden[target.num_layers]
    return medusa_loss(heads, hidden, ids, mask, positions, target_logits=out.logits, lm_head=target.lm_head)


def loader(dataset, collate_fn, packing, pad_token_id, seed=3):
    return DataLoader(
        dataset,
        batch_size=6,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
        collate_fn=partial(collate_fn, pad_token_id=pad_token_id, packing=packing, max_length=MAX_LENGTH),
        drop_last=True,
    )


@pytest.mark.parametrize(
    "method, packing, extra",
    [
        ("medusa", False, {"medusa": {"labels": "target", "num_heads": 3}}),
        ("eagle", False, {}),
        ("eagle3", True, {"eagle3": {"layers": [1, 2, 3], "ttt_steps": 3, "draft_vocab_size": 100}}),
        # one cache built for EAGLE-3 (its three layers and the last) serves Medusa and EAGLE as well
        ("medusa", False, {"medusa": {"labels": "target", "num_heads": 3}, "cache_of": "eagle3"}),
        ("eagle", False, {"cache_of": "eagle3"}),
    ],
)
def test_offline_loss_equals_online(method, packing, extra, llama_dir, rows, tmp_path):
    extra = dict(extra)
    cache_of = extra.pop("cache_of", method)
    cfg = load_config(
        None, {"method": method, "packing": packing, "max_length": MAX_LENGTH, **extra}, methods=methods()
    )
    online = FrozenTarget.from_pretrained(str(llama_dir), dtype="float32")
    torch.manual_seed(0)
    heads, _ = prepare.build_heads(cfg, method_named(method), online, rows)
    heads.eval()  # EAGLE's input noise is random in training mode
    layers = cache_layers(method_named(cache_of), online.num_layers, cfg.chosen_layers)
    build(online, rows, tmp_path / "cache", layers)
    assert set(cache_layers(method_named(method), online.num_layers, cfg.chosen_layers)) <= set(layers)

    offline = OfflineTarget.from_pretrained(str(llama_dir), dtype="float32")
    cached = CachedRows(tmp_path / "cache", expected=rows, target=offline.record())
    pad = online.tokenizer.pad_token_id
    online_batches = loader(rows, collate, packing, pad)
    offline_batches = loader(cached, collate_cached, packing, pad)
    compared = 0
    with torch.no_grad():
        for on, off in zip(online_batches, offline_batches):
            for key in ("input_ids", "loss_mask", "position_ids", "attention_mask"):
                assert torch.equal(on[key], off[key]), key  # the same rows, in the same batches
            loss_on, metrics_on = heads_loss_via(cfg, heads, online, on)
            loss_off, metrics_off = heads_loss_via(cfg, heads, offline, off)
            assert loss_on.item() > 0
            assert abs(loss_on.item() - loss_off.item()) < 1e-6
            torch.testing.assert_close(metrics_on.as_tensor(), metrics_off.as_tensor(), rtol=1e-6, atol=1e-5)
            compared += 1
            if compared == 3:
                break
    assert compared == 3


def test_killed_job_resumes_to_identical_bytes(llama_dir, rows, tmp_path):
    target = FrozenTarget.from_pretrained(str(llama_dir), dtype="float32")
    whole = build(target, rows, tmp_path / "whole")
    assert whole["shards"] >= 4 and whole["written"] == whole["shards"]

    def kill_after_second(k, entry):
        if k == 1:
            raise KeyboardInterrupt("killed")

    part = tmp_path / "part"
    with pytest.raises(KeyboardInterrupt):
        build(target, rows, part, on_shard=kill_after_second)
    index = read_index(part)
    assert not index["complete"] and len(index["shards"]) == 2
    with pytest.raises(CacheError, match="unfinished cache"):
        CachedRows(part)
    # A stray file where the next shard goes (renamed in, index never updated) is not trusted.
    (part / "shard-00002.safetensors").write_bytes(b"not a shard")
    resumed = build(target, rows, part)
    assert (resumed["skipped"], resumed["written"]) == (2, whole["shards"] - 2)
    names = sorted(p.name for p in (tmp_path / "whole").iterdir())
    assert names == sorted(p.name for p in part.iterdir())
    for name in names:
        assert (part / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name


def test_corrupt_shard_is_caught_and_rebuilt(llama_dir, rows, tmp_path):
    target = FrozenTarget.from_pretrained(str(llama_dir), dtype="float32")
    build(target, rows, tmp_path / "c")
    shard = tmp_path / "c" / "shard-00001.safetensors"
    good = shard.read_bytes()
    data = bytearray(good)
    data[-3] ^= 0xFF  # one flipped bit pattern inside the last hidden state
    shard.write_bytes(bytes(data))
    with pytest.raises(CacheCorruptError, match="shard-00001.safetensors: checksum mismatch"):
        CachedRows(tmp_path / "c")
    summary = build(target, rows, tmp_path / "c")
    assert summary["written"] == 1 and shard.read_bytes() == good
    assert len(CachedRows(tmp_path / "c")) == len(rows)


def test_mismatches_are_errors(llama_dir, rows, tmp_path):
    target = FrozenTarget.from_pretrained(str(llama_dir), dtype="float32")
    build(target, rows, tmp_path / "c", dtype="bfloat16")
    changed = [dict(r) for r in rows]
    ids = list(changed[20]["input_ids"])
    ids[3] = (ids[3] + 1) % 256
    changed[20]["input_ids"] = ids
    with pytest.raises(TokenMismatchError, match="built from other rows than the dataset's"):
        CachedRows(tmp_path / "c", expected=changed)  # verify: all the tokens, before any row is read
    cached = CachedRows(tmp_path / "c", expected=changed, verify=False)  # then row by row, as read
    cached[19]  # untouched rows read fine
    shard = next(s["file"] for s in read_index(tmp_path / "c")["shards"] if s["rows"][0] <= 20 < s["rows"][1])
    with pytest.raises(TokenMismatchError, match=rf"row 20 \({shard}, its row \d+\).*input_ids\[3\]"):
        cached[20]
    with pytest.raises(TokenMismatchError, match="rows"):
        CachedRows(tmp_path / "c", expected=changed[:-1])
    with pytest.raises(CacheError, match=r"holds layers \[4\], not \[2\]"):
        CachedRows(tmp_path / "c", layers=[2])
    qwen = save_tiny_target("qwen2", tmp_path / "qwen2")
    with pytest.raises(TargetMismatchError, match="model_type"):
        CachedRows(tmp_path / "c", target=OfflineTarget.from_pretrained(str(qwen)).record())
    # Other settings in the same directory: refused, not mixed.
    with pytest.raises(CacheError, match="dtype: 'bfloat16' vs now 'float32'"):
        build(target, rows, tmp_path / "c")
    # bf16 storage: every stored hidden state is the online one rounded once.
    with safe_open(str(tmp_path / "c" / "shard-00000.safetensors"), framework="pt") as f:
        stored, offsets = f.get_tensor("hidden.4"), f.get_tensor("row_offsets")
    first = torch.as_tensor(rows[0]["input_ids"])[None]
    online = target(first, capture=(-1,), logits=False).hidden[4][0]
    assert stored.dtype == torch.bfloat16 and offsets[1] == first.shape[1]
    assert torch.equal(stored[: first.shape[1]], online.bfloat16())


@pytest.mark.parametrize("tied", [False, True])
def test_offline_target_reads_only_three_tensors(tied, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    from helpers import tiny_model, tiny_tokenizer

    path = tmp_path / "target"
    model = tiny_model("llama", vocab_size=len(tiny_tokenizer()), tie_word_embeddings=tied)
    model.save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)

    def refuse(*args, **kwargs):
        raise AssertionError("OfflineTarget must not load the whole model")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", refuse)
    offline = OfflineTarget.from_pretrained(str(path), dtype="float32")
    expected_keys = {"model.embed_tokens.weight", "model.norm.weight"} | (
        set() if tied else {"lm_head.weight"}
    )
    assert set(offline.loaded_keys) == expected_keys
    held = {id(p): p for p in [*offline.model.parameters(), *offline.model.buffers()]}
    V, H = model.config.vocab_size, model.config.hidden_size
    assert sum(p.numel() for p in held.values()) == V * H * (1 if tied else 2) + H
    assert sum(p.numel() for p in held.values()) < sum(p.numel() for p in model.parameters()) / 2
    assert not any(p.is_meta or p.requires_grad for p in held.values())
    assert torch.equal(offline.embed_tokens.weight, model.model.embed_tokens.weight)
    assert torch.equal(offline.lm_head.weight, model.lm_head.weight)
    assert (offline.num_layers, offline.hidden_size, offline.vocab_size) == (4, H, V)
    assert offline.layer_id(-1) == 4
    online = FrozenTarget(model, tiny_tokenizer(), name_or_path=str(path))
    assert offline.record() == online.record()
    # Logits from the final hidden state equal the full model's.
    ids = torch.randint(0, 256, (2, 12))
    out = online(ids, capture=(-1,))
    batch = {"hidden.4": out.hidden[4]}
    torch.testing.assert_close(offline(batch, capture=(-1,)).logits, out.logits, rtol=0, atol=1e-6)
    with pytest.raises(KeyError, match=r"carries cached layers \[4\], training needs \[2\]"):
        offline(batch, capture=(2,), logits=False)


def test_cache_cli(llama_dir, text_data, tmp_path, capsys):
    args = tiny_cache_args(
        llama_dir, text_data, tmp_path / "cache", MAX_LENGTH, "--shard-tokens", "2000", "--no-progress"
    )
    assert cache_main(args) == 0
    printed = capsys.readouterr().out
    assert "train:" in printed and "eval:" in printed
    index = read_index(tmp_path / "cache" / "train")
    assert index["capture_layers"] == [1, 2, 3, 4] and index["dtype"] == "bfloat16" and index["complete"]
    # 4 layers of 64 bf16 values, plus 4 + 1 bytes of tokens and mask, plus the headers.
    size = sum((tmp_path / "cache" / "train" / s["file"]).stat().st_size for s in index["shards"])
    assert 4 * 64 * 2 + 5 <= size / index["num_tokens"] < 4 * 64 * 2 + 5 + 8
    eval_rows = json.loads((tmp_path / "cache" / "eval" / "index.json").read_text())["num_rows"]
    assert 0 < eval_rows < index["num_rows"]
    assert cache_main(args) == 0  # a second run finds every shard in place
    assert "0 written" in capsys.readouterr().out
    medusa2 = [
        str(REPO / "recipes" / "tiny" / "medusa2.yaml"),
        f"target={llama_dir}",
        "--out",
        str(tmp_path / "m2"),
    ]
    with pytest.raises(ValueError, match="'medusa2' trains LoRA adapters .* nothing to cache"):
        cache_main(medusa2)
    assert not (tmp_path / "m2").exists()
