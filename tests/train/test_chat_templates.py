"""Chat templates brought to the target (chat_template, --chat-template), templates that rewrite earlier
turns (Qwen3's own, masked token by token), thinking models (enable_thinking, reasoning keep/drop)."""

import json

import pytest
from test_data_masks import SYSTEM, TURNS, marked, runs

from specheads.data import (
    BadRowsError,
    ChatMaskError,
    load_rows,
    set_chat_template,
    tokenize_chat,
    tokenize_chat_rows,
    tokenize_rows,
)
from specheads.methods import methods
from specheads.train.recipe import load_config

from data_templates import TEMPLATES, family_tokenizer, qwen3_tokenizer

# A Qwen3 conversation whose first answer carries its reasoning in reasoning_content and whose second
# carries it inline, as a thinking model writes it (the template reads both).
QWEN3_CHAT = [
    SYSTEM,
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello!", "reasoning_content": "A greeting."},
    {"role": "user", "content": "Bye"},
    {"role": "assistant", "content": "<think>\nLeaving.\n</think>\n\nCiao"},
]
HEAD = (
    "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
)

# Golden rows: on the byte-level tokenizer every character is one token, and <|im_start|>, <|im_end|>,
# <think> and </think> one token each, so each string pins exactly which tokens are labels («...»).
# Row 0: the render in which the first answer is last, as the target wrote it (its reasoning in a
# <think> block). Row 1: the full render, where Qwen3 drops the first answer's reasoning and its
# <think> block (no label there), and the last answer as written.
QWEN3_ROWS = [
    HEAD + "«<think>\nA greeting.\n</think>\n\nHello!<|im_end|>»\n",
    HEAD + "Hello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
    "<|im_start|>assistant\n«<think>\nLeaving.\n</think>\n\nCiao<|im_end|>»\n",
]
# reasoning: drop -- the answers only; the template still opens every last answer with an empty block
QWEN3_ROWS_DROPPED = [
    HEAD + "«<think>\n\n</think>\n\nHello!<|im_end|>»\n",
    HEAD + "Hello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
    "<|im_start|>assistant\n«<think>\n\n</think>\n\nCiao<|im_end|>»\n",
]


def test_the_qwen3_template_is_qwen3s_own():
    tok = qwen3_tokenizer()
    assert "ns.last_query_index" in tok.chat_template and "enable_thinking" in tok.chat_template
    # the tokens are what the masks below count: one each
    for control in ("<|im_start|>", "<|im_end|>", "<think>", "</think>"):
        assert len(tok(control, add_special_tokens=False)["input_ids"]) == 1
    # the rewrite: the first answer loses its reasoning once a later user turn follows
    alone = tok.apply_chat_template(QWEN3_CHAT[:3], tokenize=False)
    full = tok.apply_chat_template(QWEN3_CHAT, tokenize=False)
    assert "A greeting." in alone and "A greeting." not in full and not full.startswith(alone)


def test_qwen3_multi_turn_masks_token_by_token():
    tok = qwen3_tokenizer()
    rows = tokenize_chat_rows(QWEN3_CHAT, tok, loss_on="assistant")
    assert [marked(tok, ids, mask) for ids, mask in rows] == QWEN3_ROWS
    # each row holds exactly the template's tokens of that render: the prefix ending at the first
    # answer, and the whole conversation
    first, last = rows
    assert first[0] == tok.apply_chat_template(QWEN3_CHAT[:3], tokenize=True, return_dict=False)
    assert last[0] == tok.apply_chat_template(QWEN3_CHAT, tokenize=True, return_dict=False)
    # token by token: the labels are the answer's own tokens, <think> to <|im_end|>, and nothing else
    for (ids, mask), start_text in zip(rows, ["<think>\nA greeting.", "<think>\nLeaving."]):
        start = mask.index(1)
        end = len(mask) - mask[::-1].index(1)
        assert mask == [0] * start + [1] * (end - start) + [0] * (len(mask) - end)
        assert tok.convert_ids_to_tokens(ids[start]) == "<think>"
        assert tok.decode(ids[start:end]).startswith(start_text)
        assert tok.convert_ids_to_tokens(ids[end - 1]) == "<|im_end|>"
        assert tok.decode(ids[end:]) == "\n"  # the template's newline after the end of turn: no label
    # every answer is a label in exactly one row
    assert runs(tok, *first) + runs(tok, *last) == [
        "<think>\nA greeting.\n</think>\n\nHello!<|im_end|>",
        "<think>\nLeaving.\n</think>\n\nCiao<|im_end|>",
    ]
    # the single full render cannot hold the first answer as written: tokenize_chat refuses it
    with pytest.raises(
        ChatMaskError, match="(?s)renders turn 2 \\(assistant\\) differently.*render in which"
    ):
        tokenize_chat(QWEN3_CHAT, tok)
    # the last answer alone is in the full render
    ids, mask = tokenize_chat(QWEN3_CHAT, tok, loss_on="last_assistant")
    assert marked(tok, ids, mask) == QWEN3_ROWS[1]


