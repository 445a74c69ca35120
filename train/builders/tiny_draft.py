"""`specheads tiny-draft`: a small draft model for a target's assisted generation, in its own tokens.

transformers' assisted generation (`target.generate(assistant_model=draft)`) runs a small causal LM
ahead of the target and needs its token ids to mean what the target's mean. For the embedded default
target (`specheads tiny-target`) this trains one the way the target was trained: the same stdlib
corpus and held-out split, the same token stream and learning-rate schedule (train/builders/tiny_target.py),
but a smaller model, and the target's own tokenizer loaded from the target directory instead of a new
one. The result is an ordinary HF directory:

    config.json, generation_config.json, model.safetensors   the draft (the target's vocab and EOS ids)
    tokenizer.json, tokenizer_config.json, ...                the target's tokenizer, copied
    specheads_tiny_draft.json                                  how it was built, for which target

    specheads tiny-draft --target ~/.cache/specheads/tiny-target/<key>
    specheads compare --target ... --draft-model ~/.cache/specheads/tiny-draft/<key> ...

Like the target it is deterministic for a seed and cached under the user cache, keyed by its settings
and the target it was made for; a finished build with the same key is reused.
"""

from __future__ import annotations

import hashlib
import json
import platform
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import torch

from specheads.heads.atomic import replace_dir
from specheads.heads.target import vocab_hash
from specheads.train.builders.tiny_target import (
    HELDOUT_FILE,
    TinyTargetConfig,
    default_cache_dir,
    eval_blocks,
    heldout_loss,
    load_corpus,
    token_stream,
    train_steps,
)
from specheads.train.builders.tiny_target import read_meta as read_target_meta
from specheads.train.data import stdlib_corpus
from specheads.version import __version__

META_FILE = "specheads_tiny_draft.json"


@dataclass(frozen=True)
class TinyDraftConfig:
    """The draft's own settings. The corpus (files, held-out split, chats) is the target's.

    2 layers of 64 against the default target's 4 of 128: about a quarter of its multiply-adds per
    token, still enough to guess the target's commonest continuations (indentation, keywords, names).
    """

    seed: int = 0
    steps: int = 600  # 110 s of CPU time on the 2-core reference machine, corpus preparation included
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 2
    num_kv_heads: int = 2
    intermediate_size: int = 176
    seq_len: int = 256
    batch_size: int = 8
    lr: float = 3e-3
    warmup_steps: int = 30
    eval_blocks: int = 48


def corpus_config(target_dir: Path) -> TinyTargetConfig:
    """The corpus settings the target was built with (the defaults for a target not built here)."""
    meta = read_target_meta(target_dir)
    return TinyTargetConfig(**meta["builder"]) if meta is not None else TinyTargetConfig()


def training_config(cfg: TinyDraftConfig, corpus: TinyTargetConfig) -> TinyTargetConfig:
    """The target's build settings with the draft's model, steps and schedule (what lr_at reads)."""
    return replace(corpus, **{f.name: getattr(cfg, f.name) for f in fields(TinyDraftConfig)})


def target_identity(target_dir: Path, tokenizer) -> dict:
    """What names the target a draft is for: its tiny-target build key (if any) and vocabulary hash."""
    meta = read_target_meta(target_dir)
    return {"tiny_target_key": meta["key"] if meta else None, "vocab_hash": vocab_hash(tokenizer)}


