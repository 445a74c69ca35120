"""OfflineTarget: the three pieces of a target that heads use beside its hidden states.

Offline training reads the target's hidden states from the cache (train/hidden_cache.py); what heads
still take from the target itself is its token embedding (EAGLE's input), its final norm, and its
lm_head (logits = lm_head(h_L), Medusa's shared head, EAGLE's token loss). OfflineTarget loads just
those tensors from the checkpoint's safetensors by key; the decoder layers are never read.

Which keys and which module classes: the model is built on the `meta` device (structure only, no
memory), FrozenTarget's own rules find its embedding, final norm and lm_head there, and only those
three modules are materialised from the checkpoint. The skeleton is then dropped. So a family whose
norm is not a plain RMSNorm (Gemma's 1 + w) or whose embedding scales its output keeps its own code.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

import torch
from huggingface_hub import hf_hub_download
from huggingface_hub.errors import EntryNotFoundError
from safetensors import safe_open
from torch import nn

from specheads.core.confined import confined
from specheads.core.fingerprint import files_sha256, weights_files
from specheads.core.target import FrozenTarget, TargetOutput, resolve_dtype, target_config

SINGLE_FILE = "model.safetensors"
SHARDED_INDEX = "model.safetensors.index.json"


def _checkpoint_file(name_or_path: str, filename: str) -> Path | None:
    """A file of a local directory or a hub repository (downloaded alone); None when it has none."""
    local = Path(os.path.expanduser(name_or_path))
    if local.is_dir():
        return local / filename if (local / filename).is_file() else None

    try:
        return Path(hf_hub_download(name_or_path, filename))
    except EntryNotFoundError:
        return None


def _weight_map(name_or_path: str) -> dict[str, str]:
    """checkpoint key -> the safetensors file holding it."""
    index = _checkpoint_file(name_or_path, SHARDED_INDEX)
    if index is not None:
        return json.loads(index.read_text())["weight_map"]
    single = _checkpoint_file(name_or_path, SINGLE_FILE)
    if single is None:
        raise FileNotFoundError(
            f"target {name_or_path!r} has no {SINGLE_FILE} or {SHARDED_INDEX}: "
            "OfflineTarget reads safetensors only"
        )
    with safe_open(str(single), framework="pt") as f:
        return {key: SINGLE_FILE for key in f.keys()}


def _find_key(key: str, weight_map: dict[str, str]) -> str | None:
    """`key`, or the one checkpoint key that ends with it minus leading components (a wrapped model)."""
    if key in weight_map:
        return key
    parts = key.split(".")
    for drop in range(1, len(parts) - 1):
        suffix = "." + ".".join(parts[drop:])
        found = [k for k in weight_map if k.endswith(suffix)]
        if len(found) == 1:
            return found[0]
    return None


def _read_module(module: nn.Module, prefix: str, weight_map: dict[str, str], open_file) -> list[str] | None:
    """Load `module`'s tensors from the checkpoint keys `prefix.*`; the keys read, None if one is absent."""
    state, keys = {}, []
    for name in module.state_dict():
        key = _find_key(f"{prefix}.{name}", weight_map)
        if key is None:
            return None
        state[name] = open_file(weight_map[key]).get_tensor(key)
        keys.append(key)
    module.load_state_dict(state, strict=True, assign=True)
    return keys