def test_qwen3_three_turns_give_a_row_an_answer():
    tok = qwen3_tokenizer()
    chat = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "A"},
        {"role": "user", "content": "b"},
        {"role": "assistant", "content": "B"},
        {"role": "user", "content": "c"},
        {"role": "assistant", "content": "C"},
    ]
    rows = tokenize_chat_rows(chat, tok)
    assert [runs(tok, ids, mask) for ids, mask in rows] == [
        ["<think>\n\n</think>\n\nA<|im_end|>"],
        ["<think>\n\n</think>\n\nB<|im_end|>"],
        ["<think>\n\n</think>\n\nC<|im_end|>"],
    ]
    for k, (ids, _) in enumerate(rows):
        assert ids == tok.apply_chat_template(chat[: 2 * k + 2], tokenize=True, return_dict=False)
    # a conversation ending on a user turn: the full render holds no answer as written, and is no row
    rows = tokenize_chat_rows(chat[:5], tok)
    assert [runs(tok, ids, mask) for ids, mask in rows] == [
        ["<think>\n\n</think>\n\nA<|im_end|>"],
        ["<think>\n\n</think>\n\nB<|im_end|>"],
    ]
    # a template that keeps earlier turns gives one row, the full render
    chatml = family_tokenizer("chatml")
    assert len(tokenize_chat_rows(chat, chatml)) == 1
    assert tokenize_chat_rows(chat, chatml) == [tokenize_chat(chat, chatml)]


def test_reasoning_drop_trains_answers_only():
    tok = qwen3_tokenizer()
    rows = tokenize_chat_rows(QWEN3_CHAT, tok, reasoning="drop")
    assert [marked(tok, ids, mask) for ids, mask in rows] == QWEN3_ROWS_DROPPED
    with pytest.raises(ValueError, match="unknown reasoning 'none'"):
        tokenize_chat_rows(QWEN3_CHAT, tok, reasoning="none")


def test_enable_thinking_reaches_every_render():
    tok = set_chat_template(qwen3_tokenizer(), "", enable_thinking=False)
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    # the empty block is the prompt's: the labels start at the answer
    rows = tokenize_chat_rows(QWEN3_CHAT, tok, reasoning="drop")
    assert [runs(tok, ids, mask) for ids, mask in rows] == [["Hello!<|im_end|>"], ["Ciao<|im_end|>"]]
    # with thinking off, an answer with reasoning is one the target never wrote: the error names the
    # cause and the settings that fix it
    with pytest.raises(ChatMaskError, match="(?s)generation prompt.*reasoning: drop.*enable_thinking"):
        tokenize_chat_rows(QWEN3_CHAT, tok)
    # set again, the new value holds
    assert set_chat_template(tok, "", enable_thinking=True).chat_template.count("set enable_thinking") == 1
    assert (
        set_chat_template(tok, "", enable_thinking=False).chat_template
        == set_chat_template(qwen3_tokenizer(), "", enable_thinking=False).chat_template
    )
    on = set_chat_template(qwen3_tokenizer(), "", enable_thinking=True)
    assert on.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    ).endswith("<|im_start|>assistant\n")
    with pytest.raises(ValueError, match="never reads it"):
        set_chat_template(family_tokenizer("chatml"), "", enable_thinking=False)


def test_rewritten_user_turns_cannot_be_found_and_the_error_says_what_to_set():
    tok = qwen3_tokenizer()
    with pytest.raises(ChatMaskError, match="(?s)turn 3 \\(user\\).*loss_on: assistant"):
        tokenize_chat_rows(QWEN3_CHAT, tok, loss_on={"user", "assistant"})


def test_mistral_system_prompt_moves_and_each_answer_trains_where_it_was_written():
    tok = family_tokenizer("mistral")
    rows = tokenize_chat_rows([SYSTEM, *TURNS], tok)
    assert [marked(tok, ids, mask) for ids, mask in rows] == [
        "<s>[INST] Be brief.\n\nHi there[/INST]« Hello!</s>»",
        "<s>[INST] Hi there[/INST] Hello!</s>[INST] Be brief.\n\nBye[/INST]« Ciao</s>»",
    ]


def qwen3_rows(tmp_path, chats):
    tmp_path.mkdir(exist_ok=True)
    path = tmp_path / "qwen3.jsonl"
    path.write_text("".join(json.dumps({"messages": m}) + "\n" for m in chats))
    return load_rows(path, cache_dir=tmp_path / "hf-cache")


