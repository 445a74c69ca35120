"""Loss masks from chat templates (golden, token-level, per template family) and tokenize_rows."""

import json
import logging

import datasets
import pytest

from specheads.data import BadRowsError, ChatMaskError, load_rows, tokenize_chat, tokenize_rows

from data_templates import FAMILIES, family_tokenizer

SYSTEM = {"role": "system", "content": "Be brief."}
TURNS = [
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": " Hello! "},
    {"role": "user", "content": "Bye"},
    {"role": "assistant", "content": "Ciao"},
]


def marked(tokenizer, ids, mask) -> str:
    """The decoded tokens with every masked-in run between « and »."""
    out, run, prev = [], [], 0
    for i, m in zip(ids, mask):
        if m != prev:
            out += [tokenizer.decode(run), "«" if m else "»"]
            run, prev = [], m
        run.append(i)
    return "".join([*out, tokenizer.decode(run), "»" if prev else ""])


def runs(tokenizer, ids, mask) -> list[str]:
    """The decoded masked-in runs."""
    found, start = [], None
    for t, m in enumerate([*mask, 0]):
        if m and start is None:
            start = t
        elif not m and start is not None:
            found.append(tokenizer.decode(ids[start:t]))
            start = None
    return found


# Golden renders: the full conversation with the trained tokens between « and ». On the byte-level
# tokenizer every character is one token and every control string one special token, so each line
# pins exactly which tokens are labels.
LLAMA3 = (
    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
    "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\n«Hello!<|eot_id|>»"
    "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\n«Ciao<|eot_id|>»"
)
CHATML = (
    "<|im_start|>system\nBe brief.<|im_end|>\n"
    "<|im_start|>user\nHi there<|im_end|>\n"
    "<|im_start|>assistant\n« Hello! <|im_end|>»\n"
    "<|im_start|>user\nBye<|im_end|>\n"
    "<|im_start|>assistant\n«Ciao<|im_end|>»\n"
)
TINY = (
    "<|bos|><|system|>\nBe brief.<|end|>\n"
    "<|user|>\nHi there<|end|>\n"
    "<|assistant|>\n« Hello! <|end|>»\n"
    "<|user|>\nBye<|end|>\n"
    "<|assistant|>\n«Ciao<|end|>»\n"
)
MISTRAL = "<s>[INST] Hi there[/INST]« Hello!</s>»[INST] Bye[/INST]« Ciao</s>»"


@pytest.mark.parametrize(
    "family, golden, trained",
    [
        ("llama3", LLAMA3, ["Hello!<|eot_id|>", "Ciao<|eot_id|>"]),  # the template trims content
        ("chatml", CHATML, [" Hello! <|im_end|>", "Ciao<|im_end|>"]),
        ("tiny", TINY, [" Hello! <|end|>", "Ciao<|end|>"]),
    ],
)
def test_golden_assistant_masks(family, golden, trained):
    tok = family_tokenizer(family)
    ids, mask = tokenize_chat([SYSTEM, *TURNS], tok, loss_on="assistant")
    assert marked(tok, ids, mask) == golden
    assert runs(tok, ids, mask) == trained  # content + end-of-turn token, nothing after it
    # the ids are exactly what the template gives the target
    assert ids == tok.apply_chat_template([SYSTEM, *TURNS], tokenize=True, return_dict=False)


def test_golden_mistral_masks_and_its_system_prompt():
    tok = family_tokenizer("mistral")
    ids, mask = tokenize_chat(TURNS, tok)
    assert marked(tok, ids, mask) == MISTRAL
    assert runs(tok, ids, mask) == [" Hello!</s>", " Ciao</s>"]
    # Mistral v3 folds the system prompt into the *last* user turn, so the first answer was rendered
    # without it: prefix renders disagree with the full render, and only the last turn can be found.
    with pytest.raises(ChatMaskError, match="(?s)renders turn 2 \\(assistant\\) differently.*last_assistant"):
        tokenize_chat([SYSTEM, *TURNS], tok)
    ids, mask = tokenize_chat([SYSTEM, *TURNS], tok, loss_on="last_assistant")
    assert (
        marked(tok, ids, mask)
        == "<s>[INST] Hi there[/INST] Hello!</s>[INST] Be brief.\n\nBye[/INST]« Ciao</s>»"
    )


