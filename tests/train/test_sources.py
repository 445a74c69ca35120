"""Named sources: stdlib rows built once and read from the cache (so tokenisation is cached too), and
stdlib-distilled, distilled once per target; the tiny recipes that train on it."""

import json
from pathlib import Path

import datasets
import pytest
import yaml

from specheads.cli import main as cli_main
from specheads.data import chat_masks, stdlib_corpus, tokenize_rows
from specheads.data import distillation as distill
from specheads.data.distillation import DistillConfig
from specheads.methods import methods
from specheads.train import sources
from specheads.train.recipe import load_config

from helpers import tiny_tokenizer

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def fake_stdlib(tmp_path, monkeypatch) -> stdlib_corpus.Corpus:
    """A corpus of 100 small modules (one of them, mod080.py, held out) and a private cache."""
    texts = {f"mod{i:03d}.py": f"def f{i}(x):\n    return x * {i}\n" * (1 + i % 4) for i in range(100)}
    corpus = stdlib_corpus.Corpus(key="fake-1", texts=texts)
    monkeypatch.setattr(stdlib_corpus, "stdlib_corpus", lambda: corpus)
    monkeypatch.setenv("SPECHEADS_CACHE", str(tmp_path / "cache"))
    return corpus


def fail(*args, **kwargs):
    raise AssertionError("not cached: called again")


def test_stdlib_rows_are_built_once_then_read_from_disk(fake_stdlib, tmp_path, monkeypatch):
    train, heldout = sources.stdlib_rows(heldout=False), sources.stdlib_rows(heldout=True)
    assert heldout["text"] == [fake_stdlib.texts["mod080.py"]]
    assert train["text"] == [fake_stdlib.texts[f"mod{i:03d}.py"] for i in range(100) if i != 80]
    cache = tmp_path / "cache" / "stdlib-rows"
    assert all(Path(f["filename"]).is_relative_to(cache) for f in train.cache_files)
    with monkeypatch.context() as m:
        m.setattr(sources.datasets.Dataset, "from_dict", fail)
        again = sources.stdlib_rows(heldout=False)
    assert again._fingerprint == train._fingerprint and again.cache_files == train.cache_files
    # another corpus (another key) is built anew
    changed = {**fake_stdlib.texts, "mod001.py": "changed = True\n"}
    monkeypatch.setattr(stdlib_corpus, "stdlib_corpus", lambda: stdlib_corpus.Corpus("fake-2", changed))
    assert sources.stdlib_rows(heldout=False)["text"][1] == "changed = True\n"


def test_tokenising_the_stdlib_a_second_time_reads_the_cache(fake_stdlib, monkeypatch):
    tok = tiny_tokenizer()
    first = tokenize_rows(sources.stdlib_rows(heldout=False), tok, max_length=64, loss_on="all")
    monkeypatch.setattr(chat_masks, "_tokenize_batch", fail)
    again = tokenize_rows(sources.stdlib_rows(heldout=False), tok, max_length=64, loss_on="all")
    assert again.cache_files == first.cache_files and again[:] == first[:]
    with pytest.raises(AssertionError, match="not cached"):  # the patch bites when the cache misses
        tokenize_rows(sources.stdlib_rows(heldout=False), tok, max_length=32, loss_on="all")


SMALL = DistillConfig(
    prompt_tokens=4, max_new_tokens=6, batch_size=8, chunk_rows=8, max_rows=12, max_bad_rows=3
)


