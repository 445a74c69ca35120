"""AUDIT of our `eagle3`, `eagle` and `vllm-medusa` exports against the pinned engines' source; with --load, a LOAD.

vLLM 0.33.0 and SGLang 0.5.23 ship CUDA wheels: neither engine can start on this CPU machine. This script
reads their loading code, straight from the wheels (`pip download --no-deps`, cached under the specheads cache),
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

`--load` also LOADS the `eagle3` and `eagle` exports with each engine's own model class (scripts/engine_load_run.py, in
a directory holding the engine's wheel and the pure-Python packages its import chain needs, installed
--no-deps under the specheads cache, ~1 GB for SGLang, whose import needs triton): vLLM's
Eagle3LlamaForCausalLM / EagleLlamaForCausalLM (a VllmConfig with its SpeculativeConfig,
VLLM_TARGET_DEVICE=cpu, a gloo group of world size 1) and SGLang's LlamaForCausalLMEagle3 /
LlamaForCausalLMEagle (its ServerArgs published with device cpu, a gloo group)
are built on CPU, every parameter set to NaN, and the engine's own load_weights called on our files: each
parameter must be filled and equal what our files say (q/k/v, gate/up stacked), each of our keys must
land (an all-zero tensor the engine has no parameter for, our `eagle` fc.bias in vLLM, is listed apart),
and d2t must give the engine's draft-to-target map. The embedding (and EAGLE-1/2's lm_head) is left: both
engines share the target's (vLLM llm_base_proposer.py `_maybe_share_embeddings`, SGLang
eagle_worker_v2.py `set_embed`). A copy with a key renamed must fail. The forward does not run here
(FORWARD_BLOCKED says why for each engine).

    python scripts/check_engines.py --out engine_audit.json [--load]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import torch
from safetensors.torch import load_file

from specheads.builders.tiny_target import default_cache_dir
from specheads.core.target import FrozenTarget
from specheads.heads import (
    Eagle3Config,
    Eagle3Head,
    EagleConfig,
    EagleHead,
    MedusaConfig,
    MedusaHeads,
    layer_config_from,
    save_heads,
)
from specheads.heads.formats import export_heads
from specheads.methods import methods

ENGINES = {"vllm": "0.33.0", "sglang": "0.5.23"}
# what each engine's import chain needs beyond the project's packages, installed --no-deps (found by
# importing llama_eagle3 and building its class until nothing was missing); torchvision is stubbed instead
# (engine_load_run.STUBS: PyPI's wheel is CUDA-built)
ENGINE_DEPS = {
    "vllm": (
        "aiohappyeyeballs==2.7.1 aiohttp==3.14.5 aiosignal==1.4.0 apache-tvm-ffi==0.1.15.post2 cachetools==8.0.2 "
        "cbor2==6.3.0 fastapi==0.165.0 frozenlist==1.8.0 llguidance==1.9.1 msgspec==0.22.0 multidict==7.2.1 "
        "openai==3.57.0 openai-harmony==0.0.8 partial-json-parser==0.2.1.1.post7 prometheus-client==0.26.0 "
        "propcache==0.5.4 pybase64==1.5.1 pyzmq==27.3.0 starlette==1.10.0 uvloop==0.23.0 xgrammar==0.2.8 "
        "yarl==1.25.1"
    ).split(),
    "sglang": (
        "aiohappyeyeballs==2.7.1 aiohttp==3.14.5 aiosignal==1.4.0 apache-tvm-ffi==0.1.15.post2 "
        "compressed-tensors==0.20.0 frozenlist==1.8.0 loguru==0.7.3 msgspec==0.22.0 multidict==7.2.1 "
        "openai==3.57.0 partial-json-parser==0.2.1.1.post7 propcache==0.5.4 pybase64==1.5.1 pyzmq==27.3.0 "
        "sentencepiece==0.2.3 starlette==1.10.0 triton==3.9.0 yarl==1.25.1"
    ).split(),
}
FORWARD_BLOCKED = {
    "vllm": "not run: the forward needs vLLM's attention backend and custom ops, and the CUDA wheel carries "
    "no CPU kernels (its CPU platform logs `Failed to import from vllm._C_AVX2: No module named "
    "'vllm._C_AVX2'`; the CPU build is a separate wheel, not on PyPI); its Attention layer also reads "
    "per-batch metadata from a forward context that only the model runner builds",
    "sglang": "not run: RadixAttention reads the KV pool and attention backend from a ForwardBatch that only "
    "SGLang's ModelRunner builds, and its CPU backend needs SGLANG_USE_CPU_ENGINE=1, whose import chain "
    "needs the compiled `sgl_kernel` (sglang/kernels/ops/kvcache/cache_move.py:10; PyPI's sglang-kernel "
    "0.4.10 is CUDA-only)",
}
# parameters our files leave to the target, which both engines share (module docstring): the embedding,
# and for EAGLE-1/2 the lm_head too
FROM_TARGET = {
    "eagle3": {"model.embed_tokens.weight"},
    "eagle": {"model.embed_tokens.weight", "lm_head.weight"},
}
BREAK = {"eagle3": "midlayer.mlp.up_proj.weight", "eagle": "layers.0.mlp.up_proj.weight"}
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
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(root / "target")  # the engines' configs read a target directory
    target = FrozenTarget(model, name_or_path="org/tiny-llama")
    layer_config = layer_config_from(target.config)
    heads = {
        "eagle3": Eagle3Head(Eagle3Config(layer_config, draft_vocab_size=100)),
        "eagle": EagleHead(EagleConfig(layer_config, fc_bias=False)),
        "vllm-medusa": MedusaHeads(MedusaConfig(64, 300, num_heads=2, num_layers=1)),
    }
    out = {}
    for fmt, head in heads.items():
        save_heads(head, root / f"native-{fmt}", target.record())
        export_heads(root / f"native-{fmt}", fmt, root / fmt, methods=methods())
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


def engine_env(engine: str, wheel: zipfile.ZipFile, cache: Path) -> list[Path]:
    """PYTHONPATH entries for the engine: its wheel unpacked, and ENGINE_DEPS (--no-deps), once each; each
    written into a temporary sibling renamed into place, so a stopped run leaves nothing half-written."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "consumers"))
    from consumer_env import build  # the consumer tests' installer: pip --no-deps --target, then renamed

    site, deps = cache / f"{engine}-{ENGINES[engine]}", cache / f"{engine}-{ENGINES[engine]}-deps"
    if not (site / "UNPACKED").is_file():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=cache, prefix=".unpacking-"))
        wheel.extractall(tmp)
        (tmp / "UNPACKED").write_text("")
        shutil.rmtree(site, ignore_errors=True)
        os.replace(tmp, site)
    if not (deps / "PINS").is_file():
        build(deps, tuple(ENGINE_DEPS[engine]))
    return [deps, site]


