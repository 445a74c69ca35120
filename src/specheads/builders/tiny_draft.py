"""`specheads tiny-draft`: a small draft model for a target's assisted generation, in its own tokens.

transformers' assisted generation (`target.generate(assistant_model=draft)`) runs a small causal LM
ahead of the target and needs its token ids to mean what the target's mean. For the embedded default
target (`specheads tiny-target`) this trains one the way the target was trained: the same stdlib
corpus and held-out split, the same token stream and learning-rate schedule (builders/tiny_target.py),
but a smaller model, and the target's own tokenizer loaded from the target directory instead of a new
one. The result is an ordinary HF directory:

    config.json, generation_config.json, model.safetensors   the draft (the target's vocab and EOS ids)
    tokenizer.json, tokenizer_config.json, ...                the target's tokenizer, copied
    specheads_tiny_draft.json                                  how it was built, for which target

    specheads tiny-draft --target ~/.cache/specheads/tiny-target/<key>
    specheads compare --target ... --draft-model ~/.cache/specheads/tiny-draft/<key> ...

Like the target it is deterministic for a seed and cached under the user cache, keyed by its settings
and the target it was made for; a finished build with the same key is reused.

Any other target (SmolLM2) has no corpus of its own here: its draft is distilled from its answers, a
`specheads distill` folder (`--data`), tokenised in its chat template as `specheads train` tokenises
rows, with the cross-entropy on the assistant tokens, whose labels are the target's greedy choices.
The key then names the data's bytes too. The draft ties its embeddings (at a 49152-token vocabulary
they are most of it) and starts them as the target's, projected on their top principal axes.

    specheads distill --target smollm2 --source seed-prompts.jsonl --temperature 0 --out DIR
    specheads tiny-draft --target smollm2 --data DIR [DIR ...]
"""

from __future__ import annotations

import hashlib
import json
import platform
import time
from dataclasses import asdict, dataclass, fields, replace
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from datasets import concatenate_datasets
from safetensors import safe_open

from specheads.builders.tiny_target import (
    HELDOUT_FILE,
    TinyLlamaConfig,
    TinyTargetConfig,
    adamw_steps,
    default_cache_dir,
    eval_blocks,
    heldout_loss,
    load_corpus,
    read_build_meta,
    token_stream,
    train_steps,
)
from specheads.builders.tiny_target import read_meta as read_target_meta
from specheads.core.atomic import replace_dir
from specheads.core.target import vocab_hash
from specheads.data import collate, load_rows, stdlib_corpus, tokenize_rows
from specheads.data.checks import SETTINGS_FILE, check_distill_folder
from specheads.data.distill_folder import finished_parts, is_complete
from specheads.version import __version__

META_FILE = "specheads_tiny_draft.json"


@dataclass(frozen=True)
class TinyDraftConfig(TinyLlamaConfig):
    """The draft's own settings: the tiny target's schedule, a smaller model. The corpus (files, held-out
    split, chats) is the target's.

    2 layers of 64 against the default target's 4 of 128: about a quarter of its multiply-adds per
    token, still enough to guess the target's commonest continuations (indentation, keywords, names).
    """

    steps: int = 600  # 110 s of CPU time on the 2-core reference machine, corpus preparation included
    hidden_size: int = 64
    num_layers: int = 2
    intermediate_size: int = 176
    seq_len: int = 256
    eval_blocks: int = 48


def draft_model(cfg: TinyLlamaConfig, target_config, tokenizer, positions: int, tied: bool):
    """A fresh LlamaForCausalLM of `cfg`'s sizes (seeded) in the target's vocabulary and special ids: its
    ids must mean the target's tokens. `positions` when the target's config names none."""
    return cfg.fresh_model(
        target_config.vocab_size,
        getattr(target_config, "max_position_embeddings", positions),
        tokenizer,
        tied=tied,
    )


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

    model = draft_model(cfg, target_config, tokenizer, 4 * cfg.seq_len, tied=False)
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
    return save_draft(model, tokenizer, target_dir, out, meta, started)


def save_draft(model, tokenizer, target_dir: Path, out: Path, meta: dict, started: float) -> dict:
    """Write the draft, the target's tokenizer (chat template included) and the build record into `out`
    at once (a temporary folder renamed at the end); returns the record with its build time."""
    from transformers import GenerationConfig  # lazy: seconds at every command's start

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


# -- a draft distilled from the target's answers (any target) -------------------------------------


