"""The tiny draft: the target's tokenizer and corpus split, a smaller model, deterministic, cached."""

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from specheads.builders import tiny_draft
from specheads.builders.tiny_draft import (
    META_FILE,
    TinyDraftConfig,
    build,
    ensure_tiny_draft,
    read_meta,
)
from specheads.builders.tiny_target import HELDOUT_FILE
from specheads.core.target import vocab_hash

from helpers import SMALL_TINY_TARGET, command

tiny_draft_cli = command("tiny-draft")

DRAFT = TinyDraftConfig(
    steps=3,
    hidden_size=32,
    num_layers=1,
    num_heads=2,
    num_kv_heads=2,
    intermediate_size=64,
    seq_len=64,
    batch_size=4,
    eval_blocks=4,
    warmup_steps=1,
)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def target(small_tiny_target) -> Path:
    return small_tiny_target


@pytest.fixture(scope="module")
def draft(target, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("draft") / "draft"
    path, meta, reused = ensure_tiny_draft(target, DRAFT, out, progress=False)
    assert not reused
    return path, meta


def test_draft_speaks_the_targets_tokens(target, draft):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    path, meta = draft
    model = AutoModelForCausalLM.from_pretrained(path)
    target_config = AutoConfig.from_pretrained(target)
    assert model.config.vocab_size == target_config.vocab_size
    assert (path / "tokenizer.json").read_text() == (target / "tokenizer.json").read_text()
    assert vocab_hash(AutoTokenizer.from_pretrained(path)) == meta["target"]["vocab_hash"]
    target_eos = GenerationConfig.from_pretrained(target).eos_token_id
    assert isinstance(target_eos, list) and len(target_eos) == 2  # <|eos|> and <|end|>
    assert model.generation_config.eos_token_id == target_eos
    assert model.config.num_hidden_layers == 1 < target_config.num_hidden_layers
    assert meta["parameters"] == sum(p.numel() for p in model.parameters())
    assert 0 < meta["heldout_loss"] < 10 and meta["steps"] == 3


def test_draft_leaves_out_the_targets_heldout_files(target, draft):
    _, meta = draft
    assert meta["corpus"]["heldout_files"] == json.loads((target / HELDOUT_FILE).read_text())["files"]
    assert meta["corpus"]["train_files"] == SMALL_TINY_TARGET.max_files
    assert meta["target"]["tiny_target_key"] == SMALL_TINY_TARGET.key()


def test_draft_serves_as_assistant_without_changing_the_output(target, draft):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(target).eval()
    assistant = AutoModelForCausalLM.from_pretrained(draft[0]).eval()
    ids = AutoTokenizer.from_pretrained(target)("def join(a, b):\n", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        plain = model.generate(ids, max_new_tokens=12, do_sample=False)
        assisted = model.generate(ids, max_new_tokens=12, do_sample=False, assistant_model=assistant)
    assert torch.equal(plain, assisted)


def test_deterministic_for_a_seed(target, draft, tmp_path):
    again = build(target, DRAFT, tmp_path / "again", progress=False)
    assert sha(tmp_path / "again" / "model.safetensors") == sha(draft[0] / "model.safetensors")
    assert again["heldout_loss"] == draft[1]["heldout_loss"] and again["key"] == draft[1]["key"]
    build(target, replace(DRAFT, seed=1), tmp_path / "other", progress=False)
    assert sha(tmp_path / "other" / "model.safetensors") != sha(draft[0] / "model.safetensors")


def test_training_lowers_heldout_loss(target, draft, tmp_path):
    longer = build(target, replace(DRAFT, steps=30), tmp_path / "longer", progress=False)
    assert longer["heldout_loss"] < draft[1]["heldout_loss"] - 0.5


def test_cached_per_settings_and_target(target, draft, tmp_path, monkeypatch):
    path, meta = draft
    before = (path / "model.safetensors").stat().st_mtime_ns
    again, meta2, reused = ensure_tiny_draft(target, DRAFT, path, progress=False)
    assert reused and again == path and meta2 == meta
    assert (path / "model.safetensors").stat().st_mtime_ns == before
    with pytest.raises(FileExistsError, match="other settings or for another target.*--force"):
        ensure_tiny_draft(target, replace(DRAFT, seed=3), path, progress=False)

    monkeypatch.setenv("SPECHEADS_CACHE", str(tmp_path / "cache"))
    cached, cached_meta, reused = ensure_tiny_draft(target, DRAFT, progress=False)
    assert not reused and cached == tmp_path / "cache" / "tiny-draft" / meta["key"]
    assert cached_meta["key"] == meta["key"]
    # The same settings for another target (another build, or another vocabulary) make another entry.
    tokenizer, _ = tiny_draft.load_target_side(target)
    identity = tiny_draft.target_identity(target, tokenizer)
    assert tiny_draft.draft_key(DRAFT, identity) == meta["key"]
    for other in ({"tiny_target_key": "0" * 16}, {"vocab_hash": "0" * 64}):
        assert tiny_draft.draft_key(DRAFT, {**identity, **other}) != meta["key"]


def test_refuses_a_folder_that_is_not_a_draft(target, tmp_path):
    stranger = tmp_path / "stranger"
    stranger.mkdir()
    (stranger / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not a tiny draft; refusing to overwrite"):
        ensure_tiny_draft(target, DRAFT, stranger, progress=False)
    assert (stranger / "notes.txt").read_text() == "mine"


def test_errors_before_any_training(target, tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text((target / "config.json").read_text())  # a model without a tokenizer
    with pytest.raises(FileNotFoundError, match="no tokenizer"):
        ensure_tiny_draft(bare, DRAFT, tmp_path / "out", progress=False)
    with pytest.raises(FileNotFoundError, match="no config.json"):
        ensure_tiny_draft(tmp_path / "nowhere", DRAFT, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_a_target_with_another_heldout_list_is_refused(target, tmp_path):
    import shutil

    moved = tmp_path / "target"
    shutil.copytree(target, moved)
    listed = json.loads((moved / HELDOUT_FILE).read_text())
    listed["files"] = ["json/decoder.py"]
    (moved / HELDOUT_FILE).write_text(json.dumps(listed))
    with pytest.raises(ValueError, match="would train on the target's evaluation prompts"):
        build(moved, DRAFT, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_command_builds_then_reuses(target, tmp_path, capsys):
    argv = ["--target", str(target), "--out", str(tmp_path / "d"), "--steps", "2", "--no-progress"]
    argv += ["--hidden-size", "32", "--num-layers", "1", "--intermediate-size", "64", "--seq-len", "64"]
    argv += ["--batch-size", "2", "--eval-blocks", "2", "--warmup-steps", "1"]
    assert tiny_draft_cli(argv) == 0
    assert "built tiny draft" in capsys.readouterr().out
    assert read_meta(tmp_path / "d")["builder"]["hidden_size"] == 32
    assert json.loads((tmp_path / "d" / META_FILE).read_text())["steps"] == 2
    assert tiny_draft_cli(argv) == 0
    assert "reused tiny draft" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--steps must be >= 1"):
        tiny_draft_cli(["--target", str(target), "--out", str(tmp_path / "e"), "--steps", "0"])
