"""load_rows: every source format, role normalisation, bad rows (reported, skipped or stopping), streaming."""

import json
import logging
import os

import datasets
import pytest

from specheads.data import BadRowsError, DataSourceError, load_rows, normalise_row

CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
]


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


@pytest.fixture
def load(tmp_path):
    """load_rows with the datasets cache kept inside the test's folder."""

    def _load(source, **kw):
        return load_rows(source, cache_dir=tmp_path / "hf-cache", **kw)

    return _load


# -- formats ---------------------------------------------------------------------------------------


def test_text_files_are_one_document_each(tmp_path, load):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("first doc\n\nstill first\n")
    (tmp_path / "docs" / "b.md").write_text("# second\n")
    (tmp_path / "docs" / "ignored.bin").write_bytes(b"\0")
    ds = load(tmp_path / "docs")
    assert isinstance(ds, datasets.Dataset) and ds.column_names == ["text"]
    assert ds["text"] == ["first doc\n\nstill first\n", "# second\n"]


def test_text_split_by_paragraph_and_line(tmp_path, load):
    path = tmp_path / "a.txt"
    path.write_text("one\ntwo\n\n\nthree\n\nfour\n")
    assert load(path, text_split="paragraph")["text"] == ["one\ntwo", "three", "four"]
    assert load(path, text_split="line")["text"] == ["one", "two", "three", "four"]
    with pytest.raises(ValueError, match="unknown text_split 'words'"):
        load(path, text_split="words")


def test_jsonl_text_rows(tmp_path, load):
    ds = load(write_jsonl(tmp_path / "t.jsonl", [{"text": "alpha", "id": 1}, {"text": "beta", "id": "x"}]))
    assert ds.column_names == ["text"] and ds["text"] == ["alpha", "beta"]


