"""Tiny random models of several families, built in code (nothing is downloaded).

Each comes with a byte-level tokenizer (every byte is a token) carrying a chat template, so any
text encodes and the model can be saved and loaded as an ordinary HF directory.
"""

from __future__ import annotations

import json
import shutil
from contextlib import contextmanager
from pathlib import Path

import torch

from specheads.builders.tiny_target import TinyTargetConfig
from specheads.evaluate.prompts import HELDOUT_FILE

FAMILIES = ("llama", "qwen2", "qwen3", "mistral")
# Families whose EAGLE heads take a Llama draft layer (draft_arch: llama), with the overrides that keep their
# tiny configs tiny (a few small experts for the mixtures of experts) and the decoder's attention (Gemma-3's
# layers all full attention: the decoder refuses a sliding window)
OTHER_FAMILIES = {
    "qwen3": {},
    "qwen3_moe": dict(head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32),
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2),
    "phi3": {},
    "gemma3_text": dict(head_dim=16, layer_types=["full_attention"] * 4),
}

# The embedded tiny target at test size: 2 layers of 64, 3 steps on 24 training files (seconds to build).
SMALL_TINY_TARGET = TinyTargetConfig(
    steps=3,
    max_files=24,
    vocab_size=400,
    hidden_size=64,
    num_layers=2,
    num_heads=2,
    num_kv_heads=2,
    intermediate_size=128,
    seq_len=64,
    batch_size=4,
    eval_blocks=4,
    warmup_steps=1,
)


def tiny_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from specheads.builders.tiny_target import BOS, CHAT_TEMPLATE, END, EOS, PAD, ROLE_TOKENS

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        # transformers 5 loads a qwen2 directory with Qwen2Tokenizer, which adds <|endoftext|> when it
        # is missing (growing the vocabulary past the embedding); real Qwen tokenizers have it.
        additional_special_tokens=[END, *ROLE_TOKENS, "<|endoftext|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_config(family: str, vocab_size: int = 264, **overrides):
    """A 4-layer, 64-wide config of `family` (GQA with 2 KV heads)."""
    from transformers import AutoConfig

    from scripts.families import TINY

    kwargs = dict(vocab_size=vocab_size, **TINY)
    if family == "qwen3":
        kwargs["head_dim"] = 16
    if family == "mistral":
        kwargs["sliding_window"] = None
    kwargs.update(overrides)
    return AutoConfig.for_model(family, **kwargs)


# Families whose layers mix sliding-window and full attention, with the attention each supports (transformers
# refuses sdpa for Gemma-2, whose eager attention softcaps the scores, and for gpt-oss, whose eager attention
# adds the sinks) and a tiny config: layers alternate sliding (window 8 by default) and full attention.
MIXED_LAYERS = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
MIXED_FAMILIES = {
    "gemma2": ("eager", dict(head_dim=16)),
    "gemma3_text": ("sdpa", dict(head_dim=16)),
    "gpt_oss": ("eager", dict(head_dim=16, num_local_experts=4, num_experts_per_tok=2)),
}


def tiny_mixed_model(family: str, window: int = 8, seed: int = 0, **overrides):
    """A tiny random `family` model (MIXED_FAMILIES) whose layers alternate sliding (`window`) and full
    attention, in fp32 with the attention implementation the family supports."""
    attn, defaults = MIXED_FAMILIES[family]
    kwargs = {**defaults, "sliding_window": window, "layer_types": MIXED_LAYERS, **overrides}
    return tiny_model(family, seed=seed, attn_implementation=attn, **kwargs)


def tiny_model(family: str, seed: int = 0, attn_implementation: str = "sdpa", **overrides):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = tiny_config(family, **overrides)
    model = AutoModelForCausalLM.from_config(
        config, attn_implementation=attn_implementation, dtype=torch.float32
    )
    return model.eval()


def save_tiny_target(family: str, path: Path, seed: int = 0, **overrides) -> Path:
    """Save a tiny random `family` model and its tokenizer as an HF directory at `path`."""
    tokenizer = tiny_tokenizer()
    model = tiny_model(family, seed=seed, vocab_size=len(tokenizer), **overrides)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return Path(path)


def perturbed(module, seed: int = 0):
    """Move every weight off its initialisation, as training would (a freshly built head has zeros where
    a trained one has not, and would hide a weight read from the wrong place)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return module.eval()


def command(name: str):
    """`specheads NAME ARGS...` as a function of ARGS, through the console script's own parser (in-process;
    errors raise, as `cli.main(argv)` raises them for Python callers)."""
    from specheads.cli import main

    return lambda argv: main([name, *argv])


def causal_mask(t: int, past: int = 0) -> torch.Tensor:
    """(1, 1, t, past + t) additive float mask: each of t new tokens sees the past and itself and before."""
    allowed = torch.ones(t, past + t, dtype=torch.bool).tril(past)
    return torch.zeros(1, 1, t, past + t).masked_fill(~allowed, torch.finfo(torch.float32).min)


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| of two tensors of one shape (their shapes are asserted equal first)."""
    assert a.shape == b.shape, (tuple(a.shape), tuple(b.shape))
    return float((a - b).abs().max())


