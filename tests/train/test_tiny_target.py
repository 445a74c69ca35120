"""The embedded default target: builds offline, loads with the Auto classes, deterministic, cached."""

import hashlib
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from specheads.builders.tiny_target import (
    HELDOUT_FILE,
    META_FILE,
    build,
    ensure_tiny_target,
    read_meta,
)
from specheads.cli import main as cli_main
from specheads.data import stdlib_corpus

from helpers import SMALL_TINY_TARGET


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def small_target(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("tiny") / "target"
    path, meta, reused = ensure_tiny_target(SMALL_TINY_TARGET, out, progress=False)
    assert not reused
    return path, meta


def test_corpus_is_the_pinned_stdlib_without_tests_on_any_python():
    corpus = stdlib_corpus.stdlib_corpus()
    files = corpus.files
    assert corpus.key.startswith("cpython-3.11.7-stdlib-") and len(files) == 734 and files == sorted(files)
    assert "os.py" in files and "json/decoder.py" in files  # not this Python's library: the archive's
    for f in files:
        parts = Path(f).parts
        assert "test" not in parts and "tests" not in parts and "site-packages" not in parts
        assert not Path(f).name.startswith("test_")
    assert sum(map(len, corpus.texts.values())) > 10_000_000
    train, heldout = stdlib_corpus.split_files(files, 0.03)
    assert not set(train) & set(heldout) and len(train) + len(heldout) == len(files)
    assert 0.01 < len(heldout) / len(files) < 0.06


def test_a_damaged_corpus_archive_is_refused(tmp_path, monkeypatch):
    damaged = tmp_path / "corpus.tar.xz"
    damaged.write_bytes(stdlib_corpus.ARCHIVE.read_bytes()[:-1] + b"x")
    monkeypatch.setattr(stdlib_corpus, "ARCHIVE", damaged)
    stdlib_corpus.stdlib_corpus.cache_clear()
    try:
        with pytest.raises(ValueError, match="corpus.tar.xz has sha256 .* expected .* damaged"):
            stdlib_corpus.stdlib_corpus()
    finally:
        stdlib_corpus.stdlib_corpus.cache_clear()


def test_builds_and_loads_with_auto_classes(small_target):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path, meta = small_target
    model = AutoModelForCausalLM.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert model.config.model_type == "llama"
    assert model.config.vocab_size == len(tokenizer)
    assert meta["parameters"] == sum(p.numel() for p in model.parameters())
    assert math.isfinite(meta["heldout_loss"]) and 0 < meta["heldout_loss"] < 10
    assert meta["steps"] == 3
    ids = tokenizer("import os\n", return_tensors="pt")["input_ids"]
    assert ids[0, 0].item() == tokenizer.bos_token_id
    out = model.generate(ids, max_new_tokens=5, do_sample=False)
    assert out.shape[1] == ids.shape[1] + 5


def test_chat_template_marks_assistant_tokens(small_target):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(small_target[0])
    chat = [{"role": "user", "content": "Write f."}, {"role": "assistant", "content": "def f():\n    pass"}]
    enc = tokenizer.apply_chat_template(
        chat, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    mask = enc["assistant_masks"]
    assert 0 < sum(mask) < len(mask)
    assistant = [t for t, m in zip(enc["input_ids"], mask) if m]
    assert tokenizer.decode(assistant) == "def f():\n    pass<|end|>"
    prompt = tokenizer.apply_chat_template(chat[:1], tokenize=False, add_generation_prompt=True)
    assert prompt == "<|bos|><|user|>\nWrite f.<|end|>\n<|assistant|>\n"


def test_heldout_files_are_recorded_and_not_trained_on(small_target):
    path, _ = small_target
    heldout = json.loads((path / HELDOUT_FILE).read_text())
    assert heldout["files"]
    corpus = stdlib_corpus.stdlib_corpus()
    assert heldout["corpus"] == corpus.key and heldout["root"] == "heldout"
    for f in heldout["files"]:
        assert stdlib_corpus.is_heldout(f, SMALL_TINY_TARGET.heldout_fraction)
        assert (path / "heldout" / f).read_text(encoding="utf-8") == corpus.texts[f]  # carried with it


def test_deterministic_for_a_seed(small_target, tmp_path):
    path, _ = small_target
    again = build(SMALL_TINY_TARGET, tmp_path / "again", progress=False)
    assert sha(tmp_path / "again" / "model.safetensors") == sha(path / "model.safetensors")
    assert (tmp_path / "again" / "tokenizer.json").read_text() == (path / "tokenizer.json").read_text()
    assert again["heldout_loss"] == read_meta(path)["heldout_loss"]
    build(replace(SMALL_TINY_TARGET, seed=1), tmp_path / "other", progress=False)
    assert sha(tmp_path / "other" / "model.safetensors") != sha(path / "model.safetensors")


def test_training_lowers_heldout_loss(small_target, tmp_path):
    longer = build(replace(SMALL_TINY_TARGET, steps=30, lr=3e-3), tmp_path / "longer", progress=False)
    assert longer["heldout_loss"] < small_target[1]["heldout_loss"] - 0.5


def test_valid_build_is_reused_and_others_are_not_overwritten(small_target, tmp_path):
    path, meta = small_target
    before = (path / "model.safetensors").stat().st_mtime_ns
    again, meta2, reused = ensure_tiny_target(SMALL_TINY_TARGET, path, progress=False)
    assert reused and again == path and meta2 == meta
    assert (path / "model.safetensors").stat().st_mtime_ns == before
    with pytest.raises(FileExistsError, match="built with other settings.*--force"):
        ensure_tiny_target(replace(SMALL_TINY_TARGET, seed=7), path, progress=False)
    stranger = tmp_path / "stranger"
    stranger.mkdir()
    (stranger / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="is not a tiny target; refusing to overwrite"):
        ensure_tiny_target(SMALL_TINY_TARGET, stranger, progress=False)
    assert (stranger / "notes.txt").read_text() == "mine"


def test_default_output_is_cached_under_the_user_cache(monkeypatch, tmp_path):
    from specheads.builders.tiny_target import default_output_dir

    monkeypatch.setenv("SPECHEADS_CACHE", str(tmp_path / "cache"))
    assert (
        default_output_dir(SMALL_TINY_TARGET) == tmp_path / "cache" / "tiny-target" / SMALL_TINY_TARGET.key()
    )
    assert SMALL_TINY_TARGET.key() != replace(SMALL_TINY_TARGET, seed=1).key()


def test_failure_leaves_nothing_half_written(tmp_path, monkeypatch):
    from transformers import PreTrainedTokenizerFast

    def boom(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(PreTrainedTokenizerFast, "save_pretrained", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        build(SMALL_TINY_TARGET, tmp_path / "target", progress=False)
    assert list(tmp_path.iterdir()) == []


def test_cli_builds_reuses_and_prints_a_sample(tmp_path, capsys):
    args = [
        "tiny-target",
        "--out",
        str(tmp_path / "t"),
        "--steps",
        "2",
        "--max-files",
        "12",
        "--vocab-size",
        "300",
        "--hidden-size",
        "32",
        "--num-layers",
        "1",
        "--num-heads",
        "2",
        "--num-kv-heads",
        "2",
        "--intermediate-size",
        "64",
        "--seq-len",
        "32",
        "--batch-size",
        "2",
        "--eval-blocks",
        "2",
        "--warmup-steps",
        "1",
    ]
    assert cli_main(args) == 0
    first = capsys.readouterr().out
    assert (
        "built tiny target" in first
        and "held-out loss" in first
        and "greedy continuation of held-out" in first
    )
    assert read_meta(tmp_path / "t")["builder"]["hidden_size"] == 32
    assert cli_main(args + ["--no-sample"]) == 0
    assert "reused tiny target" in capsys.readouterr().out


def test_cli_rejects_a_non_positive_budget(tmp_path):
    with pytest.raises(SystemExit, match="must be positive"):
        cli_main(["tiny-target", "--out", str(tmp_path / "t"), "--minutes", "0"])
    assert not (tmp_path / "t").exists()


def test_meta_file_records_the_build(small_target):
    meta = json.loads((small_target[0] / META_FILE).read_text())
    for key in (
        "key",
        "builder",
        "steps",
        "parameters",
        "heldout_loss",
        "build_seconds",
        "python",
        "specheads",
    ):
        assert key in meta
    assert torch.__version__ == meta["torch"]
