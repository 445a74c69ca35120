"""Self-distillation (`specheads distill`): regenerated turns, text windows, resuming, counts, failures."""

import json
import os

import datasets
import pytest
import torch

from specheads.core.target import FrozenTarget
from specheads.data import BadRowsError, load_rows, tokenize_rows
from specheads.data import distillation as distill_mod
from specheads.data.distill_folder import chunk_record_path, is_complete
from specheads.data.distillation import DistillConfig, distill

from data_templates import family_tokenizer
from helpers import command, tiny_model

distill_cli = command("distill")

SYSTEM = {"role": "system", "content": "Be brief."}
CHATS = [
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}],
    [
        SYSTEM,
        {"role": "user", "content": "One?"},
        {"role": "assistant", "content": "1"},
        {"role": "user", "content": "Two?"},
        {"role": "assistant", "content": "2"},
    ],
    [{"role": "user", "content": "A prompt without an answer"}],
    [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": "y"},
        {"role": "user", "content": "z"},
    ],
]
SAMPLING = DistillConfig(temperature=1.0, top_p=0.9, max_new_tokens=5, batch_size=2, chunk_rows=3, seed=1)


def make_target(family: str = "tiny") -> FrozenTarget:
    tok = family_tokenizer(family)
    return FrozenTarget(tiny_model("llama", vocab_size=len(tok)), tok)


@pytest.fixture(scope="module")
def target() -> FrozenTarget:
    return make_target()


def chat_rows(tmp_path, chats=None):
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps({"messages": m}) + "\n" for m in (chats or CHATS * 2)))
    return load_rows(path, cache_dir=tmp_path / "hf-cache")


def text_rows():
    texts = ["def f(x):\n    return x + 1\n" * 3, "import os\n" * 2, "short"]
    return datasets.Dataset.from_dict({"text": texts})


def parts(out) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("part-*.jsonl"))}


def crash_after(monkeypatch, calls: int):
    """Make the `calls`-th generate() call fail, as a killed run would stop mid-chunk."""
    real, seen = distill_mod.generate_batch, []

    def generate(*args, **kwargs):
        seen.append(1)
        if len(seen) == calls:
            raise KeyboardInterrupt("killed")
        return real(*args, **kwargs)

    monkeypatch.setattr(distill_mod, "generate_batch", generate)


