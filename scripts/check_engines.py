"""AUDIT, not a load: our `eagle3`, `eagle` and `vllm-medusa` exports against the pinned engines' source.

vLLM 0.33.0 and SGLang 0.5.23 ship CUDA wheels whose model classes need the engines' distributed state and
custom ops to be built, so neither can load a checkpoint on this CPU machine. This script reads their
loading code instead, straight from the wheels (`pip download --no-deps`, cached under the specheads cache),
and checks an export of tiny random heads against it:

  * registered: the architecture name our config.json gives resolves in the engine's registry;
  * rules: each convention our export relies on, as a snippet that must still be in the pinned file (a
    changed engine fails the audit instead of passing silently), with what it means for our files and
    whether our export complies;
  * config_reads: every config attribute the model file reads (getattr / hasattr / config.X), with the
    value our export writes, or "absent" (the engine's default applies);
  * weights: each tensor we write, renamed as the engine's load_weights renames it, and whether the
    module names it lands on exist in the engine's model code.

The formats the suite loads with a consumer's own code (speculators, eagle via eagle-llm, medusa via
medusa-llm) are in tests/consumers/; this is the rest.

    python scripts/check_engines.py --out engine_audit.json
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import torch
from safetensors.torch import load_file

from specheads.heads import (
    Eagle3Config,
    Eagle3Head,
    EagleConfig,
    EagleHead,
    FrozenTarget,
    MedusaConfig,
    MedusaHeads,
    layer_config_from,
    save_heads,
)
from specheads.heads.formats import export_heads
from specheads.train.builders.tiny_target import default_cache_dir

ENGINES = {"vllm": "0.33.0", "sglang": "0.5.23"}
VLLM_MODELS, SGLANG_MODELS = "vllm/model_executor/models/", "sglang/srt/models/"

# (format, engine, model file, architecture our config names, rules: (file, snippet, what it means))
AUDITS = [
    (
        "eagle3",
        "vllm",
        VLLM_MODELS + "llama_eagle3.py",
        "LlamaForCausalLMEagle3",
        [
            (
                VLLM_MODELS + "llama_eagle3.py",
                '{"midlayer.": "layers.0."}',
                "midlayer.* is read as layers.0.*",
            ),
            (
                VLLM_MODELS + "llama_eagle3.py",
                '"d2t", "draft_id_to_target_id"',
                "d2t: draft -> target offsets",
            ),
            (VLLM_MODELS + "llama_eagle3.py", 'if "t2d" in name:', "t2d is skipped"),
            (
                VLLM_MODELS + "llama_eagle3.py",
                '"target_hidden_size", self.config.hidden_size',
                "no target_hidden_size: fc reads 3 x hidden_size",
            ),
            (
                "vllm/v1/worker/gpu_model_runner.py",
                'layer_ids = getattr(hf_config, "eagle_aux_hidden_state_layer_ids", None)',
                "top-level eagle_aux_hidden_state_layer_ids, HF ids as written (ours)",
            ),
            (
                VLLM_MODELS + "llama_eagle3.py",
                'getattr(config, "norm_before_residual", False)',
                "norm_before_residual false (written): residual is the raw fc output",
            ),
            (
                VLLM_MODELS + "llama_eagle3.py",
                'getattr(self.config, "norm_output", False)',
                "no norm_output: the fed-back feature is the layer output before the final norm (ours)",
            ),
        ],
    ),
    (
        "eagle3",
        "sglang",
        SGLANG_MODELS + "llama_eagle3.py",
        "LlamaForCausalLMEagle3",
        [
            (SGLANG_MODELS + "llama_eagle3.py", '"midlayer": "layers.0"', "midlayer.* is read as layers.0.*"),
            (SGLANG_MODELS + "llama_eagle3.py", 'if "d2t" in name:', "d2t becomes hot_token_id"),
            (SGLANG_MODELS + "llama_eagle3.py", 'if "t2d" in name:', "t2d is skipped"),
            (
                SGLANG_MODELS + "llama_eagle3.py",
                'if hasattr(config, "target_hidden_size"):',
                "no target_hidden_size: fc reads 3 x hidden_size",
            ),
            (
                SGLANG_MODELS + "llama.py",
                "self.model.layers_to_capture = [val + 1 for val in layer_ids]",
                "eagle_config ids + 1 are captured: ours are written as HF id - 1",
            ),
            (
                SGLANG_MODELS + "llama_eagle3.py",
                'bias=getattr(config, "bias", False)',
                "no `bias` key: fc without bias (ours has none)",
            ),
            (
                SGLANG_MODELS + "llama_eagle3.py",
                'getattr(config, "norm_output", False)',
                "no norm_output: the fed-back feature is the layer output before the final norm (ours)",
            ),
        ],
    ),
    (
        "eagle",
        "vllm",
        VLLM_MODELS + "llama_eagle.py",
        "LlamaForCausalLM",  # vLLM's EAGLEConfig renames it EagleLlamaForCausalLM
        [
            (
                "vllm/transformers_utils/configs/eagle.py",
                'f"Eagle{arch}" if not arch.startswith("Eagle") else arch',
                "each architecture A is read as EagleA (LlamaForCausalLM -> EagleLlamaForCausalLM)",
            ),
            (
                VLLM_MODELS + "llama_eagle.py",
                "bias=False",
                "fc has no bias: a nonzero fc.bias would be dropped (the export refuses it)",
            ),
        ],
    ),
    (
        "eagle",
        "sglang",
        SGLANG_MODELS + "llama_eagle.py",
        "LlamaForCausalLMEagle",
        [
            (
                SGLANG_MODELS + "llama_eagle.py",
                "EntryClass = [LlamaForCausalLMEagle]",
                "SGLang's EAGLE-1 class",
            )
        ],
    ),
    ("vllm-medusa", "vllm", VLLM_MODELS + "medusa.py", "MedusaModel", []),
]


def wheels(cache: Path) -> dict[str, zipfile.ZipFile]:
    """engine -> its pinned wheel, downloaded once (no dependencies) into `cache`."""
    cache.mkdir(parents=True, exist_ok=True)
    out = {}
    for engine, version in ENGINES.items():
        found = sorted(cache.glob(f"{engine}-{version}-*.whl"))
        if not found:
            cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"{engine}=={version}", "-d"]
            subprocess.run([*cmd, str(cache)], check=True)
            found = sorted(cache.glob(f"{engine}-{version}-*.whl"))
        out[engine] = zipfile.ZipFile(found[0])
    return out


def source(wheel: zipfile.ZipFile, name: str) -> str | None:
    try:
        return wheel.read(name).decode()
    except KeyError:
        return None


def tiny_exports(root: Path) -> dict[str, Path]:
    """eagle3, eagle (no fc bias) and vllm-medusa exports of random heads of a tiny Llama."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model(
        "llama",
        vocab_size=300,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    target = FrozenTarget(AutoModelForCausalLM.from_config(config), name_or_path="org/tiny-llama")
    layer_config = layer_config_from(target.config)
    heads = {
        "eagle3": Eagle3Head(Eagle3Config(layer_config, draft_vocab_size=100)),
        "eagle": EagleHead(EagleConfig(layer_config, fc_bias=False)),
        "vllm-medusa": MedusaHeads(MedusaConfig(64, 300, num_heads=2, num_layers=1)),
    }
    out = {}
    for fmt, head in heads.items():
        save_heads(head, root / f"native-{fmt}", target.record())
        export_heads(root / f"native-{fmt}", fmt, root / fmt)
        out[fmt] = root / fmt
    return out


