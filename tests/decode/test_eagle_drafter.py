"""EagleDrafter: greedy output equals the target's `generate`, and every drafted token is what the head
computes from scratch for that node (so the head's KV cache, tree masks and positions are right)."""

import pytest
import torch
from transformers import DynamicCache

from specheads.core.target import FrozenTarget
from specheads.decode import SpeculativeDecoder, StaticTree, default_tree
from specheads.decode.eagle_drafter import EARLY_STOP, EagleDrafter, early_stop_for
from specheads.heads import Eagle3Config, Eagle3Head, EagleConfig, EagleHead, layer_config_from
from specheads.train.eagle_losses import eagle3_loss, eagle_loss

from decode_helpers import greedy_continuation, random_prompts, recording, reference_generate
from helpers import FAMILIES, tiny_model

VOCAB = 264
STATIC = default_tree("medusa-15")  # read the EAGLE way: rank r at the parent node


def make_head(method: str, target: FrozenTarget, draft_vocab=None, seed=0):
    torch.manual_seed(seed)
    layer_config = layer_config_from(target.config)
    if method == "eagle":
        return EagleHead(EagleConfig(layer_config)).eval()
    size = VOCAB if draft_vocab is None else draft_vocab.numel()
    head = Eagle3Head(Eagle3Config(layer_config, draft_vocab_size=size, target_layers=(1, 2, 4)))
    if draft_vocab is not None:
        head.set_draft_vocab(draft_vocab)
    return head.eval()


def drafter_for(head, target, tree):
    if tree == "dynamic":
        return EagleDrafter(head, target, top_k=4, depth=4, total_tokens=16)
    return EagleDrafter(head, target, STATIC)


# -- a from-scratch reference ---------------------------------------------------------------------------


@torch.no_grad()
def reference_logprobs(head, target: FrozenTarget, tokens: torch.Tensor, path: list[int]) -> torch.Tensor:
    """The head's log-probabilities after root + `path` (target ids), with no drafter involved.

    tokens: (1, S + 1), the root last. One target forward gives the real features of positions 0..S-1;
    the head reads them with tokens x_1..x_S, then walks the path one node at a time, feeding back its
    own output, at positions S, S+1, ...
    """
    S = tokens.shape[1] - 1
    features = target(tokens[:, :S], capture=head.capture_layers).hidden
    hidden = head.input_hidden(features)
    embed = target.embed_tokens
    causal = torch.zeros(S, S).masked_fill(
        ~torch.ones(S, S, dtype=torch.bool).tril(), torch.finfo(torch.float32).min
    )
    cache = DynamicCache()
    out = head(hidden, embed(tokens[:, 1:]), torch.arange(S)[None], causal[None, None], cache)[:, -1:]
    for d, token in enumerate(path, start=1):
        ids = torch.tensor([[token]])
        out = head(out, embed(ids), torch.tensor([[S + d - 1]]), torch.zeros(1, 1, 1, S + d), cache)
    return head.logits(out[0, -1], target.lm_head).log_softmax(-1)


def node_path(parents: list[int], tokens: list[int], node: int) -> list[int]:
    """Tokens from the root's first child down to `node` (the root excluded)."""
    path = []
    while node > 0:
        path.append(tokens[node])
        node = parents[node]
    return path[::-1]


class CheckedDrafter(EagleDrafter):
    """Checks every proposed node against `reference_logprobs` at its parent."""

    def __init__(self, head, target, *args, **kwargs):
        super().__init__(head, target, *args, **kwargs)
        self.target, self.checked = target, 0
        to_target = self.to_target_ids(torch.arange(self.draft_vocab_size))
        self.draft_ids = {int(t): i for i, t in enumerate(to_target)}

    def propose(self, context):
        tree = super().propose(context)
        tokens, parents = tree.tokens[0].tolist(), tree.parents[0].tolist()
        draft_ids = self.draft_ids  # target id -> draft id
        for node in range(1, len(tokens)):
            path = node_path(parents, tokens, parents[node])
            ref = reference_logprobs(self.head, self.target, context.tokens, path)
            if self.vocab is not None:  # an EAGLE-1 head over a draft vocabulary: its logits there
                ref = ref[..., self.vocab]
            if self.tree is not None:  # static: exactly the rank-r token at the parent
                rank = self.tree.ranks[node]
                assert draft_ids[tokens[node]] == int(ref.topk(rank + 1).indices[rank]), (node, context.step)
            else:  # dynamic: one of the parent's top-k
                assert draft_ids[tokens[node]] in ref.topk(self.top_k).indices.tolist(), (node, context.step)
            self.checked += 1
        return tree