def rename_key(export: Path, out: Path, key: str) -> Path:
    """A copy of `export` with `key` renamed (...mlp.up_proj.weight -> ...mlp.up.weight)."""
    from safetensors.torch import save_file

    shutil.copytree(export, out)
    tensors = load_file(str(out / "model.safetensors"))
    tensors[key.replace("up_proj", "up")] = tensors.pop(key)
    save_file(tensors, str(out / "model.safetensors"))
    return out


def load(engine: str, fmt: str, paths: list[Path], export: Path, target: Path, out: Path) -> dict:
    """engine_load_run.py in the engine's directory; its report, judged."""
    runner = Path(__file__).with_name("engine_load_run.py")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, paths)), "OMP_NUM_THREADS": "1"}
    env |= {"VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, str(runner), engine, fmt, str(export), str(target), str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=out.parent)
    if done.returncode != 0:
        return {"ok": False, "error": done.stderr[-3000:]}
    report = json.loads(out.read_text())
    params, shared = report["params"], FROM_TARGET[fmt]
    wrong = [
        n for n, r in params.items() if n not in shared and not (r["filled"] and r["max_abs_diff"] == 0.0)
    ]
    report["params_wrong"] = wrong
    report["left_to_the_target"] = sorted(n for n in shared if n in params and not params[n]["filled"])
    d2t = report["d2t_to_target_ids_equal"] is not False  # None: no d2t (EAGLE-1/2)
    report["ok"] = not wrong and not report["our_keys_not_landed"] and d2t
    return report


def loads(engine_wheels: dict, cache: Path, exports: dict[str, Path], root: Path) -> list[dict]:
    """Each engine's own class for `eagle3` and `eagle`, on our export and on a copy with a key renamed."""
    results = []
    for engine, wheel in engine_wheels.items():
        paths = engine_env(engine, wheel, cache)
        for fmt in ("eagle3", "eagle"):
            broken = rename_key(exports[fmt], root / f"{engine}-{fmt}-key-renamed", BREAK[fmt])
            report = load(engine, fmt, paths, exports[fmt], root / "target", root / f"{engine}-{fmt}.json")
            check = load(engine, fmt, paths, broken, root / "target", root / f"{engine}-{fmt}-broken.json")
            module = VLLM_MODELS if engine == "vllm" else SGLANG_MODELS
            results.append(
                {
                    "kind": "loaded: the engine's own model class built on CPU, its load_weights called on our files",
                    "format": fmt,
                    "engine": f"{engine} {ENGINES[engine]}",
                    "model_file": module + ("llama_eagle3.py" if fmt == "eagle3" else "llama_eagle.py"),
                    "ok": report.get("ok", False),
                    "forward": FORWARD_BLOCKED[engine],
                    "broken_on_purpose": {
                        "breakage": f"{BREAK[fmt]} renamed {BREAK[fmt].replace('up_proj', 'up')}",
                        "check_fails": not check.get("ok", False),
                        "not_landed": check.get("our_keys_not_landed"),
                        "params_wrong": check.get("params_wrong"),
                        "engine_error": (check.get("error") or "").strip().splitlines()[-1:],
                    },
                    "report": report,
                }
            )
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("engine_audit.json"))
    p.add_argument("--wheels", type=Path, default=default_cache_dir() / "engine-wheels")
    p.add_argument(
        "--load",
        action="store_true",
        help="also load the eagle3 and eagle exports with the engines' own classes",
    )
    args = p.parse_args(argv)
    engine_wheels = wheels(args.wheels)
    with tempfile.TemporaryDirectory() as tmp:
        exports = tiny_exports(Path(tmp))
        results = [
            audit(fmt, engine, model_file, arch, rules, engine_wheels[engine], exports[fmt])
            for fmt, engine, model_file, arch, rules in AUDITS
        ]
        loaded = loads(engine_wheels, args.wheels / "envs", exports, Path(tmp)) if args.load else []
    out = {"versions": ENGINES, "audits": results, "loads": loaded}
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    for r in results:
        print(f"{r['format']:12s} {r['engine']:14s} {'ok' if r['ok'] else 'FAILS'}  {r.get('verdict', '')}")
    for r in loaded:
        broken = "fails as it must" if r["broken_on_purpose"]["check_fails"] else "PASSES: the check is blind"
        print(
            f"{r['format']:12s} {r['engine']:14s} loaded: {'ok' if r['ok'] else 'FAILS'}; key renamed: {broken}"
        )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
