"""`specheads tiny-target`: the embedded default target, built offline and deterministically.

A small Llama-architecture causal LM trained for a few minutes on the CPU over the Python standard
library's source (DESIGN.md, "The embedded default"). The result is an ordinary HF directory:

    config.json, generation_config.json, model.safetensors      AutoModelForCausalLM loads it
    tokenizer.json, tokenizer_config.json, chat_template.jinja  AutoTokenizer loads it (BPE + chat template)
    heldout_files.json, heldout/                                the held-out corpus files (evaluation prompts)
    specheads_tiny_target.json                                  how it was built and its held-out loss

The corpus is pinned (data/stdlib_corpus.py), so every machine trains on the same bytes. The budget is
a step count; `--minutes` turns minutes into steps at the rate this 2-core reference machine trains
(STEPS_PER_MINUTE). A seed gives the same weights on machines whose CPU kernels round alike (the same
build, instruction set and thread count give the same bytes; tests/train/test_tiny_target.py); on
others the fp32 roundings differ and training carries them on, so the weights, and every figure measured
on them, vary: README gives the ranges measured over several builds.
"""

from __future__ import annotations

import hashlib
import json
import math
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from specheads.core.atomic import replace_dir
from specheads.core.confined import confined
from specheads.core.manifest import cache_root
from specheads.data import stdlib_corpus
from specheads.version import __version__

META_FILE = "specheads_tiny_target.json"
HELDOUT_FILE = "heldout_files.json"
HELDOUT_DIR = "heldout"  # the held-out files' text, so the target carries its own evaluation prompts
BOS, EOS, PAD, END = "<|bos|>", "<|eos|>", "<|pad|>", "<|end|>"
ROLE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>"]
# Assistant content is wrapped in {% generation %} so `return_assistant_tokens_mask` finds it.
CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{{- '<|' + message['role'] + '|>\n' -}}"
    "{%- if message['role'] == 'assistant' -%}"
    "{% generation %}{{- message['content'] + '<|end|>' -}}{% endgeneration %}"
    "{%- else -%}"
    "{{- message['content'] + '<|end|>' -}}"
    "{%- endif -%}"
    "{{- '\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>\n' -}}{%- endif -%}"
)
# Optimizer steps per budget minute for the default model on the 2-core reference machine: 0.22 s a
# step measured quiet, less the ~30 s of corpus preparation and evaluation in a 5-minute budget.
STEPS_PER_MINUTE = 240


@dataclass(frozen=True)
class TinyLlamaConfig:
    """A small Llama trained here from scratch: its sizes and its optimizer schedule (adamw_steps, lr_at).
    The defaults are the tiny target's; a draft's config (builders/tiny_draft.py) restates what it changes.
    """

    seed: int = 0
    # Chosen with benchmarks/tune_tiny_target.py at a 4.3-minute training budget (held-out nats/token):
    # h256 b16 5.80, h192 b16 5.59, h256 b8 5.69, h192 b8 lr 2e-3 5.34, h192 b8 5.33, h128 b8 4.79.
    # Under-trained at this budget, smaller models that take more steps win.
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 2
    num_kv_heads: int = 2
    intermediate_size: int = 352
    batch_size: int = 8
    lr: float = 3e-3
    warmup_steps: int = 30

    def fresh_model(self, vocab_size: int, positions: int, tokenizer=None, tied: bool = False):
        """A LlamaForCausalLM of these sizes, initialised from `seed`, with `tokenizer`'s special ids (None:
        none, a model that is only timed)."""
        from transformers import LlamaConfig, LlamaForCausalLM  # lazy: seconds at every command's start

        torch.manual_seed(self.seed)
        return LlamaForCausalLM(
            LlamaConfig(
                vocab_size=vocab_size,
                hidden_size=self.hidden_size,
                intermediate_size=self.intermediate_size,
                num_hidden_layers=self.num_layers,
                num_attention_heads=self.num_heads,
                num_key_value_heads=self.num_kv_heads,
                max_position_embeddings=positions,
                tie_word_embeddings=tied,
                bos_token_id=getattr(tokenizer, "bos_token_id", None),
                eos_token_id=getattr(tokenizer, "eos_token_id", None),
                pad_token_id=getattr(tokenizer, "pad_token_id", None),
            )
        )


