"""The target's sampling distribution p, built exactly as `generate(do_sample=True)` builds it, and seeded draws.

`model.generate(do_sample=True, temperature=T, top_k=k, top_p=P)` (read in transformers 5.23:
`GenerationMixin._get_logits_processor`, then `_sample`) turns the logits of the last position into the
next token as

    scores = logits.float()                            # (B, V) float32
    scores = TemperatureLogitsWarper(T)(scores)         if T != 1.0
    scores = TopKLogitsWarper(k)(scores)                if k != 0   (k left out: the generation config's,
                                                                    50 unless the model sets another)
    scores = TopPLogitsWarper(P)(scores)                if P < 1.0
    token  = multinomial(softmax(scores))

`sampling_probs` applies the same warpers, built by transformers itself, in the same order under the
same conditions (min_tokens_to_keep=1, as generate uses without beams), and takes the softmax in
float64 for the verifier. Two choices are deliberate and made on both sides:

- top_k=0 means "no top-k" here. `generate` without a top_k would apply its generation config's
  (50 by default), so `SamplingParams.generate_kwargs()` always passes top_k explicitly.
- A model's generation config may switch on further processors (repetition penalty, min-p, typical-p,
  ...) that the decoder does not apply. `generate_kwargs()` switches them off (NEUTRAL_SETTINGS), so
  the baseline samples from the same p as the decoder.

Random draws take a `torch.Generator` on the CPU: the verifier walks the tree on the CPU in float64
(it reads only the rows of p it visits), so a seed fixes the draws whatever device the target is on.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

# Settings a model's generation config may carry that would make `generate(do_sample=True)` sample from
# something other than p, each with the value that switches it off. Passed to the baseline's generate.
NEUTRAL_SETTINGS: dict[str, Any] = {
    "repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "min_p": None,
    "typical_p": 1.0,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
    "top_h": None,
    "min_length": 0,
    "min_new_tokens": None,
    "bad_words_ids": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "sequence_bias": None,
    "exponential_decay_length_penalty": None,
}


@dataclass(frozen=True)
class SamplingParams:
    """How the target's logits become its sampling distribution p.

    temperature: > 0; logits are divided by it.
    top_k: keep the k most likely tokens; 0 keeps all (`generate`'s own default would be 50).
    top_p: keep the smallest set of most likely tokens whose probability reaches top_p; 1.0 keeps all.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        if not self.temperature > 0:
            raise ValueError(
                f"sampling needs temperature > 0, got {self.temperature} (temperature 0 is greedy decoding: "
                f"do_sample=False)"
            )
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an int >= 0 (0: no top-k), got {self.top_k!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p}")

    def warpers(self):
        """transformers' own warpers, in the order and under the conditions `generate` uses them."""
        from transformers import (
            LogitsProcessorList,
            TemperatureLogitsWarper,
            TopKLogitsWarper,
            TopPLogitsWarper,
        )  # lazy: transformers adds seconds to every command's start

        warpers = LogitsProcessorList()
        if self.temperature != 1.0:
            warpers.append(TemperatureLogitsWarper(self.temperature))
        if self.top_k != 0:
            warpers.append(TopKLogitsWarper(top_k=self.top_k, min_tokens_to_keep=1))
        if self.top_p < 1.0:
            warpers.append(TopPLogitsWarper(top_p=self.top_p, min_tokens_to_keep=1))
        return warpers

    def generate_kwargs(self) -> dict[str, Any]:
        """Keyword arguments that make `model.generate` sample from the same p (the baseline)."""
        return {
            "do_sample": True,
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            **NEUTRAL_SETTINGS,
        }

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def sampling_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """p: the target's sampling distribution at each position.

    Args:
        logits: (..., V) raw logits of the target.
        params: temperature, top-k and top-p.

    Returns:
        (..., V) float64 probabilities, exactly zero where top-k / top-p removed a token.
    """
    vocab = logits.shape[-1]
    scores = params.warpers()(None, logits.reshape(-1, vocab).float())  # the warpers want (rows, V) float32
    return torch.softmax(scores.double(), dim=-1).reshape(logits.shape)


def draft_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """q: the draft's distribution at the sampling temperature, (..., V) float32.

    Only the temperature is applied: q keeps every token, so children drawn without replacement never
    run out. `logits` may be log-probabilities (a constant shift changes nothing).
    """
    return torch.softmax(logits.float() / params.temperature, dim=-1)


def check_generator(generator: torch.Generator | None) -> torch.Generator:
    """The generator to draw with: a CPU generator as given, or a fresh one seeded from torch's global RNG.

    Raises:
        ValueError: for a generator on another device (draws happen on the CPU).
    """
    if generator is None:
        seed = int(torch.randint(0, 2**62, (1,)))  # follows torch.manual_seed
        return torch.Generator().manual_seed(seed)
    if generator.device.type != "cpu":
        raise ValueError(
            f"the decoder draws on the CPU and needs a CPU torch.Generator, got one on {generator.device}"
        )
    return generator


def sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One token drawn from `probs` (V,) (need not be normalised) with the CPU `generator`.

    By inversion: u ~ U[0, 1) picks the first token whose cumulative mass exceeds u·Σprobs, so token i
    is drawn with probability probs[i] / Σprobs, and a zero-probability token never.
    """
    weights = probs.to("cpu", torch.float64)
    cdf = weights.cumsum(0)  # (V,)
    u = torch.rand((), dtype=torch.float64, generator=generator)
    token = int(torch.searchsorted(cdf, u * cdf[-1], right=True))
    if token == cdf.numel():  # u·Σ rounded up to Σ (u within 2^-53 of 1): the last token with mass
        token = int(weights.nonzero()[-1])
    return token


def draw_children(q: torch.Tensor, m: int, replacement: bool, generator: torch.Generator) -> torch.Tensor:
    """m tokens drawn from q (V,), in draw order: i.i.d., or one after another without replacement.

    Without replacement, draw i comes from q with the i-1 earlier draws removed and renormalised: the
    law the verifier's rule assumes (verify.py, rule (b)). Returns (m,) int64 on q's device.
    """
    weights = q.to("cpu", torch.float64).clone()
    support = int((weights > 0).sum())
    if not replacement and support < m:
        raise ValueError(f"cannot draw {m} distinct children from a draft distribution over {support} tokens")
    drawn = []
    for _ in range(m):
        drawn.append(sample(weights, generator))
        if not replacement:
            weights[drawn[-1]] = 0.0
    return torch.tensor(drawn, dtype=torch.long, device=q.device)