@pytest.mark.parametrize("family", ["llama3", "chatml", "tiny"])
def test_last_assistant_and_role_options(family):
    tok = family_tokenizer(family)
    conversation = [SYSTEM, *TURNS]
    eot = {"llama3": "<|eot_id|>", "chatml": "<|im_end|>", "tiny": "<|end|>"}[family]
    ids, mask = tokenize_chat(conversation, tok, loss_on="last_assistant")
    assert runs(tok, ids, mask) == [f"Ciao{eot}"]
    ids, mask = tokenize_chat(conversation, tok, loss_on={"user"})
    user_runs = runs(tok, ids, mask)
    assert len(user_runs) == 2 and all(r.endswith(eot) for r in user_runs)  # header + content + end
    assert user_runs[0].endswith(f"Hi there{eot}") and user_runs[1].endswith(f"Bye{eot}")
    ids, mask = tokenize_chat(conversation, tok, loss_on={"system", "user", "assistant"})
    everything = "".join(runs(tok, ids, mask))
    for m in conversation:
        assert m["content"].strip() in everything
    ids, mask = tokenize_chat(conversation, tok, loss_on="all")
    assert all(mask)


def test_generation_markers_agree_with_prefix_renders():
    tok = family_tokenizer("tiny")
    assert "{% generation %}" in tok.chat_template
    for conversation in ([SYSTEM, *TURNS], TURNS, TURNS[:2], [*TURNS, {"role": "assistant", "content": ""}]):
        by_markers = tokenize_chat(conversation, tok, mask_by="markers")
        assert by_markers == tokenize_chat(conversation, tok, mask_by="prefix")
    with pytest.raises(ValueError, match="needs a template with"):
        tokenize_chat(TURNS, family_tokenizer("chatml"), mask_by="markers")


def test_a_token_merged_across_the_turn_boundary_belongs_to_the_turn():
    """With real BPE merges the header's newline and the answer's indent become one token."""
    import inspect
    import json as json_module

    from specheads.builders.tiny_target import train_tokenizer

    tok = train_tokenizer(
        [inspect.getsource(json_module.decoder), inspect.getsource(json_module.encoder)], 600
    )
    conversation = [{"role": "user", "content": "write it"}, {"role": "assistant", "content": "    return 1"}]
    ids, mask = tokenize_chat(conversation, tok, mask_by="prefix")
    start = mask.index(1)
    assert tok.decode(ids[start : start + 1]).startswith("\n")  # the merged token, header newline included
    assert runs(tok, ids, mask) == ["\n    return 1<|end|>"]
    assert (ids, mask) == tokenize_chat(conversation, tok, mask_by="markers")


def test_degenerate_masks_and_template_failures_show_the_row():
    tok = family_tokenizer("chatml")
    with pytest.raises(ChatMaskError, match=r"(?s)covers no token.*conversation: \[\{\"role\": \"user\""):
        tokenize_chat([{"role": "user", "content": "only a question"}], tok)
    only_answers = family_tokenizer("chatml")
    only_answers.chat_template = (
        "{% for m in messages %}{% if m.role == 'assistant' %}{{ m.content }}{% endif %}{% endfor %}"
    )
    with pytest.raises(ChatMaskError, match="covers every token"):
        tokenize_chat(TURNS[:2], only_answers)
    with pytest.raises(ChatMaskError, match="the chat template failed: After the optional system message"):
        tokenize_chat([TURNS[0], TURNS[0]], family_tokenizer("mistral"))
    no_template = family_tokenizer("chatml")
    no_template.chat_template = None
    with pytest.raises(ChatMaskError, match="has no chat_template"):
        tokenize_chat(TURNS, no_template)
    with pytest.raises(ValueError, match="unknown loss_on 'assistants'"):
        tokenize_chat(TURNS, tok, loss_on="assistants")
    with pytest.raises(ValueError, match="subset of"):
        tokenize_chat(TURNS, tok, loss_on={"tool"})