@dataclass(frozen=True)
class DistilledDraftConfig(TinyLlamaConfig):
    """A draft for any target, trained on its own answers (a `specheads distill` folder): next-token
    cross-entropy on the assistant tokens, whose labels are the target's (greedy) choices.

    4 layers of 128 (the tiny target's) with 4 heads and tied embeddings: at SmolLM2's 49152 tokens the
    embedding is most of its 7M parameters and of its multiply-adds per token, about 5% of the 135M
    target's.
    """

    steps: int = 300
    num_heads: int = 4
    intermediate_size: int = 384
    max_length: int = 512
    warmup_steps: int = 20
    heldout_rows: int = 32  # the folder's last rows, left out of training for the held-out loss
    init_from_target: bool = True  # the embedding starts as the target's, on its top principal axes

    @property
    def total_steps(self) -> int:  # what lr_at reads
        return self.steps


def check_distill_data(data: Path, tokenizer, partial_data: bool = False) -> dict:
    """The settings of the finished `specheads distill` output at `data` (with `partial_data`, of one that may be
    unfinished: its finished chunks are read), checked to be in the target's tokens; errors name --data and
    what was expected."""
    data = Path(data).expanduser()
    if not data.is_dir():
        raise FileNotFoundError(
            f"--data {data}: no such folder (expected a `specheads distill --out` folder)"
        )
    try:
        settings = json.loads((data / SETTINGS_FILE).read_text())
    except (OSError, ValueError):
        raise ValueError(
            f"--data {data}: not a `specheads distill` output (no readable {SETTINGS_FILE}); the draft learns "
            f"from the target's own answers: run `specheads distill --target T --out {data}` first"
        ) from None
    if not partial_data:
        try:  # finished, its parts holding what its summary counts
            check_distill_folder(data, f"--data {data}")
        except ValueError as e:
            raise ValueError(f"{e}; or pass --partial to train on its finished chunks") from None
    elif not finished_parts(data):
        raise ValueError(f"--data {data}: no finished chunk yet (no part with its record in _chunks/)")
    theirs, ours = settings.get("target", {}).get("vocab_hash"), vocab_hash(tokenizer)
    if theirs != ours:
        raise ValueError(
            f"--data {data} was distilled from a target with another vocabulary (vocab_hash {str(theirs)[:12]}, "
            f"this target's {ours[:12]}); distill this target's answers for its draft"
        )
    return settings


