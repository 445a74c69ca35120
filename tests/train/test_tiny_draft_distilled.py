"""The distilled draft: any target's draft, trained on its answers from a `specheads distill` folder."""

import json
import shutil
from dataclasses import fields, replace
from pathlib import Path

import pytest
import torch

from specheads.builders.tiny_draft import META_FILE, DistilledDraftConfig, ensure_tiny_draft, read_meta

from helpers import command

distill_cli, tiny_draft_cli = command("distill"), command("tiny-draft")

DRAFT = DistilledDraftConfig(
    steps=4,
    hidden_size=32,
    num_layers=1,
    num_heads=2,
    num_kv_heads=2,
    intermediate_size=64,
    max_length=96,
    batch_size=4,
    warmup_steps=1,
    heldout_rows=2,
)
# DRAFT as `specheads tiny-draft` flags (its hidden knobs), --steps apart
DRAFT_FLAGS = [
    arg
    for f in fields(DRAFT)
    if f.name != "steps" and getattr(DRAFT, f.name) != f.default
    for arg in ("--" + f.name.replace("_", "-"), str(getattr(DRAFT, f.name)))
]
QUESTIONS = ["How do I join two paths?", "What does sorted return?", "Explain a dict.", "Open a file."]


@pytest.fixture(scope="module")
def target(small_tiny_target) -> Path:
    return small_tiny_target


@pytest.fixture(scope="module")
def distilled(target, tmp_path_factory) -> Path:
    """The target's greedy answers to a few questions, as `specheads distill` writes them."""
    where = tmp_path_factory.mktemp("distilled")
    source = where / "questions.jsonl"
    source.write_text(
        "".join(json.dumps({"messages": [{"role": "user", "content": q}]}) + "\n" for q in QUESTIONS * 2)
    )
    out = where / "out"
    argv = ["--source", str(source), "--target", str(target), "--out", str(out), "--max-new-tokens", "12"]
    assert (
        distill_cli([*argv, "--temperature", "0", "--batch-size", "4", "--no-progress", "--threads", "1"])
        == 0
    )
    return out