# -- resuming --------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["chat", "text"])
def test_a_resumed_run_writes_what_an_uninterrupted_run_writes(kind, target, tmp_path, monkeypatch):
    rows = chat_rows(tmp_path) if kind == "chat" else text_rows()
    cfg = SAMPLING if kind == "chat" else DistillConfig(**{**vars(SAMPLING), "prompt_tokens": 4})
    whole = distill(rows, target, tmp_path / "whole", cfg, progress=False)
    assert whole["skipped"] == 0 and whole["read"] == whole["written"] + whole["failed"] >= 7
    assert whole["parts"] == -(-whole["read"] // 3)  # chunks of 3 prompts

    out = tmp_path / "resumed"
    # killed inside chunk 1: its generate() calls are 4-7 for chat (2 conversations a batch, answered in
    # waves of up to 2 answers), 3-4 for text
    with monkeypatch.context() as m:
        crash_after(m, calls=6 if kind == "chat" else 4)
        with pytest.raises(KeyboardInterrupt):
            distill(rows, target, out, cfg, progress=False)
    assert list(parts(out)) == ["part-00000.jsonl"] and not is_complete(out)
    with monkeypatch.context() as m:  # killed again: chunk 1 written, its record not yet
        real_commit = distill_mod.commit_chunk

        def commit_then_die(out_dir, k, chunk, result):
            record = real_commit(out_dir, k, chunk, result)
            if k == 1:
                chunk_record_path(out_dir, k).unlink()
                raise KeyboardInterrupt("killed between the part and its record")
            return record

        m.setattr(distill_mod, "commit_chunk", commit_then_die)
        with pytest.raises(KeyboardInterrupt, match="between the part"):
            distill(rows, target, out, cfg, progress=False)
    resumed = distill(rows, target, out, cfg, progress=False)
    assert parts(out) == parts(tmp_path / "whole")  # byte for byte, however it was interrupted
    assert resumed["skipped"] == 3 and resumed["read"] == whole["read"]
    assert resumed["read"] == resumed["written"] + resumed["skipped"] + resumed["failed"]
    assert resumed["output_rows"] == whole["output_rows"] == whole["written"]
    again = distill(rows, target, out, cfg, progress=False)  # finished: nothing left to do
    assert again["skipped"] == again["read"] and again["written"] == 0
    assert parts(out) == parts(tmp_path / "whole")


def test_other_seeds_differ_and_other_settings_are_refused(target, tmp_path):
    rows = chat_rows(tmp_path)
    distill(rows, target, tmp_path / "a", SAMPLING, progress=False)
    distill(rows, target, tmp_path / "b", DistillConfig(**{**vars(SAMPLING), "seed": 2}), progress=False)
    assert parts(tmp_path / "a") != parts(tmp_path / "b")
    hotter = DistillConfig(**{**vars(SAMPLING), "temperature": 0.5})
    with pytest.raises(ValueError, match=r"(?s)other settings.*temperature: was 1.0, now 0.5"):
        distill(rows, target, tmp_path / "a", hotter, progress=False)


# -- what is regenerated ---------------------------------------------------------------------------


def test_every_assistant_turn_is_regenerated_from_the_conversation_so_far(target, tmp_path, monkeypatch):
    tok, model = target.tokenizer, target.model
    calls = []
    real = distill_mod.generate_batch

    def spy(model_, prompts, cfg, **kw):
        results = real(model_, prompts, cfg, **kw)
        calls.append((prompts, results))
        return results

    monkeypatch.setattr(distill_mod, "generate_batch", spy)
    cfg = DistillConfig(max_new_tokens=8, batch_size=4, chunk_rows=4)  # greedy
    distill(chat_rows(tmp_path, CHATS), target, tmp_path / "out", cfg, progress=False)
    out = [json.loads(line) for line in (tmp_path / "out" / "part-00000.jsonl").read_text().splitlines()]
    assert [r["index"] for r in out] == [0, 1, 2, 3]
    for original, row in zip(CHATS, out):
        messages = row["messages"]
        appended = original[-1]["role"] != "assistant"
        # a conversation ending on a user turn gets an answer appended
        assert len(messages) == len(original) + appended
        for before, after in zip(original, messages):
            assert after["role"] == before["role"]
            if before["role"] != "assistant":
                assert after == before
    # wave 1 answers each conversation's first turn, wave 2 the second conversation's second turn, whose
    # prompt holds the regenerated first answer
    (first_prompts, first), (second_prompts, second) = calls
    render = lambda msgs: tok.apply_chat_template(msgs, add_generation_prompt=True, return_dict=False)  # noqa: E731
    expected_first = [render(CHATS[0][:1]), render(CHATS[1][:2]), render(CHATS[2]), render(CHATS[3][:1])]
    assert first_prompts == expected_first
    assert second_prompts == [render(out[1]["messages"][:4]), render(out[3]["messages"][:3])]
    assert out[1]["messages"][2]["content"] == tok.decode(first[1][0], skip_special_tokens=True)
    # the same answer as the target's own greedy generate() on the template's prompt, unbatched
    ids = torch.tensor([expected_first[1]])
    with torch.no_grad():
        alone = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False)
    assert out[1]["messages"][2]["content"] == tok.decode(alone[0, ids.shape[1] :], skip_special_tokens=True)


def test_text_rows_keep_a_prompt_of_each_window_and_the_target_writes_the_rest(target, tmp_path):
    rows = text_rows()
    cfg = DistillConfig(prompt_tokens=4, max_new_tokens=6, batch_size=3, chunk_rows=100, max_bad_rows=2)
    summary = distill(rows, target, tmp_path / "out", cfg, progress=False)
    out = load_rows(tmp_path / "out", cache_dir=tmp_path / "hf-cache")
    # windows of 4 + 6 tokens (one byte each here): 81 -> 8 windows (the 9th, of 1 token, is no prompt),
    # 20 -> 2, 5 -> 1
    windows = [text[s : s + 4] for text in rows["text"] for s in range(0, len(text), 10) if len(text) - s > 4]
    assert summary["read"] == len(windows) == 11
    assert len(out) == summary["written"] == 11 - summary["failed"] >= 9
    written = {json.loads(line)["index"]: json.loads(line)["text"] for line in _lines(tmp_path / "out")}
    for index, text in written.items():
        assert text.startswith(windows[index]) and len(text) > 4
    assert out["text"] == [written[i] for i in sorted(written)]


def _lines(out):
    return [line for p in sorted(out.glob("part-*.jsonl")) for line in p.read_text().splitlines()]


# -- failures and counts ---------------------------------------------------------------------------


