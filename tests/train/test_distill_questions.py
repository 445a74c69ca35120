"""`specheads distill --source` on question files (MT-Bench / Spec-Bench's `turns` format), through the real
CLI: each question a conversation whose answers the target writes turn by turn; the evaluation sets refused."""

import json

import pytest

from specheads.data import distillation as distill_mod
from specheads.methods import methods

from helpers import command

pytestmark = pytest.mark.usefixtures("one_thread")
distill_cli = command("distill")

OWN = [
    {"question_id": 1, "category": "writing", "turns": ["Write a line about tea.", "Now one about coffee."]},
    {"question_id": 2, "category": "math", "turns": ["What is 2 + 3?"]},
]
EVAL = [{"question_id": 81, "category": "writing", "turns": ["Compose a travel blog post.", "Rewrite it."]}]


def write_questions(path, questions):
    path.write_text("".join(json.dumps(q) + "\n" for q in questions))
    return path


@pytest.fixture
def eval_data(tmp_path, monkeypatch):
    """A folder of one's own copies of the evaluation sets, found by name through $SPECHEADS_DATA."""
    root = tmp_path / "shared-data"
    root.mkdir()
    write_questions(root / "mt_bench_question.jsonl", EVAL)
    write_questions(root / "spec_bench_question.jsonl", EVAL)
    monkeypatch.setenv("SPECHEADS_DATA", str(root))
    return root


def distill_argv(source, target, out, *extra):
    return ["--source", str(source), "--target", str(target), "--out", str(out), "--no-progress", *extra]


def rows_of(out):
    return [json.loads(line) for p in sorted(out.glob("part-*.jsonl")) for line in p.read_text().splitlines()]


def spy_generate(monkeypatch):
    calls, real = [], distill_mod.generate_batch

    def spy(model, prompts, cfg, **kw):
        calls.append(prompts)
        return real(model, prompts, cfg, **kw)

    monkeypatch.setattr(distill_mod, "generate_batch", spy)
    return calls


def test_each_question_is_a_conversation_the_target_answers_turn_by_turn(
    tiny_target_dirs, tmp_path, eval_data, monkeypatch, capsys
):
    from transformers import AutoTokenizer

    target = tiny_target_dirs["llama"]
    calls = spy_generate(monkeypatch)
    source = write_questions(tmp_path / "mine.jsonl", OWN)
    out = tmp_path / "out"
    assert distill_cli(distill_argv(source, target, out, "--max-new-tokens", "6")) == 0
    assert "read 2 prompts = written 2" in capsys.readouterr().out
    rows = rows_of(out)
    assert [r["index"] for r in rows] == [0, 1]
    for question, row in zip(OWN, rows):
        roles = [m["role"] for m in row["messages"]]
        assert roles == ["user", "assistant"] * len(question["turns"])
        assert [m["content"] for m in row["messages"][::2]] == question["turns"]
        assert all(m["content"] for m in row["messages"][1::2])  # every answer written by the target
    # wave 1 answers both first turns; wave 2 asks turn 2 after the target's own first answer
    tok = AutoTokenizer.from_pretrained(target)
    render = lambda msgs: tok.apply_chat_template(msgs, add_generation_prompt=True, return_dict=False)  # noqa: E731
    first = [render([{"role": "user", "content": q["turns"][0]}]) for q in OWN]
    assert calls == [first, [render(rows[0]["messages"][:3])]]


@pytest.mark.parametrize("source", ["mt-bench", "spec-bench", "copy"])
def test_evaluation_questions_are_refused_before_the_target_loads(
    source, tiny_target_dirs, tmp_path, eval_data, monkeypatch
):
    calls = spy_generate(monkeypatch)
    if source == "copy":  # a user's file holding one evaluation question among its own
        source = write_questions(tmp_path / "mixed.jsonl", [*OWN, {**EVAL[0], "question_id": 9}])
    out = tmp_path / "out"
    with pytest.raises(
        ValueError, match=r"holds evaluation questions \(2 turns of mt-bench, 2 turns of spec-bench"
    ):
        distill_cli(distill_argv(source, tiny_target_dirs["llama"], out))
    assert calls == [] and not list(out.glob("part-*"))


def test_allow_eval_prompts_distils_them_with_a_warning(tiny_target_dirs, tmp_path, eval_data, caplog):
    out = tmp_path / "out"
    argv = distill_argv("mt-bench", tiny_target_dirs["llama"], out, "--max-new-tokens", "4")
    assert distill_cli([*argv, "--allow-eval-prompts"]) == 0
    assert "WARNING" in caplog.text and "holds evaluation questions" in caplog.text
    (row,) = rows_of(out)
    assert [m["content"] for m in row["messages"][::2]] == EVAL[0]["turns"]
    settings = json.loads((out / "_settings.json").read_text())
    assert settings["source"] == "mt-bench"


