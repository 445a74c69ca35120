"""collate and pack_rows: padding, packing with a document mask, and packed == unpacked through real models."""

import datasets
import pytest
import torch
import torch.nn.functional as F

from specheads.core.target import FrozenTarget
from specheads.data import collate, document_attention_mask, pack_rows, shift_loss_mask
from specheads.data.packing import first_fit_decreasing

from helpers import tiny_model

PAD = 258
MIN = torch.finfo(torch.float32).min


def examples(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in lengths:
        mask = (torch.rand(n, generator=g) < 0.7).long()
        mask[0] = 0
        out.append(
            {"input_ids": torch.randint(0, 256, (n,), generator=g).tolist(), "loss_mask": mask.tolist()}
        )
    return out


def test_unpacked_batches_pad_on_the_right():
    ex = examples([3, 5])
    batch = collate(ex, pad_token_id=PAD, packing=False, max_length=8)
    assert {k: (v.shape, v.dtype) for k, v in batch.items()} == {
        "input_ids": ((2, 5), torch.long),
        "loss_mask": ((2, 5), torch.float32),
        "position_ids": ((2, 5), torch.long),
        "attention_mask": ((2, 5), torch.long),
    }
    assert batch["input_ids"][0].tolist() == ex[0]["input_ids"] + [PAD, PAD]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    assert batch["loss_mask"][0, 3:].tolist() == [0, 0]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 4]] * 2
    with pytest.raises(ValueError, match="6 tokens is longer than max_length=5"):
        collate(examples([6]), pad_token_id=PAD, packing=False, max_length=5)


def test_first_fit_decreasing():
    assert first_fit_decreasing([7, 12, 5, 20, 9], 32) == [[1, 3], [0, 2, 4]]
    assert first_fit_decreasing([4, 4, 4], 4) == [[0], [1], [2]]
    with pytest.raises(ValueError, match="longer than max_length=4"):
        first_fit_decreasing([5], 4)


def test_packed_rows_restart_positions_and_mask_across_documents():
    ex = examples([2, 3, 4])
    batch = collate(ex, pad_token_id=PAD, packing=True, max_length=6)
    # first fit decreasing: [4] alone would leave room for 2 -> rows [0, 2] (2 + 4) and [1] (3)
    assert batch["input_ids"].tolist() == [
        ex[0]["input_ids"] + ex[2]["input_ids"],
        ex[1]["input_ids"] + [PAD] * 3,
    ]
    assert batch["position_ids"].tolist() == [[0, 1, 0, 1, 2, 3], [0, 1, 2, 0, 0, 0]]
    assert batch["loss_mask"][1, 3:].tolist() == [0, 0, 0]
    mask = batch["attention_mask"]
    assert mask.shape == (2, 1, 6, 6) and mask.dtype == torch.float32
    allowed = (mask[:, 0] == 0).int().tolist()
    assert allowed[0] == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [0, 0, 1, 0, 0, 0],  # the second document sees nothing of the first
        [0, 0, 1, 1, 0, 0],
        [0, 0, 1, 1, 1, 0],
        [0, 0, 1, 1, 1, 1],
    ]
    assert allowed[1] == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [0, 0, 0, 1, 0, 0],  # padding attends only to itself, and nothing attends to it
        [0, 0, 0, 0, 1, 0],
        [0, 0, 0, 0, 0, 1],
    ]
    assert set(mask.unique().tolist()) == {0.0, MIN}
    half = document_attention_mask(batch["position_ids"], batch["input_ids"] == PAD, torch.bfloat16)
    assert half.dtype == torch.bfloat16 and torch.equal(half == 0, mask == 0)


def test_shift_loss_mask_stays_inside_each_document():
    position_ids = torch.tensor([[0, 1, 2, 0, 1, 2, 3]])
    loss_mask = torch.tensor([[0, 1, 1, 0, 1, 1, 1]], dtype=torch.float32)
    assert shift_loss_mask(loss_mask, position_ids, 1).tolist() == [[1, 1, 0, 1, 1, 1, 0]]
    assert shift_loss_mask(loss_mask, position_ids, 2).tolist() == [[1, 0, 0, 1, 1, 0, 0]]
    assert shift_loss_mask(loss_mask, position_ids, 7).tolist() == [[0] * 7]
    with pytest.raises(ValueError, match="offset must be >= 1"):
        shift_loss_mask(loss_mask, position_ids, 0)


def per_document(batch, lengths, bins, logits):
    """Each document's logits (n, V), cut out of packed rows laid out by `bins`."""
    docs = {}
    for row, members in enumerate(bins):
        start = 0
        for i in members:
            docs[i] = logits[row, start : start + lengths[i]]
            start += lengths[i]
    return [docs[i] for i in range(len(lengths))]