# -- tokenize_rows ---------------------------------------------------------------------------------


@pytest.fixture
def chat_rows(tmp_path):
    path = tmp_path / "chats.jsonl"
    rows = [{"messages": [SYSTEM, *TURNS]}, {"messages": TURNS[:2]}, {"messages": TURNS}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return load_rows(path, cache_dir=tmp_path / "hf-cache")


def test_tokenize_rows_columns_and_masks(chat_rows):
    tok = family_tokenizer("llama3")
    out = tokenize_rows(chat_rows, tok, max_length=512)
    assert out.column_names == ["input_ids", "loss_mask"] and len(out) == 3
    for row, messages in zip(out, chat_rows["messages"]):
        assert (row["input_ids"], row["loss_mask"]) == tuple(map(list, tokenize_chat(messages, tok)))
        assert row["loss_mask"][0] == 0
    last = tokenize_rows(chat_rows, tok, max_length=512, loss_on="last_assistant")
    assert runs(tok, last[0]["input_ids"], last[0]["loss_mask"]) == ["Ciao<|eot_id|>"]


def test_truncation_drops_rows_left_without_labels(chat_rows, caplog):
    tok = family_tokenizer("chatml")
    with caplog.at_level(logging.WARNING, logger="specheads.data.chat_masks"):
        out = tokenize_rows(chat_rows, tok, max_length=100)
    # without a system turn the template writes Qwen's default one: the first answer starts at token 105
    assert "dropped 2 conversations" in caplog.text and "rows [1, 2]" in caplog.text
    assert len(out) == 1 and out[0]["input_ids"] == tokenize_chat([SYSTEM, *TURNS], tok)[0]  # 84 tokens
    long = tokenize_rows(chat_rows, tok, max_length=110)  # the second turn is cut, the first kept
    assert [len(ids) for ids in long["input_ids"]] == [84, 110, 110]
    assert runs(tok, long[1]["input_ids"], long[1]["loss_mask"]) == [" Hell"]


def test_text_rows_train_every_token_and_long_texts_become_windows():
    tok = family_tokenizer("tiny")
    rows = datasets.Dataset.from_list([{"text": "abcdefghij"}, {"text": "xyz"}])
    out = tokenize_rows(rows, tok, max_length=4)
    assert [tok.decode(ids) for ids in out["input_ids"]] == ["abcd", "efgh", "ij", "xyz"]
    assert out["loss_mask"] == [[0, 1, 1, 1], [0, 1, 1, 1], [0, 1], [0, 1, 1]]
    with_bos = family_tokenizer("tiny")  # like the embedded target's tokenizer: BOS before every text
    from tokenizers import processors

    with_bos.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{with_bos.bos_token} $A", special_tokens=[(with_bos.bos_token, with_bos.bos_token_id)]
    )
    out = tokenize_rows(rows, with_bos, max_length=4)
    assert [with_bos.decode(ids) for ids in out["input_ids"]] == ["<|bos|>abc", "defg", "hij", "<|bos|>xyz"]


def mixed_chat_rows(tmp_path):
    """Three good conversations for the Mistral template, and two bad ones (rows 1 and 3)."""
    rows = [
        {"messages": TURNS},
        {"messages": [TURNS[0], TURNS[0]]},  # the template raises: roles must alternate
        {"messages": TURNS[:2]},
        {"messages": [TURNS[0]]},  # no answer: the mask covers no token
        {"messages": TURNS[2:]},
    ]
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return load_rows(path, cache_dir=tmp_path / "hf-cache")