@pytest.fixture(scope="module")
def draft(target, distilled, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("draft") / "draft"
    path, meta, reused = ensure_tiny_draft(target, DRAFT, out, progress=False, data=distilled)
    assert not reused
    return path, meta


def test_draft_speaks_the_targets_tokens(target, draft):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    path, meta = draft
    model = AutoModelForCausalLM.from_pretrained(path)
    target_config = AutoConfig.from_pretrained(target)
    assert model.config.vocab_size == target_config.vocab_size
    assert model.config.tie_word_embeddings
    assert model.generation_config.eos_token_id == GenerationConfig.from_pretrained(target).eos_token_id
    ours, theirs = AutoTokenizer.from_pretrained(path), AutoTokenizer.from_pretrained(target)
    assert ours.chat_template == theirs.chat_template and ours.get_vocab() == theirs.get_vocab()
    assert meta["data"]["train_rows"] == 6 and meta["data"]["heldout_rows"] == 2 and meta["steps"] == 4
    assert meta["embedding_init"] == "target principal axes"
    assert meta["parameters"] == sum(p.numel() for p in model.parameters())
    assert 0 < meta["heldout_loss"] < 10 and 0 <= meta["heldout_top1"] <= 1
    assert meta["device"] == "cpu"  # where it trained (`--device`), recorded but not in the key


def test_draft_serves_as_assistant_without_changing_the_output(target, draft):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(target).eval()
    assistant = AutoModelForCausalLM.from_pretrained(draft[0]).eval()
    chat = [{"role": "user", "content": "How do I read a file?"}]
    ids = AutoTokenizer.from_pretrained(target).apply_chat_template(
        chat, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )["input_ids"]
    with torch.no_grad():
        plain = model.generate(ids, max_new_tokens=12, do_sample=False)
        assisted = model.generate(ids, max_new_tokens=12, do_sample=False, assistant_model=assistant)
    assert torch.equal(plain, assisted)


def test_cached_per_settings_target_and_data(target, distilled, draft, tmp_path, monkeypatch):
    path, meta = draft
    before = (path / "model.safetensors").stat().st_mtime_ns
    again, meta2, reused = ensure_tiny_draft(target, DRAFT, path, progress=False, data=distilled)
    assert reused and again == path and meta2 == meta
    assert (path / "model.safetensors").stat().st_mtime_ns == before

    monkeypatch.setenv("SPECHEADS_CACHE", str(tmp_path / "cache"))
    cached, cached_meta, reused = ensure_tiny_draft(target, DRAFT, progress=False, data=distilled)
    assert not reused and cached == tmp_path / "cache" / "tiny-draft" / meta["key"]
    assert ensure_tiny_draft(target, DRAFT, progress=False, data=distilled)[2]  # the second call reuses
    # Other rows (one answer changed) are another entry, as are other settings.
    other = tmp_path / "other"
    shutil.copytree(distilled, other)
    part = sorted(other.glob("part-*.jsonl"))[0]
    part.write_text(part.read_text().replace('"content": "', '"content": "x', 1))
    with pytest.raises(FileExistsError, match="other settings or for another target"):
        ensure_tiny_draft(target, DRAFT, path, progress=False, data=other)
    with pytest.raises(FileExistsError, match="other settings or for another target"):
        ensure_tiny_draft(target, replace(DRAFT, seed=1), path, progress=False, data=distilled)


def test_bad_data_is_named_before_any_training(target, distilled, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(FileNotFoundError, match=f"--data {tmp_path / 'nowhere'}: no such folder"):
        ensure_tiny_draft(target, DRAFT, out, progress=False, data=tmp_path / "nowhere")
    rows = tmp_path / "rows"
    rows.mkdir()
    (rows / "chats.jsonl").write_text((sorted(distilled.glob("part-*.jsonl"))[0]).read_text())
    with pytest.raises(ValueError, match=f"--data {rows}: not a `specheads distill` output"):
        ensure_tiny_draft(target, DRAFT, out, progress=False, data=rows)
    unfinished = tmp_path / "unfinished"
    shutil.copytree(distilled, unfinished)
    (unfinished / "_summary.json").unlink()
    with pytest.raises(ValueError, match="unfinished `specheads distill` output"):
        ensure_tiny_draft(target, DRAFT, out, progress=False, data=unfinished)
    foreign = tmp_path / "foreign"
    shutil.copytree(distilled, foreign)
    settings = json.loads((foreign / "_settings.json").read_text())
    settings["target"]["vocab_hash"] = "0" * 64
    (foreign / "_settings.json").write_text(json.dumps(settings))
    with pytest.raises(ValueError, match="distilled from a target with another vocabulary"):
        ensure_tiny_draft(target, DRAFT, out, progress=False, data=foreign)
    assert not out.exists()


def test_partial_data_trains_on_the_finished_chunks_of_an_unfinished_folder(
    target, distilled, draft, tmp_path
):
    unfinished = tmp_path / "unfinished"  # as a time limit leaves one: no summary, a part without its record
    shutil.copytree(distilled, unfinished)
    (unfinished / "_summary.json").unlink()
    (unfinished / "part-00099.jsonl").write_text(sorted(distilled.glob("part-*.jsonl"))[0].read_text())
    with pytest.raises(ValueError, match="unfinished `specheads distill` output.*pass --partial"):
        ensure_tiny_draft(target, DRAFT, tmp_path / "refused", progress=False, data=unfinished)
    path, meta, reused = ensure_tiny_draft(
        target, DRAFT, tmp_path / "d", progress=False, data=unfinished, partial_data=True
    )
    assert not reused and meta["data"]["complete"] is False and meta["data"]["finished_parts"] == 1
    # the rows of the finished chunk only (the part without a record is not read): the finished folder's
    assert (meta["data"]["train_rows"], meta["data"]["heldout_rows"]) == (6, 2)
    assert meta["data"]["fingerprint"] == draft[1]["data"]["fingerprint"]
    shutil.rmtree(unfinished / "_chunks")
    with pytest.raises(ValueError, match=f"--data {unfinished}: no finished chunk yet"):
        ensure_tiny_draft(
            target, DRAFT, tmp_path / "none", progress=False, data=unfinished, partial_data=True
        )
    with pytest.raises(SystemExit, match="--partial is for --data"):
        tiny_draft_cli(["--target", str(target), "--partial", "--out", str(tmp_path / "x"), "--no-progress"])


def test_several_folders_train_on_all_their_rows_in_the_order_given(
    target, distilled, draft, tmp_path, capsys
):
    """`--data A B`: the shards of one distillation, or greedy and sampled answers, read in that order."""
    second = tmp_path / "second"  # another distillation's folder: its own settings and answers
    shutil.copytree(distilled, second)
    settings = json.loads((second / "_settings.json").read_text())
    settings["seed"] = 7
    (second / "_settings.json").write_text(json.dumps(settings))
    path, meta, reused = ensure_tiny_draft(
        target, DRAFT, tmp_path / "d", progress=False, data=[distilled, second]
    )
    assert not reused and meta["data"]["finished_parts"] == 2 and meta["data"]["complete"] is True
    # 8 + 8 conversations; the held-out rows are the last (of the last folder), as for one folder
    assert (meta["data"]["train_rows"], meta["data"]["heldout_rows"]) == (14, 2)
    assert [f["path"] for f in meta["data"]["folders"]] == [str(distilled), str(second)]
    assert [f["distilled"]["seed"] for f in meta["data"]["folders"]] == [0, 7]
    assert meta["data"]["fingerprint"] != draft[1]["data"]["fingerprint"]
    assert draft[1]["data"]["folders"][0]["path"] == str(distilled)  # one folder: a list of one
    swapped = ensure_tiny_draft(target, DRAFT, tmp_path / "s", progress=False, data=[second, distilled])[1]
    assert swapped["data"]["fingerprint"] != meta["data"]["fingerprint"]  # the order is the rows' order
    with pytest.raises(ValueError, match="a folder is named twice"):
        ensure_tiny_draft(target, DRAFT, tmp_path / "twice", progress=False, data=[distilled, distilled])
    with pytest.raises(FileNotFoundError, match=f"--data {tmp_path / 'nowhere'}: no such folder"):
        ensure_tiny_draft(
            target, DRAFT, tmp_path / "n", progress=False, data=[distilled, tmp_path / "nowhere"]
        )
    assert not (tmp_path / "twice").exists() and not (tmp_path / "n").exists()
    argv = ["--target", str(target), "--data", str(distilled), str(second), "--out", str(tmp_path / "d")]
    assert tiny_draft_cli([*argv, "--no-progress", "--steps", "4", *DRAFT_FLAGS]) == 0
    assert "reused tiny draft" in capsys.readouterr().out  # the command's --data A B: the same key


def test_command_distills_then_reuses(target, distilled, tmp_path, capsys):
    argv = ["--target", str(target), "--data", str(distilled), "--out", str(tmp_path / "d"), "--steps", "2"]
    argv += ["--hidden-size", "32", "--num-layers", "1", "--intermediate-size", "64", "--max-length", "96"]
    argv += ["--heldout-rows", "2", "--warmup-steps", "1", "--no-progress", "--threads", "1"]
    assert tiny_draft_cli(argv) == 0
    assert "built tiny draft" in capsys.readouterr().out
    assert read_meta(tmp_path / "d")["builder"]["max_length"] == 96
    assert json.loads((tmp_path / "d" / META_FILE).read_text())["steps"] == 2
    assert tiny_draft_cli(argv) == 0
    assert "reused tiny draft" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--seq-len is not a setting of a distilled draft"):
        tiny_draft_cli([*argv, "--seq-len", "64"])


def test_command_asks_for_data_for_a_target_that_is_not_tiny(target, tmp_path):
    other = tmp_path / "target"
    shutil.copytree(target, other)
    (other / "specheads_tiny_target.json").unlink()
    with pytest.raises(SystemExit, match=f"--target {other} is not the tiny target.*pass --data DIR"):
        tiny_draft_cli(["--target", str(other), "--out", str(tmp_path / "d"), "--no-progress"])
    assert not (tmp_path / "d").exists()


def test_only_a_distilled_draft_trains_on_another_device(target, tmp_path):
    with pytest.raises(SystemExit, match="--device is for a distilled draft"):
        tiny_draft_cli(
            ["--target", str(target), "--device", "cuda", "--out", str(tmp_path / "d"), "--no-progress"]
        )
    assert not (tmp_path / "d").exists()