def test_stdlib_distilled_is_distilled_once_per_target(fake_stdlib, tiny_target_dirs, monkeypatch):
    monkeypatch.setattr(distill, "STDLIB_DISTILLED", SMALL)
    settings = {"data": ["stdlib-distilled"], "max_steps": 3, "batch_size": 4}  # one epoch: 12 rows
    cfg = load_config(None, {"target": str(tiny_target_dirs["llama"]), **settings}, methods=methods())
    train, evaluate = sources.rows_for(cfg)
    assert train.column_names == ["text"] and 9 <= len(train) <= 12
    assert evaluate["text"] == sources.stdlib_rows(heldout=True)["text"]  # the raw held-out files
    texts = sources.stdlib_rows(heldout=False)["text"]
    prompts = {t[s : s + 4] for t in texts for s in range(0, len(t), 10)}  # windows of 4 + 6 bytes
    assert all(text[:4] in prompts for text in train["text"])
    monkeypatch.setattr(distill, "generate_batch", fail)
    again, _ = sources.rows_for(cfg)
    assert again["text"] == train["text"] and again._fingerprint == train._fingerprint
    other = load_config(None, {"target": str(tiny_target_dirs["qwen3"]), **settings}, methods=methods())
    with pytest.raises(AssertionError, match="not cached"):  # another target distills its own
        sources.rows_for(other)
    longer = load_config(
        None, {"target": str(tiny_target_dirs["llama"]), **settings, "max_steps": 4}, methods=methods()
    )
    with pytest.raises(AssertionError, match="not cached"):  # a longer run distills its own epoch
        sources.rows_for(longer)


def test_stdlib_distilled_is_one_epoch_of_the_recipe(fake_stdlib, tiny_target_dirs, monkeypatch):
    monkeypatch.setattr(distill, "STDLIB_DISTILLED", SMALL)  # SMALL.max_rows (12) is not what counts
    settings = {"data": ["stdlib-distilled"], "max_steps": 5, "batch_size": 2, "grad_accum": 2}
    cfg = load_config(None, {"target": str(tiny_target_dirs["llama"]), **settings}, methods=methods())
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert sources.epoch_rows(cfg) == 20
    monkeypatch.setenv("WORLD_SIZE", "3")  # accelerate launch: each global batch spans the processes
    assert sources.epoch_rows(cfg) == 60
    monkeypatch.delenv("WORLD_SIZE")
    train, _ = sources.rows_for(cfg)
    assert 16 <= len(train) <= 20  # a window the target ends at once (EOS) is skipped, not replaced


@pytest.mark.parametrize("method", ["medusa", "eagle", "eagle3"])
def test_the_tiny_recipes_train_on_distilled_data_and_their_raw_twins_on_the_source(method):
    distilled = yaml.safe_load((REPO / "recipes" / "tiny" / f"{method}.yaml").read_text())
    raw = yaml.safe_load((REPO / "recipes" / "tiny" / f"{method}-raw.yaml").read_text())
    assert distilled.pop("data") == ["stdlib-distilled"] and raw.pop("data") == ["stdlib"]
    assert distilled["eval_data"] == raw["eval_data"] == ["stdlib"]  # both judged on the raw held-out files
    assert raw.pop("output_dir") == distilled.pop("output_dir") + "-raw"
    assert raw == distilled  # the same budget, the same everything else
    # each window a whole row once tokenize_rows adds the BOS
    data = distill.STDLIB_DISTILLED
    assert data.prompt_tokens + data.max_new_tokens + 1 == distilled["max_length"]
    assert data.max_rows == distilled["max_steps"] * distilled["batch_size"]  # the documented default


@pytest.mark.parametrize("method", ["medusa", "eagle", "eagle3"])
def test_the_distilled_recipes_train(method, fake_stdlib, tiny_target_dirs, tmp_path, monkeypatch):
    monkeypatch.setattr(distill, "STDLIB_DISTILLED", SMALL)
    recipe = REPO / "recipes" / "tiny" / f"{method}.yaml"
    out = tmp_path / "run"
    overrides = [f"target={tiny_target_dirs['llama']}", "max_length=16", "max_steps=2", "eval_every=2"]
    overrides += ["eval_batches=1", "warmup_steps=1", f"output_dir={out}"]
    assert cli_main(["train", str(recipe), *overrides, "--no-progress"]) == 0
    assert (out / "model.safetensors").is_file() and (out / "train_summary.json").is_file()


