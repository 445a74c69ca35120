"""benchmarks/bench_trainers.py on a chat target: the peers' Vicuna view of it (its tokens as medusa-llm and
eagle-llm count them, the index eagle-llm reads), what the table says each peer changed there, and the rows and
prompts (the target's own answers to the seed prompts; MT-Bench for tau)."""

import json
from pathlib import Path

import pytest

from benchmarks import bench_trainers_eagle as eagle
from benchmarks import bench_trainers_jobs as jobs
from benchmarks import bench_trainers_medusa as medusa


def test_vicuna_text_is_fastchats_one_turn_prompt():
    text = jobs.vicuna_text("def f():", "    return 1")
    assert text == jobs.VICUNA_SYSTEM + " USER: def f(): ASSISTANT:     return 1</s>"


def test_medusa_llms_changes_name_the_runs_own_context_and_rate_and_the_chat_targets_view():
    assert "ChatML" in medusa.CHAT_TARGET_VIEW
    tiny = medusa.medusa_llm_changes(256)
    assert "model_max_length 256 (the tiny target's context), not 2048" in tiny
    assert medusa.CHAT_TARGET_VIEW not in tiny
    chat = medusa.medusa_llm_changes(320, "smollm2", lr=2e-3)
    assert "model_max_length 320, not 2048" in chat and chat[-2:] == ["--learning_rate 0.002 (README: 0.001)",
                                                                     medusa.CHAT_TARGET_VIEW]  # fmt: skip


def test_smollm2_is_evaluated_on_mt_bench_one_question_a_category_in_turn(tmp_path):
    """The tiny target's tau comes from its held-out files; a chat target's from MT-Bench, spread over the
    categories (the first 10 questions are all writing)."""
    import json

    assert jobs.eval_prompts("tiny", tmp_path, 12) == "heldout"
    path = jobs.eval_prompts("smollm2", tmp_path / "e", 9)
    questions = [json.loads(line) for line in open(path)]
    assert len(questions) == 9
    assert (
        len({q["category"] for q in questions[:8]}) == 8
        and questions[8]["category"] == questions[0]["category"]
    )
    assert questions[8]["question_id"] == questions[0]["question_id"] + 1


@pytest.mark.usefixtures("one_thread")
def test_chat_rows_are_the_targets_greedy_answers_to_the_seed_prompts_in_order(
    tiny_target_dirs, tmp_path, monkeypatch
):
    """For a chat target the rows are the project's seed prompts (never MT-Bench or Spec-Bench) answered by
    the target, greedily in its own template; batched with left padding, each answer is the one the prompt
    gets alone. A second run reads them from the specheads cache, without the target; other settings don't."""
    from specheads.core.target import FrozenTarget
    from specheads.data.seed_prompts import seed_prompts

    monkeypatch.setenv("SPECHEADS_CACHE", str(tmp_path / "cache"))
    target = tiny_target_dirs["llama"]
    rows = jobs.chat_conversations(target, 3, 5, seed=0, batch=3)
    assert [p for p, _ in rows] == [r["messages"][0]["content"] for r in seed_prompts(0)[:3]]
    alone = [jobs.chat_conversations(target, i + 1, 5, seed=0, batch=1)[i] for i in range(3)]
    assert rows == alone and all(isinstance(a, str) for _, a in rows)
    assert len(list((tmp_path / "cache" / "bench-conversations").glob("*.json"))) == 4
    loaded = FrozenTarget.from_pretrained

    def no_target(*args, **kwargs):
        raise AssertionError("the target was loaded for answers in the cache")

    monkeypatch.setattr(FrozenTarget, "from_pretrained", no_target)
    assert jobs.chat_conversations(target, 3, 5, seed=0, batch=3) == rows
    monkeypatch.setattr(FrozenTarget, "from_pretrained", loaded)
    assert (
        jobs.chat_conversations(target, 3, 4, seed=0, batch=3) != rows
    )  # fewer answer tokens: answered anew