def next_token_losses(logits, input_ids):
    """(B, T) cross-entropy of predicting token t + 1 at position t (0 at the last position)."""
    B, T, V = logits.shape
    ce = F.cross_entropy(logits[:, :-1].reshape(-1, V), input_ids[:, 1:].reshape(-1), reduction="none")
    return F.pad(ce.view(B, T - 1), (0, 1))


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral"])
def test_packed_and_unpacked_batches_give_the_same_losses(family, attn):
    lengths, max_length = [7, 12, 5, 20, 9, 3], 32
    ex = examples(lengths, seed=1)
    bins = first_fit_decreasing(lengths, max_length)
    assert len(bins) < len(lengths)  # several documents share a row
    model = tiny_model(family, attn_implementation=attn)
    unpacked = collate(ex, pad_token_id=PAD, packing=False, max_length=max_length)
    packed = collate(ex, pad_token_id=PAD, packing=True, max_length=max_length)
    inputs = ("input_ids", "attention_mask", "position_ids")
    with torch.no_grad():
        logits_u = model(**{k: unpacked[k] for k in inputs}).logits
        logits_p = model(**{k: packed[k] for k in inputs}).logits
        leaky = model(input_ids=packed["input_ids"]).logits  # packed without the document mask
    losses = {}
    for name, batch, logits in (("unpacked", unpacked, logits_u), ("packed", packed, logits_p)):
        ce = next_token_losses(logits, batch["input_ids"])
        weights = shift_loss_mask(batch["loss_mask"], batch["position_ids"], 1)
        if name == "packed":
            ce, weights = (per_document(batch, lengths, bins, x) for x in (ce, weights))
        losses[name] = [ce[i][: lengths[i]][weights[i][: lengths[i]].bool()] for i in range(len(lengths))]
    docs_p = per_document(packed, lengths, bins, logits_p)
    for i, n in enumerate(lengths):
        torch.testing.assert_close(docs_p[i], logits_u[i, :n], rtol=1e-5, atol=1e-5)
        assert losses["unpacked"][i].numel() == sum(ex[i]["loss_mask"]) > 0
        torch.testing.assert_close(losses["packed"][i], losses["unpacked"][i], rtol=1e-5, atol=1e-5)
    # the test can fail: a document after the first in its row sees its neighbour without the mask
    second = bins[0][1]
    leaked = per_document(packed, lengths, bins, leaky)[second]
    assert not torch.allclose(leaked, logits_u[second, : lengths[second]], atol=1e-3)


def test_a_frozen_target_takes_the_packed_batch():
    lengths = [6, 9, 4]
    ex = examples(lengths, seed=2)
    target = FrozenTarget(tiny_model("llama"))
    unpacked = collate(ex, pad_token_id=PAD, packing=False, max_length=16)
    packed = collate(ex, pad_token_id=PAD, packing=True, max_length=16)
    out_u = target(unpacked["input_ids"], attention_mask=unpacked["attention_mask"], capture=(2,))
    out_p = target(
        packed["input_ids"],
        attention_mask=packed["attention_mask"],
        position_ids=packed["position_ids"],
        capture=(2,),
    )
    bins = first_fit_decreasing(lengths, 16)
    for i, h in enumerate(per_document(packed, lengths, bins, out_p.hidden[2])):
        torch.testing.assert_close(h, out_u.hidden[2][i, : lengths[i]], rtol=1e-5, atol=1e-5)


def test_pack_rows_ahead_of_time_then_collate():
    lengths = [5, 3, 8, 2, 6, 4]
    ex = examples(lengths, seed=3)
    packed_rows = pack_rows(datasets.Dataset.from_list(ex), max_length=10)
    assert packed_rows.column_names == ["input_ids", "loss_mask", "position_ids"]
    assert sorted(len(r) for r in packed_rows["input_ids"]) == [8, 10, 10]
    flat = [p for row in packed_rows["position_ids"] for p in row]
    assert flat.count(0) == len(lengths)
    batch = collate(list(packed_rows), pad_token_id=PAD, packing=True, max_length=10)
    direct = collate(ex, pad_token_id=PAD, packing=True, max_length=10)
    assert torch.equal(batch["input_ids"], direct["input_ids"])
    assert torch.equal(batch["attention_mask"], direct["attention_mask"])
    assert torch.equal(batch["position_ids"], direct["position_ids"])
    with pytest.raises(ValueError, match="need packing=True"):
        collate(list(packed_rows), pad_token_id=PAD, packing=False, max_length=10)