def failing_chats():
    """8 conversations for the Mistral template; two cannot be prompted (rows 2 and 5)."""
    good = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    chats = [good] * 8
    chats[2] = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]  # the template raises
    chats[5] = [{"role": "user", "content": "w" * 600}]  # 600 tokens + max_new_tokens > 512 positions
    return chats


def test_failing_rows_are_counted_with_their_reason_not_fatal(tmp_path):
    target = make_target("mistral")
    rows = chat_rows(tmp_path, failing_chats())
    cfg = DistillConfig(max_new_tokens=4, batch_size=3, chunk_rows=4, max_bad_rows=2)
    summary = distill(rows, target, tmp_path / "out", cfg, progress=False)
    assert (summary["read"], summary["written"], summary["skipped"], summary["failed"]) == (8, 6, 0, 2)
    why = {f["index"]: f["why"] for f in summary["failures"]}
    assert why[2].startswith("the chat template failed at turn 2: After the optional system message")
    assert "does not fit the target's context of 512 tokens" in why[5]
    assert json.loads((tmp_path / "out" / "_summary.json").read_text()) == summary
    out = load_rows(tmp_path / "out", cache_dir=tmp_path / "hf-cache")
    assert len(out) == 6 and sorted(json.loads(line)["index"] for line in _lines(tmp_path / "out")) == [
        0, 1, 3, 4, 6, 7,
    ]  # fmt: skip
    tokens = tokenize_rows(out, target.tokenizer, max_length=64, loss_on="last_assistant")
    assert len(tokens) == 6 and all(any(m) for m in tokens["loss_mask"])


@pytest.mark.parametrize("max_bad_rows", [1, 0.1])
def test_too_many_failures_stop_the_run_after_its_last_finished_chunk(tmp_path, max_bad_rows):
    target = make_target("mistral")
    rows = chat_rows(tmp_path, failing_chats())
    cfg = DistillConfig(max_new_tokens=4, batch_size=3, chunk_rows=4, max_bad_rows=max_bad_rows)
    with pytest.raises(BadRowsError, match=r"(?s)2 of 8 rows failed.*prompt 2 \(row 2\): the chat template"):
        distill(rows, target, tmp_path / "out", cfg, progress=False)
    assert not is_complete(tmp_path / "out") and len(parts(tmp_path / "out")) == 2
    # resuming with a higher threshold skips both finished chunks and counts their failures
    more = DistillConfig(**{**vars(cfg), "max_bad_rows": 2})
    summary = distill(rows, target, tmp_path / "out", more, progress=False)
    assert (summary["read"], summary["skipped"], summary["output_failed"]) == (8, 8, 2)


# -- output and command line -----------------------------------------------------------------------


def test_the_output_trains(target, tmp_path):
    rows = chat_rows(tmp_path)
    distill(rows, target, tmp_path / "out", SAMPLING, progress=False)
    out = load_rows(tmp_path / "out", cache_dir=tmp_path / "hf-cache")
    assert out.column_names == ["messages"] and len(out) == 8
    tokens = tokenize_rows(out, target.tokenizer, max_length=128)
    assert len(tokens) == 8 and all(m[0] == 0 and any(m) for m in tokens["loss_mask"])


def test_command_line_on_a_saved_target(tiny_target_dirs, tmp_path, capsys):
    rows = tmp_path / "chats.jsonl"
    rows.write_text("".join(json.dumps({"messages": m}) + "\n" for m in CHATS))
    out = tmp_path / "out"
    argv = ["--source", str(rows), "--target", str(tiny_target_dirs["qwen2"]), "--out", str(out)]
    argv += ["--max-new-tokens", "4", "--batch-size", "2", "--max-rows", "3", "--no-progress"]
    assert distill_cli(argv) == 0
    assert "read 3 prompts = written 3 + skipped 0 (done before) + failed 0" in capsys.readouterr().out
    assert distill_cli(argv) == 0
    assert "read 3 prompts = written 0 + skipped 3" in capsys.readouterr().out
    rows.write_text(rows.read_text())  # the same prompts written again (a new mtime): still resumed
    os.utime(rows, (1, 1))
    assert distill_cli(argv) == 0
    assert "read 3 prompts = written 0 + skipped 3" in capsys.readouterr().out
    rows.write_text(rows.read_text().replace("Hi", "Hey"))  # other prompts: refused
    with pytest.raises(ValueError, match="source_fingerprint: was"):
        distill_cli(argv)
    assert distill_cli([*argv, "--overwrite", "--seed", "5"]) == 0
    assert "written 3 + skipped 0" in capsys.readouterr().out
    assert len(load_rows(out, cache_dir=tmp_path / "hf-cache")) == 3