def test_sharegpt_json_array_with_role_names_normalised(tmp_path, load):
    rows = [
        {
            "id": "a",
            "conversations": [
                {"from": "system", "value": "sys"},
                {"from": "human", "value": "q1"},
                {"from": "gpt", "value": "a1"},
                {"from": "Human", "value": "q2"},
                {"from": "chatgpt", "value": "a2"},
                {"from": "user", "value": "q3"},
                {"from": "bot", "value": "a3"},
            ],
        },
        {"id": 7, "conversations": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
    ]
    (tmp_path / "sharegpt.json").write_text(json.dumps(rows, indent=2))
    ds = load(tmp_path / "sharegpt.json")
    assert ds.column_names == ["messages"]
    assert [m["role"] for m in ds[0]["messages"]] == ["system"] + ["user", "assistant"] * 3
    assert [m["content"] for m in ds[0]["messages"]] == ["sys", "q1", "a1", "q2", "a2", "q3", "a3"]
    assert ds[1]["messages"] == [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]


def test_openai_messages_with_text_parts(tmp_path, load):
    parts = [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo!"}]
    rows = [
        {"messages": CHAT},
        {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": parts}]},
    ]
    ds = load(write_jsonl(tmp_path / "openai.jsonl", rows))
    assert ds[0]["messages"] == CHAT
    assert ds[1]["messages"][1] == {"role": "assistant", "content": "Hello!"}


def test_ultrachat_layouts(tmp_path, load):
    rows = [
        {"id": "0", "data": ["q1", "a1", "q2", "a2"]},  # stingning/ultrachat
        {
            "prompt": "q",
            "prompt_id": "p",
            "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
        },
    ]
    ds = load(write_jsonl(tmp_path / "ultrachat.jsonl", rows))
    assert [m["role"] for m in ds[0]["messages"]] == ["user", "assistant", "user", "assistant"]
    assert [m["content"] for m in ds[0]["messages"]] == ["q1", "a1", "q2", "a2"]
    assert ds[1]["messages"][0] == {"role": "user", "content": "q"}


def test_a_directory_skips_names_starting_with_dot_or_underscore(tmp_path, load):
    root = tmp_path / ".cache" / "distilled"  # a hidden folder *above* the source hides nothing
    (root / "_chunks").mkdir(parents=True)
    (root / ".hidden").mkdir()
    write_jsonl(root / "part-00001.jsonl", [{"text": "b"}])
    write_jsonl(root / "part-00000.jsonl", [{"text": "a"}])
    (root / "_summary.json").write_text('{"complete": true}')  # metadata, not a row
    (root / "_chunks" / "00000.json").write_text('{"written": 1}')
    (root / ".part-00002.jsonl.tmp").write_text("half a row")
    write_jsonl(root / ".hidden" / "x.jsonl", [{"text": "x"}])
    assert load(root)["text"] == ["a", "b"]


def test_dataset_saved_to_disk_and_its_splits(tmp_path, load):
    train = datasets.Dataset.from_list(
        [{"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}]
    )
    test = datasets.Dataset.from_list([{"text": "held out"}])
    train.save_to_disk(tmp_path / "single")
    datasets.DatasetDict({"train": train, "test": test}).save_to_disk(tmp_path / "dict")
    assert load(tmp_path / "single")[0]["messages"][1] == {"role": "assistant", "content": "a"}
    assert load(tmp_path / "dict", split="test")["text"] == ["held out"]
    with pytest.raises(DataSourceError, match=r"no split 'validation'; it has \['test', 'train'\]"):
        load(tmp_path / "dict", split="validation")


def test_parquet_and_glob(tmp_path, load):
    datasets.Dataset.from_list([{"messages": CHAT}]).to_parquet(tmp_path / "part-0.parquet")
    datasets.Dataset.from_list([{"text": "x"}]).to_parquet(tmp_path / "other.parquet")
    assert load(tmp_path / "part-0.parquet")[0]["messages"] == CHAT
    write_jsonl(tmp_path / "a.jsonl", [{"text": "a"}])
    write_jsonl(tmp_path / "b.jsonl", [{"text": "b"}])
    assert load(str(tmp_path / "*.jsonl"))["text"] == ["a", "b"]


def test_hub_name_uses_load_dataset_and_fails_clearly_offline(monkeypatch, load):
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True, raising=False)
    with pytest.raises(ConnectionError, match="'someorg/chats' is not a local file or directory.*hub"):
        load("someorg/chats", split="train_sft")


# -- clear errors ----------------------------------------------------------------------------------


def test_errors_name_the_bad_input(tmp_path, load):
    with pytest.raises(FileNotFoundError, match="no_such.jsonl"):
        load(tmp_path / "no_such.jsonl")
    with pytest.raises(FileNotFoundError, match="matches no files"):
        load(str(tmp_path / "*.jsonl"))
    (tmp_path / "data.csv").write_text("a,b\n")
    with pytest.raises(DataSourceError, match=r"data.csv: unknown file type '.csv'"):
        load(tmp_path / "data.csv")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataSourceError, match="no data files"):
        load(tmp_path / "empty")
    (tmp_path / "mixed").mkdir()
    (tmp_path / "mixed" / "a.txt").write_text("x")
    write_jsonl(tmp_path / "mixed" / "b.jsonl", [{"text": "y"}])
    with pytest.raises(DataSourceError, match=r"mixes kinds of files \(json, text\)"):
        load(tmp_path / "mixed")
    (tmp_path / "broken.json").write_text('[{"text": "a"}, {"text": ]')
    with pytest.raises(DataSourceError, match="broken.json: not valid JSON"):
        load(tmp_path / "broken.json")
    with pytest.raises(DataSourceError, match=r"no readable rows:\n.*nothing.jsonl:1: neither 'text' nor"):
        load(write_jsonl(tmp_path / "nothing.jsonl", [{"prompt": "x"}]))
    with pytest.raises(ValueError, match="split='test' names a split of a saved DatasetDict"):
        load(tmp_path / "nothing.jsonl", split="test")
    for bad in (-1, 1.5, "1", True):
        with pytest.raises(ValueError, match="max_bad_rows"):
            load(tmp_path / "nothing.jsonl", max_bad_rows=bad)


def test_row_reasons():
    assert normalise_row({"text": "t", "messages": CHAT}) == {"messages": CHAT}  # conversation first
    cases = {
        "neither 'text' nor a conversation": {"prompt": "x"},
        "unknown role 'tool'": {"messages": [{"role": "tool", "content": "x"}]},
        "needs 'role'/'content'": {"conversations": [{"from": "human"}]},
        "non-empty list of turns": {"messages": []},
        "content must be a string": {"messages": [{"role": "user", "content": 3}]},
        "empty text": {"text": ""},
        "expected a JSON object": ["a"],
    }
    for reason, row in cases.items():
        with pytest.raises(ValueError, match=reason):
            normalise_row(row)


# -- bad rows --------------------------------------------------------------------------------------

GOOD = {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}


def mixed_file(tmp_path, good=20):
    rows = [GOOD] * good
    rows[2] = "{not json"
    rows[5] = {"conversations": [{"from": "alien", "value": "x"}]}
    rows[9] = {"text": "a text row among conversations"}
    return write_jsonl(tmp_path / "mixed.jsonl", rows)


def test_bad_rows_are_skipped_and_reported_with_line_numbers(tmp_path, load, caplog):
    path = mixed_file(tmp_path)
    with caplog.at_level(logging.WARNING, logger="specheads.data.readers"):
        ds = load(path, max_bad_rows=3)
    assert len(ds) == 17 and ds.column_names == ["messages"]
    log = caplog.text
    assert "3 of 20 rows could not be read" in log
    assert f"{path}:3: not valid JSON" in log
    assert f"{path}:6: conversations[0]: unknown role 'alien'" in log
    assert f"{path}:10: a 'text' row in a source of 'messages' rows" in log


@pytest.mark.parametrize("max_bad_rows", [2, 0.1, 0])
def test_too_many_bad_rows_stop(tmp_path, load, max_bad_rows):
    with pytest.raises(BadRowsError, match=r"3 of 20 rows could not be read") as e:
        load(mixed_file(tmp_path), max_bad_rows=max_bad_rows)
    assert [where.rsplit(":", 1)[1] for where, _ in e.value.report.examples] == ["3", "6", "10"]
    assert load(mixed_file(tmp_path), max_bad_rows=0.15).num_rows == 17  # 3 <= 0.15 * 20


def test_a_second_load_reads_the_cache_and_a_changed_file_is_read_again(tmp_path, load):
    path = write_jsonl(tmp_path / "t.jsonl", [{"text": "a"}, {"text": "b"}])
    first, again = load(path), load(path)
    assert first.cache_files == again.cache_files and first._fingerprint == again._fingerprint
    write_jsonl(path, [{"text": "a"}, {"text": "b"}, {"text": "c"}])
    os.utime(path, ns=(1, 1))
    assert load(path)["text"] == ["a", "b", "c"]


# -- streaming -------------------------------------------------------------------------------------


def test_streaming_jsonl_and_text_give_the_same_rows(tmp_path, load):
    path = mixed_file(tmp_path)
    streamed = load(path, streaming=True, max_bad_rows=3)
    assert isinstance(streamed, datasets.IterableDataset)
    assert list(streamed) == list(load(path, max_bad_rows=3))
    text = tmp_path / "big.txt"
    text.write_text("".join(f"line {i}\n" for i in range(1000)))
    streamed = load(text, streaming=True, text_split="line")
    assert [r["text"] for r in streamed] == [f"line {i}" for i in range(1000)]


def test_streaming_stops_at_the_threshold(tmp_path, load):
    streamed = load(mixed_file(tmp_path), streaming=True, max_bad_rows=1)
    with pytest.raises(BadRowsError, match="2 of 6 rows could not be read"):
        list(streamed)  # stops at the second bad row (line 6), before reading the rest