def edit_weights(path: Path, edit) -> None:
    """Apply `edit` (in place, on the dict of tensors) to `path`/model.safetensors."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(path / "model.safetensors"))


class FakeTimer:
    """Injected timings: a target step over N nodes costs `step(N)`, every draft 0.1 ms; records what it timed."""

    def __init__(self, step):
        self.step, self.nodes, self.drafters = step, [], []

    def measure(self, nodes, drafters):
        self.nodes, self.drafters = list(nodes), list(drafters)
        return [self.step(n) for n in nodes], [1e-4] * len(drafters)


def record_decoding_attention(monkeypatch, module) -> list[str]:
    """Replace `module.decoding_attention` (decode/step.py) with a context that records the device type it
    is entered for; returns the record."""
    entered = []

    @contextmanager
    def record(device):
        entered.append(device.type)
        yield

    monkeypatch.setattr(module, "decoding_attention", record)
    return entered


def stop_at_call(monkeypatch, owner, name: str, n: int) -> None:
    """`owner.name` raises KeyboardInterrupt (as Ctrl-C or SIGTERM does) when called for the n-th time."""
    real, calls = getattr(owner, name), []

    def stopping(*args, **kwargs):
        calls.append(1)
        if len(calls) == n:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, stopping)


def target_with_heldout(source: Path, root: Path, sources: dict[str, str], **heldout) -> Path:
    """A copy of the saved target `source` as root/target whose held-out files (`--prompts heldout`) are
    `sources` (name -> text), written under root/target/sources (inside the folder, as a target's paths
    must be); `heldout` adds keys to its heldout_files.json."""
    target_dir = root / "target"
    shutil.copytree(source, target_dir)
    for name, text in sources.items():
        (target_dir / "sources" / name).parent.mkdir(parents=True, exist_ok=True)
        (target_dir / "sources" / name).write_text(text)
    listing = {"stdlib": "sources", **heldout, "files": sorted(sources)}
    (target_dir / HELDOUT_FILE).write_text(json.dumps(listing))
    return target_dir


def train_with_qwen3_8b_recipe(target_dir: Path, root: Path) -> Path:
    """`specheads train recipes/qwen3-8b/eagle3.yaml` as it ships (its layer ids, draft vocabulary and
    assistant-only loss) on `target_dir` (a tiny 36-layer Qwen3) and a few chat rows, for 2 steps; the run."""
    import json

    from specheads.cli import main as cli_main

    rows = [
        {
            "messages": [
                {"role": "user", "content": f"count from {i}"},
                {"role": "assistant", "content": "0123456789"},
            ]
        }
        for i in range(24)
    ]
    data = root / "chat.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = root / "run"
    recipe = Path(__file__).resolve().parents[1] / "recipes" / "qwen3-8b" / "eagle3.yaml"
    overrides = ["max_length=64", "max_steps=2", "warmup_steps=1", "eval_fraction=0.1", "report_to=none"]
    args = [str(recipe), f"target={target_dir}", f"data={data}", *overrides, f"output_dir={run}"]
    assert cli_main(["train", *args, "--no-progress"]) == 0
    return run


# The model families that ship a recipe for every method.
REAL_RECIPE_FAMILIES = [
    "llama-3.1-8b",
    "llama-3.3-70b",
    "qwen2.5-7b",
    "qwen3-8b",
    "mistral-7b",
    "smollm2-135m",
]


def recipe_header(path: Path) -> str:
    """A recipe's comment lines before its first key."""
    lines = []
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            break
        lines.append(line)
    return "\n".join(lines)


def without_chat_template(target_dir: Path, path: Path) -> Path:
    """A copy of `target_dir` at `path` as a base model brings it: the same weights and tokenizer, no chat
    template."""
    import json
    import shutil

    shutil.copytree(target_dir, path)
    (path / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((path / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


def tiny_cache_args(target: Path, data: Path, out: Path, max_length: int, *extra: str) -> list[str]:
    """`specheads cache` arguments: the tiny EAGLE-3 recipe (fused layers 1, 2, 3) over `data`, evaluated on a
    split of it, into `out`; `extra` flags follow."""
    return [
        str(Path(__file__).resolve().parents[1] / "recipes" / "tiny" / "eagle3.yaml"),
        f"target={target}",
        f"data={data}",
        f"max_length={max_length}",
        "eval_fraction=0.1",
        "eval_data=[]",  # the recipe evaluates on stdlib; these runs on a split of their data
        "eagle3.layers=1,2,3",
        "--out",
        str(out),
        *extra,
    ]