def test_training_time_test_steps_are_what_drafting_computes():
    """EAGLE-3 step i at position t (training) equals the head at a depth-i path node (drafting) whose
    path is the true tokens: the same features, tokens, positions and attention; all five steps of the
    recipes' ttt_steps."""
    from specheads.train.eagle_losses import draft_attention_mask, eagle3_unroll

    model = tiny_model("qwen2", vocab_size=VOCAB)
    target = FrozenTarget(model)
    head = make_head("eagle3", target)
    tokens = random_prompts(1, seed=5, low=12, high=13)[0]  # (1, 12)
    T = tokens.shape[1]
    with torch.no_grad():
        fused = head.input_hidden(target(tokens, capture=head.capture_layers).hidden)
        positions = torch.arange(T)[None]
        first = draft_attention_mask(None, positions, torch.float32)
        steps = eagle3_unroll(head, fused, target.embed_tokens(tokens), positions, first, 5)
    for t in (0, 4, 6):  # t + 1 + i < T: every step's token is the sequence's (step 4 at t = 6 reads x_11)
        for i, h in enumerate(steps):
            ref = reference_logprobs(head, target, tokens[:, : t + 2], tokens[0, t + 2 : t + 2 + i].tolist())
            assert torch.allclose(head.logits(h[0, t]).log_softmax(-1), ref, atol=1e-4), (t, i)


# -- greedy equality ---------------------------------------------------------------------------------


@pytest.mark.parametrize("tree", ["static", "dynamic"])
@pytest.mark.parametrize("method", ["eagle", "eagle3"])
@pytest.mark.parametrize("family", FAMILIES)
def test_random_heads_equal_generate(family, method, tree):
    model = tiny_model(family, vocab_size=VOCAB)
    target = FrozenTarget(model)
    decoder = SpeculativeDecoder(target, drafter_for(make_head(method, target), target, tree))
    for prompt in random_prompts(2, seed=1):
        out = decoder.generate(prompt, max_new_tokens=20)
        assert torch.equal(out.tokens, reference_generate(model, prompt, 20)), prompt.tolist()
        assert out.tokens.shape[1] == 1 + sum(out.accept_lengths)


def test_the_early_stop_switch_grows_every_level_and_drafts_the_same(monkeypatch):
    """SPECHEADS_EAGLE_EARLY_STOP=0 (an A/B switch for accelerators) expands all depth - 1 levels; the
    trees, and so the output, are the ones the early stop drafts."""
    model = tiny_model("llama", vocab_size=VOCAB)
    target = FrozenTarget(model)
    head = make_head("eagle3", target, seed=3)

    def decode(switch: str):
        monkeypatch.setenv(EARLY_STOP, switch)
        drafter = EagleDrafter(head, target, top_k=2, depth=6, total_tokens=4)
        feeds, trees, feed, propose = [], [], drafter._feed, drafter.propose
        drafter._feed = lambda *a, **k: feeds.append(a[2]) or feed(*a, **k)
        drafter.propose = lambda context: trees.append(propose(context)) or trees[-1]
        out = SpeculativeDecoder(target, drafter).generate(random_prompts(1, seed=2)[0], max_new_tokens=16)
        return out.tokens, [(t.tokens.tolist(), t.parents.tolist()) for t in trees], feeds

    runs = {switch: decode(switch) for switch in ("1", "0")}
    (early_out, early_trees, early_feeds), (full_out, full_trees, full_feeds) = runs["1"], runs["0"]
    assert torch.equal(early_out, full_out) and early_trees == full_trees
    assert len(full_feeds) == len(full_trees) * 5  # every level below the first, every step
    assert len(early_feeds) < len(full_feeds)  # a 4-node tree stops growing before depth 6