def config_reads(text: str) -> list[str]:
    found = re.findall(r"(?:getattr|hasattr)\(\s*(?:self\.)?config,\s*\"(\w+)\"", text)
    found += re.findall(r"\bconfig\.(\w+)", text)
    return sorted(set(found) - {"get"})


FUSED = {
    "q_proj": "qkv_proj",
    "k_proj": "qkv_proj",
    "v_proj": "qkv_proj",
    "gate_proj": "gate_up_proj",
    "up_proj": "gate_up_proj",
}


def renamed(name: str) -> str:
    """Our tensor name as both engines' load_weights rename it: midlayer -> layers.0, q/k/v and gate/up
    stacked into the fused projections (their `stacked_params_mapping`)."""
    parts = name.replace("midlayer.", "layers.0.").split(".")
    return ".".join(FUSED.get(p, p) for p in parts)


def audit(fmt, engine, model_file, architecture, rules, wheel, export: Path) -> dict:
    text = source(wheel, model_file)
    record = {
        "kind": "audit: the engine's source was read, nothing was loaded or run",
        "format": fmt,
        "engine": f"{engine} {ENGINES[engine]}",
        "model_file": model_file,
    }
    if text is None:
        registry = source(wheel, VLLM_MODELS + "registry.py") or ""
        methods = source(wheel, "vllm/config/speculative.py") or ""
        in_registry, method_known = f'"{architecture}"' in registry, '"medusa"' in methods
        record.update(
            ok=False,
            registered={"architectures": [architecture], "resolved": [architecture] if in_registry else []},
            speculative_method_known=method_known,
            verdict=f"{model_file} is not in {engine} {ENGINES[engine]} (registry names {architecture!r}: "
            f"{in_registry}; SpeculativeMethod has 'medusa': {method_known}): this version cannot load it",
        )
        return record
    registry = source(wheel, VLLM_MODELS + "registry.py") if engine == "vllm" else text
    written = json.loads((export / "config.json").read_text())
    if fmt == "eagle":  # vLLM reads architectures through EAGLEConfig's renaming
        names = [f"Eagle{a}" if not a.startswith("Eagle") else a for a in written["architectures"]]
        names = names if engine == "vllm" else written["architectures"]
    else:
        names = written["architectures"]
    registered = [n for n in names if f'"{n}"' in registry or f"EntryClass = [{n}]" in registry]
    checked = []
    for file, snippet, means in rules:
        body = source(wheel, file) or ""
        line = next((i + 1 for i, ln in enumerate(body.splitlines()) if snippet in ln), None)
        checked.append(
            {"file": file, "snippet": snippet, "found": line is not None, "line": line, "means": means}
        )
    tensors = sorted(load_file(str(export / next(p.name for p in export.glob("*.safetensors")))))
    unknown = [n for n in tensors if not all(part in text or part.isdigit() for part in _modules(renamed(n)))]
    reads = config_reads(text)
    record.update(
        registered={"architectures": names, "resolved": registered},
        rules=checked,
        config_reads={k: written.get(k, "absent") for k in reads},
        weights={"written": tensors, "module_names_not_in_model_file": unknown},
    )
    record["ok"] = bool(registered) and all(r["found"] for r in checked) and not unknown
    return record


def _modules(name: str) -> list[str]:
    # names inside the engines' own LlamaDecoderLayer (llama.py), which the draft layer reuses
    layer_parts = {
        "self_attn",
        "mlp",
        "layers",
        "weight",
        "bias",
        "o_proj",
        "down_proj",
        "qkv_proj",
        "gate_up_proj",
    }
    layer_parts |= {"post_attention_layernorm"}
    return [p for p in name.split(".") if p not in layer_parts]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("engine_audit.json"))
    p.add_argument("--wheels", type=Path, default=default_cache_dir() / "engine-wheels")
    args = p.parse_args(argv)
    engine_wheels = wheels(args.wheels)
    with tempfile.TemporaryDirectory() as tmp:
        exports = tiny_exports(Path(tmp))
        results = [
            audit(fmt, engine, model_file, arch, rules, engine_wheels[engine], exports[fmt])
            for fmt, engine, model_file, arch, rules in AUDITS
        ]
    args.out.write_text(json.dumps({"versions": ENGINES, "audits": results}, indent=2) + "\n")
    for r in results:
        print(f"{r['format']:12s} {r['engine']:14s} {'ok' if r['ok'] else 'FAILS'}  {r.get('verdict', '')}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