def data_fingerprint(folders: dict[Path, list[Path]]) -> str:
    """sha256 of each distill folder's settings and the parts read from it, in the order given: the rows
    the draft learns from (one folder's is what it was before several could be given)."""
    digest = hashlib.sha256()
    for data, parts in folders.items():
        for file in [Path(data).expanduser() / SETTINGS_FILE, *parts]:
            digest.update(file.name.encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()[:16]


def distilled_rows(folders: dict[Path, list[Path]], tokenizer, cfg: DistilledDraftConfig):
    """(training rows, held-out rows): the conversations of the folders' parts, in order, in the target's
    chat template, labels on the assistant tokens (end of turn included), as `specheads train` tokenises
    them; the held-out rows are the last ones (of the last folder)."""
    rows = concatenate_datasets(
        [load_rows(p, include_capped=True) for parts in folders.values() for p in parts]
    )  # capped: still the target's
    tokens = tokenize_rows(rows, tokenizer, max_length=cfg.max_length, loss_on="assistant")
    heldout = min(cfg.heldout_rows, len(tokens) // 4)
    if len(tokens) - heldout < 1:
        named = " ".join(str(d) for d in folders)
        raise ValueError(f"--data {named}: no rows left to train on after tokenising ({len(tokens)} rows)")
    split = len(tokens) - heldout
    return tokens.select(range(split)), tokens.select(range(split, len(tokens)))


def target_embedding_axes(target_dir: Path, k: int, initializer_std: float) -> torch.Tensor | None:
    """(V, k') the target's input embedding E (V, H) on its top k' = min(k, H) principal axes, E V_k' =
    U_k' S_k' (the best rank-k' view of which tokens the target treats alike), scaled to an entry std of
    `initializer_std`; None when its weights are not one safetensors file holding an embed_tokens."""
    path = Path(target_dir) / "model.safetensors"
    if not path.is_file():
        return None
    with safe_open(path, "pt") as f:
        name = next((n for n in f.keys() if n.endswith("embed_tokens.weight")), None)
        if name is None:
            return None
        embedding = f.get_tensor(name).float()  # (V, H)
    _, _, vh = torch.linalg.svd(embedding, full_matrices=False)  # E = U S Vh
    axes = embedding @ vh[: min(k, embedding.shape[1])].T
    # At the target's scale the tied output starts with logits of tens (loss 24 on SmolLM2 against
    # ln V = 10.8): scaled to the usual initial std, the geometry stays and the first logits are small.
    return axes * (initializer_std / axes.std())


def label_loss(model, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed cross-entropy, correct top-1 count) of the draft on the label tokens of `batch`.

    Logits only where token t + 1 is a label: at a 49152-token vocabulary the output layer is most of the
    work, and the prompt and the padding need none.
    """
    hidden = model.model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
    ).last_hidden_state  # (B, T, C)
    labels = batch["loss_mask"][:, 1:].bool()  # (B, T-1): token t + 1 is a label, predicted at t
    logits = model.lm_head(hidden[:, :-1][labels])  # (N, V)
    targets = batch["input_ids"][:, 1:][labels]  # (N,) the target's own tokens
    correct = (logits.argmax(-1) == targets).sum()
    return F.cross_entropy(logits, targets, reduction="sum"), correct


def train_on_rows(model, rows, make_batch, cfg: DistilledDraftConfig, progress: bool) -> None:
    """cfg.steps AdamW steps on batches of rows drawn without replacement, epoch after epoch (seeded);
    the loss is the mean over a batch's label tokens. Leaves the model in eval."""
    order: list[int] = []

    def loss_of(gen: torch.Generator) -> torch.Tensor:
        nonlocal order
        while len(order) < cfg.batch_size:
            order += torch.randperm(len(rows), generator=gen).tolist()
        picked, order = order[: cfg.batch_size], order[cfg.batch_size :]
        batch = make_batch([rows[i] for i in picked])
        total, _ = label_loss(model, batch)
        return total / batch["loss_mask"][:, 1:].sum().clamp(min=1)

    adamw_steps(model, cfg, cfg.steps, loss_of, progress, "tiny-draft (distilled)")


@torch.no_grad()
def rows_loss(model, rows, make_batch, batch_size: int) -> tuple[float, float]:
    """(cross-entropy in nats/token, top-1 agreement with the target) over the label tokens of `rows`."""
    model.eval()
    total, correct, count = 0.0, 0, 0
    for start in range(0, len(rows), batch_size):
        batch = make_batch([rows[i] for i in range(start, min(start + batch_size, len(rows)))])
        loss, right = label_loss(model, batch)
        total, correct = total + loss.item(), correct + int(right)
        count += int(batch["loss_mask"][:, 1:].sum())
    return total / max(count, 1), correct / max(count, 1)


def build_distilled(
    target_dir: Path,
    folders: dict[Path, list[Path]],
    cfg: DistilledDraftConfig,
    out: Path,
    identity: dict,
    settings: dict[Path, dict],
    progress: bool = True,
    device: str = "cpu",
) -> dict:
    """Train a draft for the target at `target_dir` on its answers in distill folders, into `out` (a
    temporary folder renamed at the end). `folders` (each folder and the part files read from it),
    `settings` (each folder's, checked) and `identity` (the target's and the data's, as the key names
    them) come from ensure_tiny_draft, which read them.
    `device` is where it trains (fp32 either way; the key does not name it, the build record does)."""
    started = time.time()
    target_dir = Path(target_dir).expanduser()
    tokenizer, target_config = load_target_side(target_dir)
    train_rows, heldout_rows = distilled_rows(folders, tokenizer, cfg)
    pad = partial(  # right padding, one row per sequence
        collate, pad_token_id=tokenizer.pad_token_id, packing=False, max_length=cfg.max_length
    )

    def make_batch(rows):
        return {k: v.to(device) if torch.is_tensor(v) else v for k, v in pad(rows).items()}

    model = draft_model(
        cfg, target_config, tokenizer, cfg.max_length, tied=True
    )  # tied: the vocabulary is most of the draft
    init_std = model.config.initializer_range
    axes = target_embedding_axes(target_dir, cfg.hidden_size, init_std) if cfg.init_from_target else None
    if axes is not None:
        with torch.no_grad():
            model.get_input_embeddings().weight[: axes.shape[0], : axes.shape[1]] = axes
    model.to(device)
    train_on_rows(model, train_rows, make_batch, cfg, progress)
    loss, top1 = rows_loss(model, heldout_rows, make_batch, cfg.batch_size)
    model.to("cpu")
    read = [
        {
            "path": str(data),
            "finished_parts": len(parts),
            "complete": is_complete(data),
            "distilled": {
                k: settings[data].get(k) for k in ("source", "temperature", "max_new_tokens", "seed")
            },
        }
        for data, parts in folders.items()
    ]
    meta = {
        "key": draft_key(cfg, identity),
        "builder": asdict(cfg),
        "target": {"path": str(target_dir), **{k: v for k, v in identity.items() if k != "data"}},
        "data": {
            "fingerprint": identity["data"],
            "finished_parts": sum(f["finished_parts"] for f in read),
            "complete": all(f["complete"] for f in read),
            "train_rows": len(train_rows),
            "heldout_rows": len(heldout_rows),
            "folders": read,
        },
        "steps": cfg.steps,
        "parameters": sum(p.numel() for p in model.parameters()),
        "embedding_init": "target principal axes" if axes is not None else "random",
        "heldout_loss": loss,
        "heldout_top1": top1,  # how often the draft picks the target's token: a proxy for acceptance
        "build_seconds": None,
        "device": torch.device(device).type,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "specheads": __version__,
    }
    return save_draft(model, tokenizer, target_dir, out, meta, started)


# -- cache ----------------------------------------------------------------------------------------


def read_meta(path: Path) -> dict | None:
    """The build record of a finished draft at `path`, or None if there is none."""
    return read_build_meta(path, META_FILE, ("config.json", "model.safetensors", "tokenizer_config.json"))


def default_output_dir(key: str) -> Path:
    return default_cache_dir() / "tiny-draft" / key


def ensure_tiny_draft(
    target_dir: Path,
    cfg: TinyDraftConfig | DistilledDraftConfig | None = None,
    out: Path | None = None,
    force: bool = False,
    progress: bool = True,
    data: Path | list[Path] | None = None,
    device: str = "cpu",
    partial_data: bool = False,
) -> tuple[Path, dict, bool]:
    """Build the draft for `target_dir`, or reuse a finished build with the same settings and target.

    Without `data` the draft is trained on the tiny target's corpus (TinyDraftConfig); with `data`, one
    `specheads distill` folder of the target's answers or several (the shards of one distillation, or
    greedy and sampled answers), it is distilled from them in that order (DistilledDraftConfig), and the
    key names the data too; `device` is where that one trains; `partial_data` accepts unfinished folders
    and reads their finished chunks. Returns (directory, build record,
    reused). An explicit `out` holding anything else is never overwritten without `force`.
    """
    if cfg is None:
        cfg = TinyDraftConfig() if data is None else DistilledDraftConfig()
    if isinstance(cfg, DistilledDraftConfig) != (data is not None):
        raise ValueError(f"{type(cfg).__name__} is for a draft {'without' if data is None else 'with'} data")
    tokenizer, _ = load_target_side(target_dir)
    identity = target_identity(Path(target_dir).expanduser(), tokenizer)
    if data is not None:
        given = [Path(d).expanduser() for d in ([data] if isinstance(data, (str, Path)) else data)]
        if not given:
            raise ValueError("--data: no folder given")
        if len({d.resolve() for d in given}) < len(given):
            raise ValueError(f"--data {' '.join(map(str, given))}: a folder is named twice")
        # before any key, folder or training: each folder checked
        settings = {d: check_distill_data(d, tokenizer, partial_data) for d in given}
        # the parts read, listed once: a distillation still running may finish another one meanwhile
        folders = {d: finished_parts(d) for d in given}
        identity["data"] = data_fingerprint(folders)
    key = draft_key(cfg, identity)
    out = Path(out).expanduser() if out is not None else default_output_dir(key)
    meta = read_meta(out)
    if meta is not None and meta.get("key") == key and not force:
        return out, meta, True
    if out.exists() and any(out.iterdir()) and not force:
        what = "a draft built with other settings or for another target" if meta else "not a tiny draft"
        raise FileExistsError(f"{out} holds {what}; refusing to overwrite it (pass --force)")
    if data is not None:
        built = build_distilled(
            target_dir, folders, cfg, out, identity, settings, progress=progress, device=device
        )
        return out, built, False
    return out, build(target_dir, cfg, out, progress=progress), False
