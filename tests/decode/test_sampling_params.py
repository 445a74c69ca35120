"""p is built exactly as the target's own `generate(do_sample=True, ...)` builds it: the same warpers in
the same order, with generate's own defaults (top_k=50) and a model's generation config (temperature,
repetition penalty, min-p, ...) kept out of the comparison by explicit keyword arguments."""

import pytest
import torch

from specheads.decode.sampling import SamplingParams, check_generator, sample, sampling_probs

from helpers import tiny_model

VOCAB = 264


def generate_scores(model, prompt, **kwargs):
    """The raw and the processed scores `generate` sampled each of 4 new tokens from."""
    out = model.generate(
        prompt,
        max_new_tokens=4,
        output_scores=True,
        output_logits=True,
        return_dict_in_generate=True,
        pad_token_id=0,
        **kwargs,
    )
    return list(zip(out.logits, out.scores))


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(),
        SamplingParams(temperature=0.7),
        SamplingParams(top_k=5),
        SamplingParams(top_p=0.8),
        SamplingParams(temperature=1.4, top_k=40, top_p=0.9),
        SamplingParams(temperature=0.5, top_k=3, top_p=0.3),  # top-p inside top-k
    ],
    ids=repr,
)
def test_probs_are_what_generate_samples_from(params):
    model = tiny_model("llama", vocab_size=VOCAB)
    # a generation config that would change what generate samples from, were its settings not overridden
    config = model.generation_config
    config.temperature, config.top_k, config.top_p = 0.3, 7, 0.5
    config.repetition_penalty, config.min_p, config.typical_p, config.no_repeat_ngram_size = 1.5, 0.2, 0.9, 2
    prompt = torch.randint(0, 256, (1, 9), generator=torch.Generator().manual_seed(0))
    for raw, processed in generate_scores(model, prompt, **params.generate_kwargs()):
        assert torch.equal(params.warpers()(None, raw), processed)  # the very warpers, bit for bit
        expected = torch.softmax(processed.double(), -1)
        assert torch.equal(sampling_probs(raw, params), expected)
        assert (expected > 0).sum() <= (params.top_k or VOCAB)


def test_generate_applies_top_k_50_unless_told_otherwise():
    """Why the baseline is always given top_k: left out, generate keeps only 50 tokens."""
    model = tiny_model("llama", vocab_size=VOCAB)
    prompt = torch.randint(0, 256, (1, 9), generator=torch.Generator().manual_seed(1))
    for _, processed in generate_scores(model, prompt, do_sample=True):
        assert int(torch.isfinite(processed).sum()) == 50
    for _, processed in generate_scores(model, prompt, **SamplingParams().generate_kwargs()):
        assert int(torch.isfinite(processed).sum()) == VOCAB


def test_probs_keep_any_leading_shape():
    logits = torch.randn(2, 3, 11)
    params = SamplingParams(temperature=0.9, top_k=4, top_p=0.7)
    probs = sampling_probs(logits, params)
    assert probs.shape == (2, 3, 11) and probs.dtype == torch.float64
    torch.testing.assert_close(probs[1, 2], sampling_probs(logits[1, 2], params))
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 3, dtype=torch.float64))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(temperature=0.0), "temperature > 0"),
        (dict(top_k=-1), "top_k must be an int >= 0"),
        (dict(top_k=2.5), "top_k must be an int >= 0"),
        (dict(top_p=0.0), r"top_p must lie in \(0, 1\]"),
        (dict(top_p=1.2), r"top_p must lie in \(0, 1\]"),
    ],
)
def test_bad_settings_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_sample_draws_by_inversion_and_never_a_zero():
    probs = torch.tensor([0.0, 0.5, 0.0, 0.3, 0.2, 0.0], dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    counts = torch.bincount(torch.tensor([sample(probs * 3, g) for _ in range(4000)]), minlength=6)
    assert counts[[0, 2, 5]].sum() == 0
    torch.testing.assert_close(counts[[1, 3, 4]] / 4000, probs[[1, 3, 4]].float(), atol=0.03, rtol=0)


def test_generator_is_the_one_given_or_seeded_from_torch():
    g = torch.Generator().manual_seed(3)
    assert check_generator(g) is g
    torch.manual_seed(5)
    first = check_generator(None).initial_seed()
    torch.manual_seed(5)
    assert check_generator(None).initial_seed() == first  # follows torch.manual_seed