def test_bad_conversations_are_skipped_up_to_max_bad_rows(tmp_path, caplog):
    rows, tok = mixed_chat_rows(tmp_path), family_tokenizer("mistral")
    with caplog.at_level(logging.WARNING, logger="specheads.data.chat_masks"):
        out = tokenize_rows(rows, tok, max_length=512, max_bad_rows=2)
    assert out.column_names == ["input_ids", "loss_mask"]
    good = [rows[i]["messages"] for i in (0, 2, 4)]
    assert out["input_ids"] == [tokenize_chat(m, tok)[0] for m in good]
    assert "2 of 5 rows could not be tokenised (max_bad_rows=2 allows 2)" in caplog.text
    assert "row 1: the chat template failed: After the optional system message" in caplog.text
    assert "row 3: loss mask for loss_on='assistant' covers no token" in caplog.text
    assert tokenize_rows(rows, tok, max_length=512, max_bad_rows=0.4)["input_ids"] == out["input_ids"]


@pytest.mark.parametrize("max_bad_rows", [1, 0.3, 0.01])
def test_too_many_bad_conversations_stop_and_name_their_rows(tmp_path, max_bad_rows):
    rows, tok = mixed_chat_rows(tmp_path), family_tokenizer("mistral")
    with pytest.raises(BadRowsError, match="2 of 5 rows could not be tokenised") as e:
        tokenize_rows(rows, tok, max_length=512, max_bad_rows=max_bad_rows)
    assert [where for where, _ in e.value.report.examples] == ["row 1", "row 3"]
    # The verdict is taken again when the tokens come from the cache.
    with pytest.raises(BadRowsError, match="2 of 5 rows"):
        tokenize_rows(rows, tok, max_length=512, max_bad_rows=max_bad_rows)


def test_streamed_bad_conversations_follow_the_same_rule(tmp_path):
    path = tmp_path / "mixed.jsonl"
    mixed_chat_rows(tmp_path)
    tok = family_tokenizer("mistral")
    streamed = tokenize_rows(load_rows(path, streaming=True), tok, max_length=512, max_bad_rows=2)
    assert [r["input_ids"] for r in streamed] == [
        tokenize_chat(m, tok)[0] for m in (TURNS, TURNS[:2], TURNS[2:])
    ]
    stopped = tokenize_rows(load_rows(path, streaming=True), tok, max_length=512, max_bad_rows=1)
    with pytest.raises(BadRowsError, match="2 of 4 rows could not be tokenised"):
        list(stopped)  # stops at the second bad row (row 3), before reading the last one


def test_a_second_run_reads_the_cache(chat_rows):
    tok = family_tokenizer("chatml")
    first = tokenize_rows(chat_rows, tok, max_length=512)

    def must_not_run(*args, **kwargs):
        raise AssertionError("tokenised again")

    cached = family_tokenizer("chatml")
    cached.apply_chat_template = must_not_run
    again = tokenize_rows(chat_rows, cached, max_length=512)
    assert again.cache_files == first.cache_files and again[:] == first[:]
    with pytest.raises(AssertionError, match="tokenised again"):  # other settings: a new entry
        tokenize_rows(chat_rows, cached, max_length=256)


def test_streamed_rows_tokenise_lazily(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"messages": TURNS}) + "\n" for _ in range(3)))
    streamed = tokenize_rows(load_rows(path, streaming=True), family_tokenizer("tiny"), max_length=64)
    assert isinstance(streamed, datasets.IterableDataset)
    rows = list(streamed)
    assert len(rows) == 3 and set(rows[0]) == {"input_ids", "loss_mask"}


def test_every_family_has_a_golden_test():
    assert set(FAMILIES) == {"llama3", "chatml", "mistral", "tiny"}