class OfflineTarget:
    """A target's embedding, final norm and lm_head, with FrozenTarget's attributes; no decoder layers.

    `forward(batch)` returns the TargetOutput the online target would: the cached layers the batch
    carries (`hidden.{layer}`, from collate_cached) cast to the target's dtype, and, when asked,
    logits = lm_head(h_L) computed here.
    """

    def __init__(
        self,
        config,
        embed_tokens: nn.Module,
        norm: nn.Module,
        lm_head: nn.Module,
        num_layers: int,
        tokenizer=None,
        name_or_path: str = "",
        loaded_keys: tuple[str, ...] = (),
    ):
        self.config = config
        # All it holds, as FrozenTarget's `model` is all that one holds (parameter counts, `.to`).
        self.model = nn.ModuleDict({"embed_tokens": embed_tokens, "norm": norm, "lm_head": lm_head})
        self.num_layers = num_layers
        self.tokenizer = tokenizer
        self.name_or_path = name_or_path or getattr(config, "_name_or_path", "")
        self.loaded_keys = loaded_keys  # the checkpoint keys read, and nothing else
        self.weights_files: list[Path] = []  # the target's safetensors, when read from a local directory

    # The parts of FrozenTarget that only read config, num_layers, lm_head and tokenizer.
    hidden_size = FrozenTarget.hidden_size
    vocab_size = FrozenTarget.vocab_size
    device = FrozenTarget.device
    dtype = FrozenTarget.dtype
    layer_id = FrozenTarget.layer_id
    record = FrozenTarget.record

    def weights_sha256(self) -> str | None:
        """The sha256 of the safetensors files it read from (the whole target's, as FrozenTarget's record
        holds it); None when they are not local (it holds too few weights to hash them in memory)."""
        return files_sha256(self.weights_files) if self.weights_files else None

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str,
        *,
        dtype: str | torch.dtype | None = "auto",
        device: str | torch.device | None = None,
        load_tokenizer: bool = True,
        trust_remote_code: bool = False,
    ) -> OfflineTarget:
        """Read the embedding, final norm and lm_head of a local HF directory or hub model.

        Args:
            dtype: "auto" (the checkpoint's) or a dtype name / torch dtype, as FrozenTarget takes it.
            device: where the three modules go (default CPU).
        """
        from transformers import (  # lazy: transformers adds seconds to every command's start
            AutoConfig,
            AutoModelForCausalLM,
            AutoTokenizer,
        )

        config = target_config(AutoConfig, name_or_path, name_or_path, trust_remote_code)
        from accelerate import init_empty_weights  # lazy: as above

        # Structure only: no weights are allocated. Buffers are: those not saved in a checkpoint are computed
        # from the config as the model is built (Gemma's embedding scale, sqrt(hidden_size)).
        with init_empty_weights(include_buffers=False):
            skeleton = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
        frame = FrozenTarget(skeleton)  # its rules find the embedding, final norm and lm_head
        names = {module: name for name, module in skeleton.named_modules()}
        parts = {"embed_tokens": frame.embed_tokens, "norm": frame.norm, "lm_head": frame.lm_head}
        weight_map = _weight_map(name_or_path)
        handles: dict[str, object] = {}

        def open_file(file: str):
            if file not in handles:
                confined(
                    name_or_path,
                    file,
                    Path(name_or_path) / SHARDED_INDEX,
                    '"weight_map" entry',
                    follow_links=False,
                )
                handles[file] = safe_open(str(_checkpoint_file(name_or_path, file)), framework="pt")
            return handles[file]

        loaded = []
        for part_name, module in parts.items():
            keys = _read_module(module, names[module], weight_map, open_file)
            if keys is not None:
                loaded += keys
            elif part_name == "lm_head" and getattr(config, "tie_word_embeddings", False):
                parts["lm_head"].weight = parts["embed_tokens"].weight  # tied: no tensor of its own
            else:
                raise KeyError(f"target {name_or_path!r}: no {names[module]}.* tensors in its safetensors")
        torch_dtype = resolve_dtype(dtype)
        for module in parts.values():
            if any(t.is_meta for t in [*module.parameters(), *module.buffers()]):
                raise TypeError(
                    f"target {name_or_path!r}: {type(module).__name__} has tensors not in the checkpoint"
                )
            if isinstance(torch_dtype, torch.dtype):
                module.to(torch_dtype)
            module.to(device or "cpu").requires_grad_(False).eval()
        num_layers = frame.num_layers
        tokenizer = (
            AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
            if load_tokenizer
            else None
        )
        target = cls(
            config,
            parts["embed_tokens"],
            parts["norm"],
            parts["lm_head"],
            num_layers=num_layers,
            tokenizer=tokenizer,
            name_or_path=name_or_path,
            loaded_keys=tuple(loaded),
        )
        local = os.path.expanduser(str(name_or_path))
        target.weights_files = weights_files(local) if os.path.isdir(local) else []
        return target

    @property
    def embed_tokens(self) -> nn.Module:
        return self.model["embed_tokens"]

    @property
    def norm(self) -> nn.Module:
        return self.model["norm"]

    @property
    def lm_head(self) -> nn.Module:
        return self.model["lm_head"]

    def to(self, device: str | torch.device) -> OfflineTarget:
        self.model.to(device)
        return self

    def freeze(self) -> OfflineTarget:
        self.model.requires_grad_(False).eval()
        return self

    def forward(self, batch: dict, *, capture: Iterable[int] = (), logits: bool = True) -> TargetOutput:
        """The online TargetOutput for a cached batch (collate_cached): captured layers and logits."""
        layers = [self.layer_id(i) for i in capture]
        needed = sorted({*layers, *([self.num_layers] if logits else [])})
        missing = [i for i in needed if f"hidden.{i}" not in batch]
        if missing:
            have = sorted(int(k.split(".", 1)[1]) for k in batch if k.startswith("hidden."))
            raise KeyError(
                f"the batch carries cached layers {have}, training needs {missing}; rebuild the cache "
                "for this method (hidden_cache.cache_layers)"
            )
        hidden = {i: batch[f"hidden.{i}"].to(self.device, self.dtype) for i in needed}
        out_logits = self.lm_head(hidden[self.num_layers]) if logits else None  # (B, T, V)
        return TargetOutput(logits=out_logits, hidden={i: hidden[i] for i in layers})

    __call__ = forward


def target_output(target, batch: dict, *, capture: Iterable[int], logits: bool) -> TargetOutput:
    """The target's TargetOutput for a batch: the online target runs, the offline one reads the cache."""
    if isinstance(target, OfflineTarget):
        return target(batch, capture=capture, logits=logits)
    return target(
        batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=batch["position_ids"],
        capture=capture,
        logits=logits,
    )