@dataclass(frozen=True)
class TinyTargetConfig(TinyLlamaConfig):
    """Everything that decides the tiny target's weights. Its hash names the cache entry."""

    minutes: float = 5.0  # budget, converted to steps with STEPS_PER_MINUTE
    steps: int | None = None  # exact step count; overrides `minutes`
    vocab_size: int = 4096
    seq_len: int = 256
    heldout_fraction: float = 0.03
    chats_per_file: int = 3  # chat samples made from documented functions in each training file
    eval_blocks: int = 48  # held-out blocks of seq_len tokens for the held-out loss
    max_files: int | None = None  # read only this many training files (tests)

    @property
    def total_steps(self) -> int:
        return self.steps if self.steps is not None else max(1, round(self.minutes * STEPS_PER_MINUTE))

    def key(self) -> str:
        corpus = stdlib_corpus.stdlib_corpus().key
        payload = {"config": asdict(self), "specheads": __version__, "corpus": corpus}
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def default_cache_dir() -> Path:
    return cache_root()


def default_output_dir(cfg: TinyTargetConfig) -> Path:
    return default_cache_dir() / "tiny-target" / cfg.key()


def read_build_meta(path: Path, meta_file: str, needed: tuple[str, ...]) -> dict | None:
    """The build record `meta_file` of a finished build at `path`, or None if it is unreadable or any of
    the files `needed` is missing."""
    try:
        meta = json.loads((Path(path) / meta_file).read_text())
    except (OSError, ValueError):
        return None
    return meta if all((Path(path) / f).exists() for f in needed) else None


def read_meta(path: Path) -> dict | None:
    """The build record of a finished tiny target at `path`, or None if there is none."""
    return read_build_meta(
        path, META_FILE, ("config.json", "model.safetensors", "tokenizer.json", HELDOUT_FILE)
    )


# -- tokenizer ------------------------------------------------------------------------------------