def test_max_bad_rows_is_a_recipe_key_for_reading_and_for_masking(tmp_path):
    """A row that cannot be read (bad JSON) and one whose mask is empty (no assistant turn) each count
    against the recipe's max_bad_rows: at 0 the run stops naming the row, at 1 it skips it."""
    from specheads.data import BadRowsError
    from specheads.train.prepare import make_data

    good = json.dumps(
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hey"}]}
    )
    unanswered = json.dumps({"messages": [{"role": "user", "content": "nobody answers"}]})
    broken, unmaskable = tmp_path / "broken.jsonl", tmp_path / "unmaskable.jsonl"
    broken.write_text("\n".join([good] * 8 + ["{not json"]) + "\n")
    unmaskable.write_text("\n".join([good] * 8 + [unanswered]) + "\n")
    settings = {"eval_fraction": 0, "max_length": 64}

    def config(path, max_bad_rows):
        return load_config(
            None, {**settings, "data": [str(path)], "max_bad_rows": max_bad_rows}, methods=methods()
        )

    with pytest.raises(BadRowsError, match=r"broken\.jsonl:9"):  # the broken line, by number
        sources.rows_for(config(broken, 0))
    assert len(sources.rows_for(config(broken, 1))[0]) == 8
    with pytest.raises(BadRowsError, match="row 8"):  # its mask would be empty
        make_data(config(unmaskable, 0), tiny_tokenizer())
    assert len(make_data(config(unmaskable, 1), tiny_tokenizer())[0]) == 8


def chat(prompt: str, answer: str) -> dict:
    return {"messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]}


def test_the_held_out_split_keeps_every_answer_to_a_prompt_on_one_side(tmp_path):
    """Two distillations of the same prompts (greedy, sampled) in two folders: a held-out prompt takes all
    its answers with it, so no held-out row's prompt is trained on. One answer a prompt: the row split as
    before, row for row."""
    greedy, sampled = tmp_path / "greedy.jsonl", tmp_path / "sampled.jsonl"
    greedy.write_text("".join(json.dumps(chat(f"prompt {i}", f"greedy {i}")) + "\n" for i in range(50)))
    sampled.write_text("".join(json.dumps(chat(f"prompt {i}", f"sampled {i}")) + "\n" for i in range(50)))
    cfg = load_config(
        None, {"data": [str(greedy), str(sampled)], "eval_fraction": 0.1, "seed": 3}, methods=methods()
    )
    train, held = sources.rows_for(cfg)
    prompts = {
        side: [m[0]["content"] for m in rows["messages"]] for side, rows in (("t", train), ("h", held))
    }
    assert len(prompts["h"]) == 10 and len(set(prompts["h"])) == 5  # 5 prompts, both answers each
    assert not set(prompts["h"]) & set(prompts["t"]) and len(prompts["t"]) == 90
    assert sources.rows_for(cfg)[1]["messages"] == held["messages"]  # the seed decides it
    one = load_config(None, {"data": [str(greedy)], "eval_fraction": 0.1, "seed": 3}, methods=methods())
    rows = sources.rows_for(one)
    split = datasets.concatenate_datasets([sources._load(str(greedy), one)]).train_test_split(
        test_size=0.1, seed=3
    )
    assert (
        rows[1]["messages"] == split["test"]["messages"] and rows[0]["messages"] == split["train"]["messages"]
    )
    same = tmp_path / "same.jsonl"  # one prompt answered 20 times: nothing to split by, so the rows are
    same.write_text("".join(json.dumps(chat("prompt", f"answer {i}")) + "\n" for i in range(20)))
    train, held = sources.rows_for(
        load_config(None, {"data": [str(same)], "eval_fraction": 0.1}, methods=methods())
    )
    assert (len(train), len(held)) == (18, 2)