def test_tokenize_rows_trains_qwen3_conversations_read_with_their_reasoning(tmp_path):
    rows = qwen3_rows(tmp_path, [QWEN3_CHAT, TURNS])
    # reasoning_content is read into a column of its own (one entry a turn), and only where data has it
    assert rows.column_names == ["messages", "reasoning_content"]
    assert rows[0]["reasoning_content"] == [None, None, "A greeting.", None, None]
    assert "reasoning_content" not in rows[0]["messages"][2]
    assert load_rows(tmp_path / "qwen3.jsonl", streaming=True).column_names == [
        "messages",
        "reasoning_content",
    ]
    assert qwen3_rows(tmp_path / "plain", [TURNS]).column_names == ["messages"]
    tok = qwen3_tokenizer()
    out = tokenize_rows(rows, tok, max_length=512)
    expected = [*tokenize_chat_rows(QWEN3_CHAT, tok), *tokenize_chat_rows(TURNS, tok)]
    for (ids, mask), row in zip(expected, out, strict=True):
        mask = [0, *mask[1:]]
        assert (row["input_ids"], row["loss_mask"]) == (ids, mask)
    assert marked(tok, out[0]["input_ids"], out[0]["loss_mask"]) == QWEN3_ROWS[0]
    dropped = tokenize_rows(rows, tok, max_length=512, reasoning="drop")
    assert marked(tok, dropped[0]["input_ids"], dropped[0]["loss_mask"]) == QWEN3_ROWS_DROPPED[0]
    streamed = tokenize_rows(load_rows(tmp_path / "qwen3.jsonl", streaming=True), tok, max_length=512)
    assert [r["input_ids"] for r in streamed] == out["input_ids"]


def test_a_row_that_cannot_be_masked_is_named_with_its_cause_and_fix(tmp_path):
    rows = qwen3_rows(tmp_path, [QWEN3_CHAT])
    tok = set_chat_template(qwen3_tokenizer(), "", enable_thinking=False)
    with pytest.raises(BadRowsError) as e:
        tokenize_rows(rows, tok, max_length=512, max_bad_rows=0)
    ((where, why),) = e.value.report.examples
    assert where == "row 0" and "generation prompt" in why and "reasoning: drop" in why


def test_a_base_model_is_given_a_template(tmp_path):
    base = _no_template()
    rows = qwen3_rows(tmp_path, [TURNS])
    with pytest.raises(
        ChatMaskError, match="(?s)no chat_template \\(a base model\\).*chat_template: FILE.*--chat-template"
    ):
        tokenize_rows(rows, base, max_length=512)
    with pytest.raises(ChatMaskError, match="chat_template: FILE"):
        tokenize_chat(TURNS, base)
    set_chat_template(base, str(TEMPLATES / "chatml.jinja"))  # a file
    assert base.chat_template == (TEMPLATES / "chatml.jinja").read_text()
    assert tokenize_rows(rows, base, max_length=512)["input_ids"] == [
        tokenize_chat(TURNS, family_tokenizer("chatml"))[0]
    ]
    text = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    assert set_chat_template(base, text).chat_template == text  # the template's text
    with pytest.raises(FileNotFoundError, match="chat_template 'missing.jinja': no such file"):
        set_chat_template(base, "missing.jinja")
    with pytest.raises(ValueError, match="enable_thinking is set but.*no chat_template"):
        set_chat_template(_no_template(), "", True)


def _no_template():
    tok = family_tokenizer("chatml")
    tok.chat_template = None
    return tok


def test_recipe_keys():
    cfg = load_config(None, methods=methods())
    assert (cfg.chat_template, cfg.enable_thinking, cfg.reasoning, cfg.trust_remote_code) == (
        "",
        None,
        "keep",
        False,
    )
    cfg = load_config(
        None,
        ["chat_template=t.jinja", "enable_thinking=false", "reasoning=drop", "trust_remote_code=true"],
        methods=methods(),
    )
    assert (cfg.chat_template, cfg.enable_thinking, cfg.reasoning, cfg.trust_remote_code) == (
        "t.jinja",
        False,
        "drop",
        True,
    )
    assert load_config(None, ["enable_thinking=null"], methods=methods()).enable_thinking is None
    with pytest.raises(ValueError, match="reasoning must be 'keep' or 'drop'"):
        load_config(None, ["reasoning=maybe"], methods=methods())
    with pytest.raises(ValueError, match="enable_thinking' takes true/false"):
        load_config(None, ["enable_thinking=sometimes"], methods=methods())


def test_sources_with_and_without_reasoning_train_together(tmp_path):
    from specheads.data.readers import concatenate_rows

    both = concatenate_rows([qwen3_rows(tmp_path / "a", [QWEN3_CHAT]), qwen3_rows(tmp_path / "b", [TURNS])])
    assert both.column_names == ["messages", "reasoning_content"]
    assert both["reasoning_content"] == [[None, None, "A greeting.", None, None], None]
    tok = qwen3_tokenizer()
    out = tokenize_rows(both, tok, max_length=512)
    expected = [*tokenize_chat_rows(QWEN3_CHAT, tok), *tokenize_chat_rows(TURNS, tok)]
    assert out["input_ids"] == [ids for ids, _ in expected]
