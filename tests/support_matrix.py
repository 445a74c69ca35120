"""The support matrix: model family x method, each mark a test of tests/test_support_matrix.py on a tiny random
model of that family, built offline from its config (nothing is downloaded).

This table is what the tests parametrize over and what docs/support-matrix.md is written from:

    python -m tests.support_matrix > docs/support-matrix.md

(`test_the_doc_is_the_table` fails when the two differ.) It imports nothing heavier than the standard library
(and scripts/families.py, which imports no more), so the doc is written without torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scripts.families import MIXED_LAYERS, TINY

MODULE = "tests/test_support_matrix.py"
WINDOW = 8  # the sliding window of the families that slide: prompts and generations run past it

# The families' shared tiny sizes (scripts/families.py: 4 layers, 4 heads, 2 KV heads, a byte-level vocabulary)
# at half their width: 32 wide, heads of 8.
COMMON = {**TINY, "hidden_size": 32, "intermediate_size": 64, "head_dim": 8, "max_position_embeddings": 256}
MIXED = list(MIXED_LAYERS)
EXPERTS = dict(num_experts_per_tok=2)


@dataclass(frozen=True)
class Family:
    """One row: a transformers `model_type` with the overrides that make the family's tiny config (its
    defining traits kept: experts, sliding windows, fused projections, tied embeddings), the attention
    implementation `attn_implementation: auto` must pick for it, and what the row exercises."""

    model_type: str
    overrides: dict = field(default_factory=dict)
    attention: str = "sdpa"
    traits: str = ""
    moe: bool = False


FAMILIES: dict[str, Family] = {
    "llama": Family("llama", traits="the reference"),
    "mistral": Family("mistral", dict(sliding_window=WINDOW), traits=f"every layer slides (window {WINDOW})"),
    "qwen2": Family("qwen2", traits="q/k/v biases"),
    "qwen3": Family("qwen3", traits="q/k norms"),
    "qwen3_moe": Family(
        "qwen3_moe",
        dict(num_experts=4, moe_intermediate_size=16, **EXPERTS),
        traits="4 experts, 2 a token",
        moe=True,
    ),
    "mixtral": Family(
        "mixtral", dict(num_local_experts=4, **EXPERTS), traits="4 experts, 2 a token; rope θ 1e6", moe=True
    ),
    "gemma2": Family(
        "gemma2",
        dict(sliding_window=WINDOW, layer_types=MIXED),
        attention="eager",
        traits=f"sliding (window {WINDOW}) and full layers; soft-capped scores (transformers refuses sdpa)",
    ),
    "gemma3_text": Family(
        "gemma3_text",
        dict(sliding_window=WINDOW, layer_types=MIXED),
        traits=f"sliding (window {WINDOW}) and full layers; scaled embeddings; rope θ 1e6",
    ),
    "phi3": Family("phi3", traits="fused qkv and gate/up projections"),
    "smollm2": Family(
        "llama",
        dict(
            num_attention_heads=6,
            num_key_value_heads=2,
            hidden_size=48,
            rope_theta=1e5,
            tie_word_embeddings=True,
        ),
        traits="SmolLM2's shape: a Llama with tied embeddings, 3 query heads a KV head, rope θ 1e5",
    ),
    "gpt_oss": Family(
        "gpt_oss",
        dict(sliding_window=WINDOW, layer_types=MIXED, num_local_experts=4, **EXPERTS),
        attention="eager",
        traits=f"4 experts, attention sinks (transformers refuses sdpa), sliding (window {WINDOW}) and full "
        "layers, YaRN rope",
        moe=True,
    ),
}

# method -> its export formats (the method table's `export_formats`; a test checks they agree)
METHODS: dict[str, tuple[str, ...]] = {
    "medusa": ("medusa", "vllm-medusa"),
    "eagle": ("eagle",),
    "eagle3": ("eagle3", "speculators"),
}
METHOD_TITLES = {"medusa": "Medusa-1", "eagle": "EAGLE-1/2", "eagle3": "EAGLE-3"}

# format -> (consumer, the slow test that loads it in the consumer's own code, or why nothing does)
CONSUMERS = {
    "medusa": ("medusa-llm 0.1 `MedusaModel`", "test_the_consumer_loads_the_export"),
    "vllm-medusa": ("vLLM", None),
    "eagle": ("eagle-llm 1.2.1 `cnets.Model`", "test_the_consumer_loads_the_export"),
    "eagle3": ("speculators 0.9.0 `Eagle3Converter`", "test_the_consumer_loads_the_export"),
    "speculators": ("speculators 0.9.0 `Eagle3DraftModel`", "test_the_consumer_loads_the_export"),
}
# Cells no test of this project can fill: (format, family or "*") -> (the reason in short, in full)
THETA = (
    "eagle-llm's `cnets.Model` builds its rotary embedding with base 10000 whatever config.json says: it would "
    "load this export and draft with other rotations"
)
OUTSIDE = {
    ("vllm-medusa", "*"): (
        "vLLM 0.33.0 has no Medusa class",
        "vLLM 0.33.0 ships no `MedusaModel` (`vllm/model_executor/models/medusa.py` is absent from its wheel); "
        "the format is written for the vLLM releases that had one",
    ),
    ("eagle", "mixtral"): ("eagle-llm rotates with θ 10000; this target's is 1e6", THETA),
    ("eagle", "gemma3_text"): ("eagle-llm rotates with θ 10000; this target's is 1e6", THETA),
    ("eagle", "smollm2"): ("eagle-llm rotates with θ 10000; this target's is 1e5", THETA),
    ("eagle", "gpt_oss"): ("eagle-llm rotates with plain θ 10000; this target's rope is YaRN", THETA),
}
# the formats scripts/check_engines.py --load loads with each engine's own classes, in CI's engines stage,
# for every family of scripts/families.py (a test checks it names the families of this table)
ENGINE_FORMATS = ("eagle", "eagle3")
ENGINE_LOADS = "✓ vLLM (eagle, eagle3, speculators), SGLang (eagle, eagle3): CI engines stage"

# The columns every method has, each a test function of MODULE parametrized [family-method]
COLUMNS = {
    "trains online": "test_trains_online",
    "trains offline": "test_trains_offline",
    "greedy = generate()": "test_greedy_is_generate",
    "sampling χ²": "test_sampling_follows_the_target",
}
SLOW = {"test_sampling_follows_the_target", "test_the_consumer_loads_the_export"}


def outside(key: str, family: str) -> tuple[str, str] | None:
    return OUTSIDE.get((key, family)) or OUTSIDE.get((key, "*"))


def consumer_cases() -> list[tuple[str, str]]:
    """(family, format) the slow consumer test loads: every export whose consumer this project runs."""
    return [
        (family, fmt)
        for family in FAMILIES
        for formats in METHODS.values()
        for fmt in formats
        if CONSUMERS[fmt][1] is not None and outside(fmt, family) is None
    ]


def test_id(function: str, *params: str) -> str:
    return f"{MODULE}::{function}[{'-'.join(params)}]"


def cell(function: str, *params: str) -> str:
    slow = " (slow)" if function in SLOW else ""
    return f"✓ `{function}[{'-'.join(params)}]`{slow}"


def markdown() -> str:
    """docs/support-matrix.md."""
    lines = [
        "# Support matrix",
        "",
        "<!-- Written by `python -m tests.support_matrix > docs/support-matrix.md`; "
        "tests/test_support_matrix.py checks it is current. -->",
        "",
        "Which model families each method trains, decodes and exports, and which consumer loads each export.",
        f"Every ✓ names the test of [`{MODULE}`](../{MODULE}) that makes it, run on a tiny random model of",
        "the family built offline from its config (4 layers of 32 or 48, a 264-token byte vocabulary; the",
        "family's traits kept). Cells marked (slow) run with `python -m pytest -m slow`; the rest in the default",
        "run. A cell without ✓ names a reason outside this project.",
        "",
        "What each column checks:",
        "",
        "- **trains online**: a few steps of `specheads train` from the family's HF directory with the recipe",
        "  of `recipes/tiny/`; the loss falls, the target stays frozen (every parameter and buffer, the",
        "  mixture-of-experts routers included, unchanged; nothing requires a gradient), EAGLE heads get a",
        "  Llama draft layer (`draft_arch: llama`, the default).",
        "- **trains offline**: `specheads cache`, then `specheads train` with `mode: offline` on that cache;",
        "  its first step's losses equal the online run's.",
        "- **greedy = generate()**: the trained heads decode token for token as the target's own `generate()`,",
        f"  prompts and generations past the sliding window ({WINDOW}) where the family has one, with the",
        "  trained drafts and with drafts that hold whole correct paths (accepted past the window).",
        "- **sampling χ²**: the joint law of the first three sampled tokens (6000 draws; temperature 0.8,",
        "  top-k 6, top-p 0.8) passes a chi-square test (p > 0.001) against the target's exact law, on a",
        "  16-token variant of the family's config (window 4 where it slides), drafted tokens accepted in over",
        "  10% of steps. The EAGLE heads are random Llama draft layers drafting a static tree whose first level",
        "  holds every token.",
        "- **export**: `specheads export` to each format the method has, then `specheads import-heads`",
        "  gives back the trained heads bit for bit; the consumer named in the column header loads it with its",
        "  own code and computes what our heads compute (tests/consumers/ has the Llama checks and the",
        "  deliberately broken exports the check must refuse).",
        "- **vLLM / SGLang**: the engines' own `load_weights` on each family's `eagle`, `eagle3` and",
        "  `speculators` exports (SGLang reads no speculators config): every parameter filled and equal to",
        "  the export's, every key landing, d2t the draft-to-target map; a copy with a key renamed must fail.",
        "  `python scripts/check_engines.py --load --families all`, the last stage of `.ci/run` (CUDA wheels:",
        "  run on CPU by building the model classes and calling their loader; see its docstring).",
        "",
        "Families:",
        "",
        "| family | `model_type` | attention (`attn_implementation: auto`) | what the tiny config keeps |",
        "| --- | --- | --- | --- |",
    ]
    for name, fam in FAMILIES.items():
        lines.append(f"| {name} | `{fam.model_type}` | {fam.attention} | {fam.traits} |")
    lines += [
        "",
        "`smollm2` is the tiny config of SmolLM2's shape; the real SmolLM2-135M (the `smollm2` named target) is a",
        "`LlamaForCausalLM`, built from its GGUF wheel by `builders/smollm2.py` and checked in",
        "`tests/train/test_smollm2.py`.",
    ]
    reasons: list[str] = []
    for method, formats in METHODS.items():
        headers = ["family", *COLUMNS]
        for fmt in formats:
            headers += [f"`{fmt}` export, import back", f"`{fmt}` → {CONSUMERS[fmt][0]}"]
        if any(fmt in ENGINE_FORMATS for fmt in formats):
            headers.append("vLLM / SGLang `load_weights`")
        lines += ["", f"## {METHOD_TITLES[method]} (`{method}`)", ""]
        lines.append("| " + " | ".join(headers) + " |")
        lines.append("|" + " --- |" * len(headers))
        for family in FAMILIES:
            row = [family, *(cell(function, family, method) for function in COLUMNS.values())]
            for fmt in formats:
                row.append(cell("test_exports_import_back", family, fmt))
                reason = outside(fmt, family)
                if reason is None:
                    row.append(cell(CONSUMERS[fmt][1], family, fmt))
                    continue
                if reason[1] not in reasons:
                    reasons.append(reason[1])
                row.append(f"{reason[0]} ({reasons.index(reason[1]) + 1})")
            if any(fmt in ENGINE_FORMATS for fmt in formats):
                row.append(ENGINE_LOADS)
            lines.append("| " + " | ".join(row) + " |")
    lines += ["", "## Cells without ✓", ""]
    lines += [f"{i}. {reason}." for i, reason in enumerate(reasons, 1)]
    lines += [
        "",
        "Real checkpoints of a family can differ from its tiny config in ways a consumer cares about: eagle-llm",
        "rotates with θ 10000 whatever the config says, so an `eagle` export of a target with another θ",
        "(Llama-3's 5e5, Qwen3's 1e6) loads there but drafts with other positions; vLLM and SGLang read the θ",
        "the export writes (the target's).",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown(), end="")