def test_a_named_set_that_cannot_be_found_names_the_flag_and_the_fix(tiny_target_dirs, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECHEADS_DATA", str(tmp_path / "nowhere"))
    monkeypatch.setattr("specheads.core.question_sets.data_roots", lambda: [tmp_path / "nowhere"])
    with pytest.raises(
        FileNotFoundError, match="--source spec-bench: spec_bench_question.jsonl is in none of"
    ):
        distill_cli(distill_argv("spec-bench", tiny_target_dirs["llama"], tmp_path / "out"))


# -- prompts that cannot fit -----------------------------------------------------------------------

LONG = {"question_id": 3, "category": "writing", "turns": ["tea " * 150]}  # ~600 byte tokens
LONGER = {"question_id": 4, "category": "writing", "turns": ["coffee " * 100, "tea " * 30]}


@pytest.mark.parametrize(
    "limit, expected",
    [
        (
            [],
            r"2 of 4 prompts cannot fit the target's context of 512 tokens: .* the longest \(prompt 3, row 3\) needs",
        ),
        (
            ["--max-length", "64"],
            r"3 of 4 prompts cannot fit max_length=64: .* the longest \(prompt 3, row 3\) needs",
        ),
    ],
)
def test_prompts_that_cannot_fit_are_refused_before_any_generation(
    limit, expected, tiny_target_dirs, tmp_path, monkeypatch
):
    calls = spy_generate(monkeypatch)
    source = write_questions(tmp_path / "mine.jsonl", [*OWN, LONG, LONGER])
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=expected + r" \d+ tokens\. Nothing was generated; pass --skip-long"):
        distill_cli(distill_argv(source, tiny_target_dirs["llama"], out, "--max-new-tokens", "8", *limit))
    assert calls == [] and not list(out.glob("part-*"))


def test_skip_long_leaves_them_out_and_counts_them(tiny_target_dirs, tmp_path, monkeypatch, capsys):
    calls = spy_generate(monkeypatch)
    source = write_questions(tmp_path / "mine.jsonl", [LONG, *OWN, LONGER])
    out = tmp_path / "out"
    argv = distill_argv(source, tiny_target_dirs["llama"], out, "--max-new-tokens", "8", "--skip-long")
    assert distill_cli(argv) == 0
    printed = capsys.readouterr().out
    assert "read 2 prompts = written 2" in printed and "left out 2 prompts that cannot fit" in printed
    assert [r["index"] for r in rows_of(out)] == [1, 2]  # numbered as in the source
    summary = json.loads((out / "_summary.json").read_text())
    assert summary["too_long"] == 2 and [p["index"] for p in summary["too_long_prompts"]] == [0, 3]
    assert all(p["tokens"] > 512 for p in summary["too_long_prompts"])
    assert all(len(prompt) + 8 <= 512 for batch in calls for prompt in batch)
    assert distill_cli(argv) == 0  # resumes: the same prompts, nothing generated again
    assert "read 2 prompts = written 0 + skipped 2" in capsys.readouterr().out


def test_the_new_settings_are_recorded_only_where_they_change_the_output():
    """Folders and stdlib-distilled caches made before max_length / long_prompts existed stay resumable."""
    from specheads.data.distillation import DistillConfig, settings_of

    plain = settings_of(DistillConfig())
    assert "max_length" not in plain and "long_prompts" not in plain
    assert settings_of(DistillConfig(long_prompts="refuse")) == plain
    assert settings_of(DistillConfig(long_prompts="skip", max_length=64)) == {
        **plain,
        "long_prompts": "skip",
        "max_length": 64,
    }


# -- capped answers --------------------------------------------------------------------------------


def test_capped_answers_are_marked_counted_and_left_out_of_training_by_default(
    tiny_target_dirs, tmp_path, monkeypatch, capsys
):
    from specheads.data import load_rows
    from specheads.train.recipe import load_config
    from specheads.train.sources import rows_for

    real = distill_mod.generate_batch

    def question_two_ends(model, prompts, cfg, **kw):  # the second question's answer ends on its own
        results = real(model, prompts, cfg, **kw)
        return [
            (tokens, ended or (len(prompts) == 2 and b == 1)) for b, (tokens, ended) in enumerate(results)
        ]

    monkeypatch.setattr(distill_mod, "generate_batch", question_two_ends)
    source = write_questions(tmp_path / "mine.jsonl", OWN)
    out = tmp_path / "out"
    assert distill_cli(distill_argv(source, tiny_target_dirs["llama"], out, "--max-new-tokens", "3")) == 0
    assert (
        '1 of them hold an answer cut off at --max-new-tokens 3 (marked "capped"' in capsys.readouterr().out
    )
    rows = rows_of(out)
    assert rows[0]["capped"] is True and "capped" not in rows[1]  # 3 random tokens: no end token
    summary = json.loads((out / "_summary.json").read_text())
    assert summary["output_capped"] == 1 and summary["output_rows"] == 2

    cache = tmp_path / "hf-cache"
    kept = load_rows(out, cache_dir=cache, include_capped=False)
    assert [m["content"] for m in kept[0]["messages"][::2]] == OWN[1]["turns"]  # the finished one alone
    assert len(load_rows(out, cache_dir=cache)) == 2  # reading rows keeps them; training does not
    for include, expected in (("false", 1), ("true", 2)):
        cfg = load_config(
            None, [f"data={out}", f"include_capped={include}", "eval_fraction=0"], methods=methods()
        )
        train, _ = rows_for(cfg)
        assert len(train) == expected
    # nothing but capped rows: the error says why the source reads as empty
    only_capped = tmp_path / "capped.jsonl"
    only_capped.write_text(json.dumps(rows[0]) + "\n")
    with pytest.raises(
        ValueError, match=r'no readable rows \(it is empty or holds only rows marked "capped"'
    ):
        load_rows(only_capped, cache_dir=cache, include_capped=False)
