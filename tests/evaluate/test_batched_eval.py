"""evaluate_batched (`specheads eval --batch-size B`): records in `evaluate`'s format, one per prompt, whose
outputs equal the target's own batched `generate`, with each group's seconds shared among its rows."""

import pytest
import torch

from specheads.core.target import FrozenTarget
from specheads.decode import MedusaDrafter, default_tree
from specheads.decode.baseline import generate_rows
from specheads.decode.batched import BatchedSpeculativeDecoder
from specheads.decode.batched_inputs import left_pad
from specheads.evaluate.batched_eval import evaluate_batched
from specheads.evaluate.evaluate import EvalRun
from specheads.evaluate.prompts import Prompt
from specheads.evaluate.report import first_mismatch, summarize
from specheads.heads import MedusaConfig, MedusaHeads

from helpers import tiny_model

VOCAB = 264


def test_batched_records_equal_generate_and_add_up():
    model = tiny_model("qwen2", vocab_size=VOCAB)
    target = FrozenTarget(model)
    heads = MedusaHeads(MedusaConfig(target.hidden_size, target.vocab_size, num_heads=2))
    decoder = BatchedSpeculativeDecoder(
        target,
        MedusaDrafter(
            heads.init_lm_heads_from(target.lm_head).eval(), default_tree("medusa-15", num_heads=2)
        ),
    )
    g = torch.Generator().manual_seed(0)
    prompts = [
        Prompt(str(i), "c", torch.randint(0, 256, (1, t), generator=g)) for i, t in enumerate((4, 9, 2, 7, 5))
    ]
    vocab = torch.arange(VOCAB) % 3 == 0  # the tokens a draft could propose, counted in each output
    run = EvalRun(warmup=0, progress=False, draft_vocab=vocab)
    records = evaluate_batched(decoder, target, prompts, 10, batch_size=2, run=run)
    assert [r["id"] for r in records] == ["0", "1", "2", "3", "4"]
    assert [r["batch_size"] for r in records] == [2, 2, 2, 2, 1]
    assert records[0]["seconds"] == records[1]["seconds"] and records[0]["seconds"] != records[2]["seconds"]
    for r, p in zip(records, prompts):
        alone = model.generate(p.input_ids, max_new_tokens=10, do_sample=False)[0, p.input_ids.shape[1] :]
        assert r["identical_to_baseline"] and r["first_mismatch"] is None
        assert r["new_tokens"] == r["baseline_new_tokens"] == alone.numel()
        assert r["new_tokens"] == 1 + sum(r["accept_lengths"]) and r["prompt_tokens"] == p.input_ids.shape[1]
        assert r["in_draft_vocab"] == int(vocab[alone].sum())
    figures = summarize(records, tree_depth=2)
    assert figures["identical_to_baseline"] == "5/5" and figures["new_tokens"] == sum(
        r["new_tokens"] for r in records
    )
    with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
        evaluate_batched(decoder, target, prompts, 10, batch_size=0)


def test_baseline_rows_stop_at_their_own_eos():
    model = tiny_model("llama", vocab_size=VOCAB)
    target = FrozenTarget(model)
    prompts = [torch.tensor([[5, 6, 7]]), torch.tensor([[9]])]
    free = [
        model.generate(p, max_new_tokens=8, do_sample=False, eos_token_id=None)[0, p.shape[1] :].tolist()
        for p in prompts
    ]
    model.generation_config.eos_token_id = free[0][2]  # row 0 ends at its third token
    ids, mask = left_pad(prompts, 0)
    rows = generate_rows(target, ids, 8, mask)
    assert rows[0] == free[0][:3]
    eos = free[0][2]
    assert rows[1] == (free[1][: free[1].index(eos) + 1] if eos in free[1] else free[1])
    assert first_mismatch([1, 2, 3], [1, 2, 3]) is None and first_mismatch([1, 2], [1, 2, 3]) == 2
    assert first_mismatch([1, 5, 3], [1, 2, 3]) == 1


def test_sampled_batches_leave_identical_unmeasured_and_a_seed_reproduces_them():
    from specheads.decode.sampling import SamplingParams

    model = tiny_model("llama", vocab_size=VOCAB)
    target = FrozenTarget(model)
    heads = MedusaHeads(MedusaConfig(target.hidden_size, target.vocab_size, num_heads=2))
    drafter = MedusaDrafter(
        heads.init_lm_heads_from(target.lm_head).eval(), default_tree("medusa-15", num_heads=2)
    )
    decoder = BatchedSpeculativeDecoder(target, drafter)
    g = torch.Generator().manual_seed(1)
    prompts = [
        Prompt(str(i), "c", torch.randint(0, 256, (1, t), generator=g)) for i, t in enumerate((4, 9, 3))
    ]
    sampling = SamplingParams(temperature=0.9, top_k=20, top_p=0.95)

    def run(seed):
        sampled = EvalRun(warmup=0, progress=False, sampling=sampling, seed=seed)
        return evaluate_batched(decoder, target, prompts, 8, batch_size=2, run=sampled)

    first, again = run(3), run(3)
    assert all(r["identical_to_baseline"] is None and r["first_mismatch"] is None for r in first)
    assert all(r["new_tokens"] == 1 + sum(r["accept_lengths"]) for r in first)
    tokens = [[r["new_tokens"], r["accept_lengths"]] for r in first]
    assert tokens == [[r["new_tokens"], r["accept_lengths"]] for r in again]


def test_pad_token_id_falls_back_to_an_eos_then_zero():
    from specheads.decode.baseline import pad_token_id

    target = FrozenTarget(tiny_model("llama", vocab_size=VOCAB))
    config = target.model.generation_config
    config.pad_token_id, config.eos_token_id = 7, [9, 4]
    assert pad_token_id(target) == 7
    config.pad_token_id = None
    assert pad_token_id(target) == 4
    config.eos_token_id = None
    assert pad_token_id(target) == 0