def chatml_target(path: Path) -> Path:
    """A target folder with SmolLM2's tokenizer conventions over a byte vocabulary: BOS `<|im_start|>` (not
    added), EOS `<|im_end|>` which is also its pad token, unk `<|endoftext|>`."""
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
    vocab.update({ch: i + 3 for i, ch in enumerate(alphabet)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                   pad_token="<|im_end|>", unk_token="<|endoftext|>")  # fmt: skip
    path.mkdir(parents=True)
    fast.save_pretrained(path)
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": len(vocab)}))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    import torch

    save_file({"model.embed_tokens.weight": torch.zeros(len(vocab), 4)}, str(path / "model.safetensors"))
    return path


def test_the_peers_vicuna_view_of_a_chatml_target_masks_as_medusa_llm_counts_tokens(tmp_path):
    """peer_target on a target whose pad token is its EOS (SmolLM2): the view's EOS is `</s>`, its pad and
    unk are the unk token (not the renamed EOS, which would be a new id past the embedding), a BOS goes in
    front, and medusa-llm's Vicuna masking (its preprocess, counted token by token as a Llama tokenizer
    counts) lines up: no "tokenization mismatch", the answer and its `</s>` are labels."""
    from transformers import AutoTokenizer

    view = jobs.peer_target(chatml_target(tmp_path / "smol"), tmp_path / "view", 128)
    tok = AutoTokenizer.from_pretrained(view)
    assert (tok.eos_token, tok.eos_token_id, tok.pad_token_id, tok.unk_token_id) == ("</s>", 2, 0, 0)
    assert len(tok) == 3 + 256 and tok.model_max_length == 128
    prompt, answer = "Name a colour.", "Blue, like the sky."
    text = jobs.vicuna_text(prompt, answer)
    ids = tok(text).input_ids
    assert ids[0] == 1 and ids[-1] == 2  # BOS in front, `</s>` one token at the end
    # medusa-llm 0.1's preprocess (train.py) for one Vicuna turn: sep " ASSISTANT: ", sep2 "</s>"
    turn = text.split("</s>")[0]
    instruction_len = len(tok(turn.split(" ASSISTANT: ")[0] + " ASSISTANT: ").input_ids) - 2
    cur_len = 1 + len(tok(turn).input_ids)
    assert cur_len == len(ids)  # their check: cur_len == total_len, else every label is masked
    labels = ids[1 + instruction_len : cur_len]
    answer_ids = tok(answer + "</s>", add_special_tokens=False).input_ids
    assert labels[-len(answer_ids) :] == answer_ids and len(labels) - len(answer_ids) <= 1
    # eagle-llm 1.2.1's ge_data counts the same way (loss_mask[cur_len:] = 0, no total_len check): the same
    # labels. Its main.py and cnets read lm_head.weight and model.embed_tokens.weight by name through the
    # index; with tied embeddings the view writes the embedding as lm_head.weight in a file of its own.
    from safetensors.torch import load_file

    index = json.loads((view / "model.safetensors.index.json").read_text())["weight_map"]
    assert index == {
        "model.embed_tokens.weight": "model.safetensors",
        "lm_head.weight": "lm_head.safetensors",
    }
    embed = load_file(str(view / "model.safetensors"))["model.embed_tokens.weight"]
    assert load_file(str(view / "lm_head.safetensors"))["lm_head.weight"].equal(embed)
    assert json.loads((view / "config.json").read_text()) == json.loads(
        (tmp_path / "smol/config.json").read_text()
    )


def test_eagle_llms_heads_are_decoded_with_the_rotary_base_its_cnets_uses(tmp_path):
    """eagle-llm 1.2.1's cnets builds its rotary embedding with base 10000 whatever the config says, so its
    heads are imported with that base: SmolLM2's config says 100000, in transformers 5's convention or the
    older one."""
    from specheads.heads.formats.eagle import _rope

    for config in (
        {"rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"}},
        {"rope_theta": 1e5},
    ):
        path = tmp_path / "config.json"
        path.write_text(json.dumps({"hidden_size": 576, **config}))
        got = eagle.eagle_llm_release_config(path)
        assert _rope(got)[0] == 10000.0 and got["hidden_size"] == 576
    # and the table says so where it matters: on a chat target, not the tiny one (whose base is 10000)
    assert eagle.eagle_llm_changes("tiny") == eagle.PEER_CHANGES["eagle-llm"]
    assert eagle.eagle_llm_changes("smollm2")[-1] == eagle.EAGLE_CHAT_TARGET_VIEW
    assert "rotary base" in eagle.EAGLE_CHAT_TARGET_VIEW and "lm_head.weight" in eagle.EAGLE_CHAT_TARGET_VIEW