def test_the_early_stop_defaults_to_on_for_the_cpu_and_off_on_accelerators(monkeypatch):
    """Unset, EAGLE-2's early stop is on where it saves draft forwards (the CPU) and off on an accelerator,
    where its per-level read-back is a synchronisation; the switch forces either, and a bad value is named."""
    monkeypatch.delenv(EARLY_STOP, raising=False)
    assert early_stop_for(torch.device("cpu")) is True
    assert early_stop_for(torch.device("cuda", 0)) is False
    assert early_stop_for(torch.device("meta")) is False
    for switch, expected in (("1", True), ("0", False), (" 0 ", False)):
        monkeypatch.setenv(EARLY_STOP, switch)
        assert early_stop_for(torch.device("cpu")) is expected
        assert early_stop_for(torch.device("cuda", 0)) is expected
    monkeypatch.setenv(EARLY_STOP, "off")
    with pytest.raises(ValueError, match="SPECHEADS_EAGLE_EARLY_STOP='off'"):
        early_stop_for(torch.device("cpu"))
    monkeypatch.delenv(EARLY_STOP)
    model = tiny_model("llama", vocab_size=VOCAB)
    target = FrozenTarget(model)
    assert EagleDrafter(make_head("eagle", target), target, top_k=2, depth=3, total_tokens=4).early_stop