def draft_key(cfg: TinyDraftConfig, identity: dict) -> str:
    payload = {
        "config": asdict(cfg),
        "target": identity,
        "specheads": __version__,
        "python": platform.python_version(),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def load_target_side(target_dir: Path):
    """(tokenizer, config) of the target, with errors that name what is missing."""
    from transformers import (  # lazy: transformers adds seconds to every command's start
        AutoConfig,
        AutoTokenizer,
    )

    target_dir = Path(target_dir).expanduser()
    if not (target_dir / "config.json").is_file():
        raise FileNotFoundError(
            f"--target {target_dir}: no config.json there (expected an HF model directory)"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(target_dir)
    except (OSError, ValueError) as e:
        raise FileNotFoundError(
            f"--target {target_dir}: no tokenizer could be loaded; the draft is trained in the target's "
            f"tokens ({e})"
        ) from e
    return tokenizer, AutoConfig.from_pretrained(target_dir)


def check_heldout_split(target_dir: Path, heldout_files: list[str]) -> None:
    """Raise if the target lists held-out files other than the ones this draft leaves out of training."""
    path = Path(target_dir) / HELDOUT_FILE
    if not path.is_file():
        return
    listed = json.loads(path.read_text())["files"]
    if sorted(listed) != sorted(heldout_files):
        raise ValueError(
            f"{path} lists {len(listed)} held-out files but the corpus splits into {len(heldout_files)} "
            f"others; the draft would train on the target's evaluation prompts (was the target built by "
            f"another specheads, with another corpus?)"
        )


def build(target_dir: Path, cfg: TinyDraftConfig, out: Path, progress: bool = True) -> dict:
    """Train the draft for the target at `target_dir` into `out` (a temporary folder renamed at the end)."""
    from transformers import (  # lazy: transformers adds seconds to every command's start
        GenerationConfig,
        LlamaConfig,
        LlamaForCausalLM,
    )

    started = time.time()
    target_dir = Path(target_dir).expanduser()
    tokenizer, target_config = load_target_side(target_dir)
    train_cfg = training_config(cfg, corpus_config(target_dir))
    _, train_files, heldout_files, train_texts, heldout_texts = load_corpus(train_cfg)
    check_heldout_split(target_dir, heldout_files)
    chats = [c for text in train_texts for c in stdlib_corpus.function_chats(text, train_cfg.chats_per_file)]
    stream = token_stream(tokenizer, train_texts, chats)
    blocks = eval_blocks(token_stream(tokenizer, heldout_texts), cfg.seq_len, cfg.eval_blocks)
    if stream.numel() <= cfg.seq_len + 1:
        raise ValueError(f"training text has {stream.numel()} tokens, fewer than one block of {cfg.seq_len}")

    torch.manual_seed(cfg.seed)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=target_config.vocab_size,  # the target's rows: ids must mean the same tokens
            hidden_size=cfg.hidden_size,
            intermediate_size=cfg.intermediate_size,
            num_hidden_layers=cfg.num_layers,
            num_attention_heads=cfg.num_heads,
            num_key_value_heads=cfg.num_kv_heads,
            max_position_embeddings=getattr(target_config, "max_position_embeddings", 4 * cfg.seq_len),
            tie_word_embeddings=False,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    )
    train_steps(model, stream, train_cfg, progress, desc="tiny-draft")
    meta = {
        "key": draft_key(cfg, target_identity(target_dir, tokenizer)),
        "builder": asdict(cfg),
        "target": {"path": str(target_dir), **target_identity(target_dir, tokenizer)},
        "corpus": {
            "train_files": len(train_files),
            "heldout_files": heldout_files,
            "chat_samples": len(chats),
        },
        "steps": train_cfg.total_steps,
        "parameters": sum(p.numel() for p in model.parameters()),
        "heldout_loss": heldout_loss(model, blocks, cfg.batch_size),
        "build_seconds": None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "specheads": __version__,
    }
    with replace_dir(out) as tmp:
        # The target's EOS ids (a list for the tiny target: <|eos|> and <|end|>), so both stop alike.
        eos = tokenizer.eos_token_id
        if (target_dir / "generation_config.json").is_file():
            eos = GenerationConfig.from_pretrained(target_dir).eos_token_id
        model.generation_config = GenerationConfig(
            bos_token_id=tokenizer.bos_token_id, eos_token_id=eos, pad_token_id=tokenizer.pad_token_id
        )
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        meta["build_seconds"] = round(time.time() - started, 1)
        (tmp / META_FILE).write_text(json.dumps(meta, indent=1))
    return meta


def read_meta(path: Path) -> dict | None:
    """The build record of a finished draft at `path`, or None if there is none."""
    try:
        meta = json.loads((Path(path) / META_FILE).read_text())
    except (OSError, ValueError):
        return None
    needed = ("config.json", "model.safetensors", "tokenizer_config.json")
    return meta if all((Path(path) / f).exists() for f in needed) else None


def default_output_dir(key: str) -> Path:
    return default_cache_dir() / "tiny-draft" / key


def ensure_tiny_draft(
    target_dir: Path,
    cfg: TinyDraftConfig = TinyDraftConfig(),
    out: Path | None = None,
    force: bool = False,
    progress: bool = True,
) -> tuple[Path, dict, bool]:
    """Build the draft for `target_dir`, or reuse a finished build with the same settings and target.

    Returns (directory, build record, reused). An explicit `out` holding anything else is never
    overwritten without `force`.
    """
    tokenizer, _ = load_target_side(target_dir)
    key = draft_key(cfg, target_identity(Path(target_dir).expanduser(), tokenizer))
    out = Path(out).expanduser() if out is not None else default_output_dir(key)
    meta = read_meta(out)
    if meta is not None and meta.get("key") == key and not force:
        return out, meta, True
    if out.exists() and any(out.iterdir()) and not force:
        what = "a draft built with other settings or for another target" if meta else "not a tiny draft"
        raise FileExistsError(f"{out} holds {what}; refusing to overwrite it (pass --force)")
    return out, build(target_dir, cfg, out, progress=progress), False