def train_tokenizer(texts: list[str], vocab_size: int):
    """Byte-level BPE over `texts`, wrapped as a transformers fast tokenizer with a chat template."""
    from tokenizers import (  # lazy: only the tiny-target build trains a tokenizer
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import (
        PreTrainedTokenizerFast,  # lazy: transformers adds seconds to every command's start
    )

    specials = [BOS, EOS, PAD, END, *ROLE_TOKENS]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    # Like Llama: plain encoding starts with BOS; the chat template writes its own BOS.
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", special_tokens=[(BOS, tok.token_to_id(BOS))]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=[END, *ROLE_TOKENS],
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


# -- data -----------------------------------------------------------------------------------------


def load_corpus(cfg: TinyTargetConfig) -> tuple[str, list[str], list[str], list[str], list[str]]:
    """(corpus key, train files, held-out files, train texts, held-out texts)."""
    corpus = stdlib_corpus.stdlib_corpus()
    train_files, heldout_files = stdlib_corpus.split_files(corpus.files, cfg.heldout_fraction)
    if cfg.max_files is not None:
        train_files = train_files[: cfg.max_files]
        heldout_files = heldout_files[: max(1, cfg.max_files // 10)]
    train_texts = [corpus.texts[f] for f in train_files]
    heldout_texts = [corpus.texts[f] for f in heldout_files]
    return corpus.key, train_files, heldout_files, train_texts, heldout_texts


def token_stream(tokenizer, texts: list[str], chats: list[list[dict]] = ()) -> torch.Tensor:
    """All documents as one 1-D stream: `BOS text EOS` for files, the chat template for chats."""
    ids = []
    for enc in tokenizer(texts, add_special_tokens=True)["input_ids"]:
        ids.extend(enc)
        ids.append(tokenizer.eos_token_id)
    for chat in chats:
        ids.extend(tokenizer.apply_chat_template(chat, tokenize=True, return_dict=False))
    return torch.tensor(ids, dtype=torch.long)


def eval_blocks(stream: torch.Tensor, seq_len: int, n: int) -> torch.Tensor:
    """Up to n non-overlapping blocks (n, seq_len) spread evenly over the stream."""
    total = stream.numel() // seq_len
    if total == 0:
        raise ValueError(f"held-out text has {stream.numel()} tokens, fewer than one block of {seq_len}")
    starts = torch.linspace(0, total - 1, min(n, total)).long() * seq_len
    return torch.stack([stream[s : s + seq_len] for s in starts.tolist()])


@torch.no_grad()
def heldout_loss(model, blocks: torch.Tensor, batch_size: int) -> float:
    """Mean next-token cross-entropy (nats/token) over the held-out blocks."""
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(blocks), batch_size):
        x = blocks[i : i + batch_size]
        logits = model(input_ids=x).logits[:, :-1]
        total += F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten(), reduction="sum").item()
        count += x[:, 1:].numel()
    model.train()
    return total / count


def lr_at(step: int, cfg: TinyTargetConfig) -> float:
    """Linear warmup, then cosine decay to a tenth of the peak."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.total_steps - cfg.warmup_steps)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def adamw_steps(model, cfg, steps: int, loss_of, progress: bool, desc: str) -> None:
    """`steps` AdamW steps at `lr_at(step, cfg)`, gradients clipped to norm 1, each on the loss `loss_of(gen)`
    returns (`gen` a CPU generator seeded with cfg.seed, for its batch draws); leaves the model in eval."""
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(cfg.seed)
    bar = tqdm(range(steps), desc=desc, disable=not progress, dynamic_ncols=True)
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, cfg)
        loss = loss_of(gen)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        bar.set_postfix(loss=f"{loss.item():.3f}", lr=f"{lr_at(step, cfg):.1e}")
    bar.close()
    model.eval()


def train_steps(model, stream: torch.Tensor, cfg: TinyTargetConfig, progress: bool, desc: str) -> None:
    """Next-token training on random seq_len windows of `stream` for cfg.total_steps; leaves it in eval."""

    def loss_of(gen: torch.Generator) -> torch.Tensor:
        starts = torch.randint(0, stream.numel() - cfg.seq_len, (cfg.batch_size,), generator=gen)
        x = torch.stack([stream[s : s + cfg.seq_len] for s in starts.tolist()])  # (B, T)
        logits = model(input_ids=x).logits[:, :-1]
        return F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())

    adamw_steps(model, cfg, cfg.total_steps, loss_of, progress, desc)


# -- build ----------------------------------------------------------------------------------------


def build(cfg: TinyTargetConfig, out: Path, progress: bool = True) -> dict:
    """Train the tiny target into `out` (written whole: a temporary folder renamed at the end)."""
    from transformers import GenerationConfig  # lazy: transformers adds seconds to every command's start

    started = time.time()
    corpus_key, train_files, heldout_files, train_texts, heldout_texts = load_corpus(cfg)
    tokenizer = train_tokenizer(train_texts, cfg.vocab_size)
    chats = [c for text in train_texts for c in stdlib_corpus.function_chats(text, cfg.chats_per_file)]
    stream = token_stream(tokenizer, train_texts, chats)
    heldout_stream = token_stream(tokenizer, heldout_texts)
    blocks = eval_blocks(heldout_stream, cfg.seq_len, cfg.eval_blocks)
    chars_per_token = sum(map(len, heldout_texts)) / heldout_stream.numel()
    if stream.numel() <= cfg.seq_len + 1:
        raise ValueError(f"training text has {stream.numel()} tokens, fewer than one block of {cfg.seq_len}")

    model = cfg.fresh_model(len(tokenizer), 4 * cfg.seq_len, tokenizer, tied=False)
    train_steps(model, stream, cfg, progress, desc="tiny-target")
    loss_heldout = heldout_loss(model, blocks, cfg.batch_size)
    model.eval()

    meta = {
        "key": cfg.key(),
        "builder": asdict(cfg),
        "steps": cfg.total_steps,
        "train_tokens_seen": cfg.total_steps * cfg.batch_size * cfg.seq_len,
        "train_stream_tokens": stream.numel(),
        "chat_samples": len(chats),
        "parameters": sum(p.numel() for p in model.parameters()),
        "heldout_loss": loss_heldout,
        # Comparable across vocabularies: nats/token over (chars/token * ln 2).
        "heldout_bits_per_char": loss_heldout / (chars_per_token * math.log(2)),
        "heldout_tokens": blocks[:, 1:].numel(),
        "build_seconds": None,
        "corpus": corpus_key,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "specheads": __version__,
    }
    with replace_dir(out) as tmp:
        model.generation_config = GenerationConfig(
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=[tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(END)],
            pad_token_id=tokenizer.pad_token_id,
        )
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        for name, text in zip(heldout_files, heldout_texts):
            (tmp / HELDOUT_DIR / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / HELDOUT_DIR / name).write_text(text, encoding="utf-8")
        # "root" is relative to this file: the target folder carries its prompts wherever it is moved
        record = {
            "root": HELDOUT_DIR,
            "corpus": corpus_key,
            "train_files": len(train_files),
            "files": heldout_files,
        }
        (tmp / HELDOUT_FILE).write_text(json.dumps(record, indent=1))
        meta["build_seconds"] = round(time.time() - started, 1)
        (tmp / META_FILE).write_text(json.dumps(meta, indent=1))
    return meta


def ensure_tiny_target(
    cfg: TinyTargetConfig = TinyTargetConfig(),
    out: Path | None = None,
    force: bool = False,
    progress: bool = True,
) -> tuple[Path, dict, bool]:
    """Build the tiny target, or reuse a finished build made with the same settings.

    Returns (directory, build record, reused). An explicit `out` that holds anything other than a
    tiny target of these settings is never overwritten without `force`.
    """
    out = Path(out).expanduser() if out is not None else default_output_dir(cfg)
    meta = read_meta(out)
    if meta is not None and meta.get("key") == cfg.key() and not force:
        return out, meta, True
    if out.exists() and any(out.iterdir()) and not force:
        if meta is not None:
            raise FileExistsError(
                f"{out} holds a tiny target built with other settings ({meta.get('builder')}); "
                "pass --force to rebuild it"
            )
        raise FileExistsError(
            f"{out} exists and is not a tiny target; refusing to overwrite it (pass --force)"
        )
    return out, build(cfg, out, progress=progress), False


def greedy_sample(path: Path, prompt_tokens: int = 48, new_tokens: int = 48) -> tuple[str, str, str]:
    """(held-out file, its first `prompt_tokens` tokens, the target's greedy continuation)."""
    from transformers import (  # lazy: transformers adds seconds to every command's start
        AutoModelForCausalLM,
        AutoTokenizer,
    )

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    heldout = json.loads((Path(path) / HELDOUT_FILE).read_text())
    root = confined(path, heldout["root"], Path(path) / HELDOUT_FILE, '"root"')
    for f in heldout["files"]:
        confined(root, f, Path(path) / HELDOUT_FILE, f'"files" entry {f!r}')
    # The first held-out module of ordinary size (the largest held-out files are generated tables).
    sizes = {f: (root / f).stat().st_size for f in heldout["files"]}
    name = next((f for f in heldout["files"] if 4_000 <= sizes[f] <= 100_000), max(sizes, key=sizes.get))
    text = (root / name).read_text(encoding="utf-8", errors="replace")
    ids = tokenizer(text, return_tensors="pt")["input_ids"][:, :prompt_tokens]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=new_tokens, do_sample=False)
    return name, tokenizer.decode(ids[0], skip_special_tokens=True), tokenizer.decode(out[0, ids.shape[1] :])