@pytest.mark.parametrize("tree", ["static", "dynamic"])
@pytest.mark.parametrize("method", ["eagle", "eagle3", "eagle-vocab"])
def test_drafted_tokens_are_the_heads_own_from_scratch(method, tree):
    """Drafting with the cache (kept in step across steps) proposes exactly what the head computes
    from scratch at each node; EAGLE-3 over a sparse draft vocabulary (ids mapped through d2t); an EAGLE-1
    head decoded over one ("eagle-vocab": the drafter's `vocab`, its logits at those ids)."""
    model = tiny_model("llama", vocab_size=VOCAB)
    target = FrozenTarget(model)
    vocab = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(0))[:150].sort().values
    head = make_head(method.removesuffix("-vocab"), target, draft_vocab=vocab if method == "eagle3" else None)
    restrict = vocab if method == "eagle-vocab" else None
    if tree == "dynamic":
        drafter = CheckedDrafter(head, target, top_k=3, depth=3, total_tokens=10, vocab=restrict)
    else:
        static = StaticTree.from_choices([(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])
        drafter = CheckedDrafter(head, target, static, vocab=restrict)
    prompt = random_prompts(1, seed=2)[0]
    out = SpeculativeDecoder(target, drafter).generate(prompt, 8)
    assert torch.equal(out.tokens, reference_generate(model, prompt, 8))
    assert drafter.checked >= 6 * 7


def test_eagle3_proposals_are_in_the_draft_vocabulary():
    model = tiny_model("qwen2", vocab_size=VOCAB)
    target = FrozenTarget(model)
    vocab = torch.arange(0, VOCAB, 3)  # every third token
    head = make_head("eagle3", target, draft_vocab=vocab)
    seen = []

    class Spy(EagleDrafter):
        def propose(self, context):
            tree = super().propose(context)
            seen.append(tree.tokens[0, 1:])
            return tree

    prompt = random_prompts(1, seed=3)[0]
    out = SpeculativeDecoder(target, Spy(head, target, top_k=4, depth=3, total_tokens=12)).generate(
        prompt, 12
    )
    assert torch.equal(out.tokens, reference_generate(model, prompt, 12))
    drafted = torch.cat(seen)
    assert drafted.numel() == 11 * len(seen) and (drafted % 3 == 0).all()


Recording = recording(EagleDrafter)


@pytest.mark.parametrize("tree", ["static", "dynamic"])
def test_a_draft_vocabulary_of_every_token_drafts_the_same_trees(tree):
    model = tiny_model("llama", vocab_size=VOCAB)
    target = FrozenTarget(model)
    head = make_head("eagle", target)
    static = STATIC if tree == "static" else None
    prompt = random_prompts(1, seed=4)[0]
    runs = []
    for vocab in (None, torch.arange(VOCAB)):
        drafter = Recording(head, target, static, top_k=4, depth=4, total_tokens=16, vocab=vocab)
        out = SpeculativeDecoder(target, drafter).generate(prompt, 16)
        assert torch.equal(out.tokens, reference_generate(model, prompt, 16))
        runs.append(drafter.trees)
    assert len(runs[0]) == len(runs[1]) > 1
    for whole, named in zip(*runs):
        assert torch.equal(whole.tokens, named.tokens) and torch.equal(whole.parents, named.parents)
    with pytest.raises(ValueError, match="EAGLE-3 heads draft over their own vocabulary"):
        EagleDrafter(make_head("eagle3", target), target, STATIC, vocab=torch.arange(10))
    with pytest.raises(ValueError, match="static tree reads top-6 guesses; the draft has 5 tokens"):
        EagleDrafter(head, target, STATIC, vocab=torch.arange(5))


def test_out_of_step_context_is_an_error():
    from specheads.decode import DraftContext

    target = FrozenTarget(tiny_model("llama", vocab_size=VOCAB))
    drafter = EagleDrafter(make_head("eagle", target), target, STATIC)
    tokens = torch.randint(0, 256, (1, 9))
    hidden = target(tokens[:, :8], capture=drafter.capture_layers).hidden
    drafter.propose(DraftContext(tokens=tokens, hidden=hidden, step=0))
    later = torch.randint(0, 256, (1, 12))  # 11 cached, 2 new: the head holds 8, not 9
    features = {k: v[:, :2] for k, v in hidden.items()}
    with pytest.raises(RuntimeError, match="draft cache holds 8 positions but the target held 9"):
        drafter.propose(DraftContext(tokens=later, hidden=features, step=1))


# -- briefly trained heads ------------------------------------------------------------------------------


def train_briefly(method: str, target: FrozenTarget, prompts: torch.Tensor, steps: int):
    """Fit a head to the target's own greedy continuations of `prompts` (B, 8), as self-distillation."""
    sequences = target.model.generate(
        prompts, max_new_tokens=56, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    B, T = sequences.shape
    positions, loss_mask = torch.arange(T).expand(B, T), torch.ones(B, T)
    head = make_head(method, target).train()
    out = target(sequences, capture=head.capture_layers)
    optimizer = torch.optim.AdamW(head.parameters(), lr=1e-2)
    for _ in range(steps):
        if method == "eagle":
            loss, _ = eagle_loss(
                head,
                out.hidden[4],
                sequences,
                loss_mask,
                positions,
                out.logits,
                target.embed_tokens,
                target.lm_head,
            )
        else:
            loss, _ = eagle3_loss(
                head, out.hidden, sequences, loss_mask, positions, out.logits, target.embed_tokens, steps=2
            )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return head.eval()


@pytest.mark.parametrize(
    "family, method, min_tau",
    [("llama", "eagle", 2.0), ("qwen2", "eagle", 2.0), ("llama", "eagle3", 1.4), ("qwen2", "eagle3", 1.4)],
)
def test_trained_heads_are_accepted_and_equal_generate(family, method, min_tau):
    """Heads trained on the target's continuations of some prompts draft them well: whole paths are
    accepted (so the training shifts are the decoding shifts), and the output is still the target's."""
    model = tiny_model(family, vocab_size=VOCAB)
    target = FrozenTarget(model)
    prompts = torch.randint(0, 256, (16, 8), generator=torch.Generator().manual_seed(0))
    head = train_briefly(method, target, prompts, steps=60)
    for tree in ("static", "dynamic"):
        decoder = SpeculativeDecoder(target, drafter_for(head, target, tree))
        taus = []
        for prompt in [*prompts[:2].split(1), *random_prompts(1, seed=4)]:
            out = decoder.generate(prompt, max_new_tokens=40, eos_token_id=[])
            assert out.tokens[0].tolist() == greedy_continuation(model, prompt, 40), (tree, prompt.tolist())
            taus.append(out.mean_accept_length)
        assert min(taus[:2]) > min_tau, (tree, taus)
