"""AUDIT of our `eagle3`, `eagle` and `vllm-medusa` exports against the pinned engines' source; with --load, a LOAD.

vLLM 0.33.0 and SGLang 0.5.23 ship CUDA wheels: neither engine can start on this CPU machine. This script
reads their loading code, straight from the wheels (`pip download --no-deps`, cached under the specheads cache),
and checks exports of tiny random heads against it, over the target families of scripts/families.py
(`--families all`, or a comma-separated list; Llama alone by default). The EAGLE heads have a Llama draft
layer (draft_arch: llama, what training writes by default) whatever the target's family.

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

`--load` also LOADS the exports with each engine's own model class (LOADED: vLLM reads `eagle3`,
`speculators` and `eagle`, SGLang `eagle3` and `eagle`), in one process an engine (scripts/engine_load_run.py)
with a directory holding the engine's wheel and the pure-Python packages its import chain needs, installed
--no-deps under the specheads cache (~1 GB for SGLang, whose import needs triton): vLLM's
Eagle3LlamaForCausalLM / EagleLlamaForCausalLM, as its model loader picks them for the draft's config (a
VllmConfig with its SpeculativeConfig, VLLM_TARGET_DEVICE=cpu, a gloo group of world size 1; a
speculators config read into the method and token count as vLLM reads it), and SGLang's
LlamaForCausalLMEagle3 / LlamaForCausalLMEagle (its ServerArgs published with device cpu, a gloo group)
are built on CPU, every parameter set to NaN, and the engine's own load_weights called on our files: each
parameter must be filled and equal what our files say (q/k/v, gate/up stacked), each of our keys must
land (an all-zero tensor the engine has no parameter for, our `eagle` fc.bias in vLLM, is listed apart),
and d2t must give the engine's draft-to-target map. The embedding (and EAGLE-1/2's lm_head) is left
when our files do not hold it: both engines share the target's (vLLM llm_base_proposer.py
`_maybe_share_embeddings`, SGLang eagle_worker_v2.py `set_embed`). A copy of each export with a key
renamed must fail. The forward does not run here (FORWARD_BLOCKED says why for each engine).

It exits 1, naming each, when an audit of a file the engine has no longer holds, a load is not whole, or
a copy broken on purpose passes; a format an engine has no file for (vllm-medusa in vLLM 0.33.0) is
reported, not failed. CI runs it over every family after the tests.

    python scripts/check_engines.py --out engine_audit.json [--load] [--families all]
"""

from __future__ import annotations

import argparse
import hashlib
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
    save_heads,
)
from specheads.heads.eagle import llama_layer_config_from
from specheads.heads.formats import export_heads
from specheads.methods import methods

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from scripts.families import FAMILIES, tiny_model  # noqa: E402

ENGINES = {"vllm": "0.33.0", "sglang": "0.5.23"}
# what each engine's import chain needs beyond the project's packages, installed --no-deps (found by
# importing llama_eagle3 and building its class until nothing was missing); torchvision is stubbed instead
# (engine_load_run.STUBS: PyPI's wheel is CUDA-built)
ENGINE_DEPS = {
    "vllm": (
        "aiohappyeyeballs==2.7.1 aiohttp==3.14.5 aiosignal==1.4.0 apache-tvm-ffi==0.1.15.post2 cachetools==8.0.2 "
        "attrs==26.1.0 cbor2==6.3.0 cloudpickle==3.1.3 fastapi==0.165.0 frozenlist==1.8.0 llguidance==1.9.1 msgspec==0.22.0 multidict==7.2.1 "
        "openai==3.57.0 openai-harmony==0.0.8 partial-json-parser==0.2.1.1.post7 prometheus-client==0.26.0 "
        "propcache==0.5.4 pybase64==1.5.1 pyzmq==27.3.0 starlette==1.10.0 uvloop==0.23.0 xgrammar==0.2.8 "
        "yarl==1.25.1"
    ).split(),
    "sglang": (
        "aiohappyeyeballs==2.7.1 aiohttp==3.14.5 aiosignal==1.4.0 apache-tvm-ffi==0.1.15.post2 attrs==26.1.0 "
        "compressed-tensors==0.20.0 frozenlist==1.8.0 ipython==9.19.1 loguru==0.7.3 msgspec==0.22.0 "
        "multidict==7.2.1 openai==3.57.0 orjson==3.13.0 partial-json-parser==0.2.1.1.post7 propcache==0.5.4 "
        "pybase64==1.5.1 pyzmq==27.3.0 sentencepiece==0.2.3 starlette==1.10.0 traitlets==5.16.1 triton==3.9.0 "
        "yarl==1.25.1"
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
    "speculators": {"model.embed_tokens.weight"},
    "eagle": {"model.embed_tokens.weight", "lm_head.weight"},
}
BREAK = {
    "eagle3": "midlayer.mlp.up_proj.weight",
    "speculators": "layers.0.mlp.up_proj.weight",
    "eagle": "layers.0.mlp.up_proj.weight",
}
# export format -> the heads it holds (tiny_exports)
EXPORTED = {"eagle3": "eagle3", "speculators": "eagle3", "eagle": "eagle", "vllm-medusa": "vllm-medusa"}
# engine -> the formats its own classes load here; a format not named has no reader in that engine:
# SGLang 0.5.23 reads no speculators config (no `speculators_model_type` anywhere in its source: convert
# with `specheads export --format eagle3`), and vLLM 0.33.0 has no medusa.py (AUDITS says so)
LOADED = {"vllm": ("eagle3", "speculators", "eagle"), "sglang": ("eagle3", "eagle")}
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


def tiny_exports(root: Path, family: str = "llama") -> dict[str, Path]:
    """eagle3, eagle (no fc bias), speculators and vllm-medusa exports of random heads over a tiny random
    `family` target (scripts/families.py), the EAGLE heads with a Llama draft layer (draft_arch: llama,
    what training writes by default); the target saved beside them (the engines' configs read it)."""
    torch.manual_seed(0)
    model = tiny_model(family)
    model.save_pretrained(root / "target")
    target = FrozenTarget(model, name_or_path=f"org/tiny-{family}")
    layer_config = llama_layer_config_from(target.config)
    hidden, vocab = target.config.hidden_size, target.config.vocab_size
    heads = {
        "eagle3": Eagle3Head(Eagle3Config(layer_config, draft_arch="llama", draft_vocab_size=100)),
        "eagle": EagleHead(EagleConfig(layer_config, draft_arch="llama", fc_bias=False)),
        "vllm-medusa": MedusaHeads(MedusaConfig(hidden, vocab, num_heads=2, num_layers=1)),
    }
    out = {}
    for kind, head in heads.items():
        save_heads(head, root / f"native-{kind}", target.record())
    for fmt, kind in EXPORTED.items():
        export_heads(root / f"native-{kind}", fmt, root / fmt, methods=methods())
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
    """PYTHONPATH entries for the engine: its wheel unpacked, and ENGINE_DEPS (--no-deps), once each (the
    deps' folder is named by their pins, so a changed list installs anew); each written into a temporary
    sibling renamed into place, so a stopped run leaves nothing half-written."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "consumers"))
    from consumer_env import build  # the consumer tests' installer: pip --no-deps --target, then renamed

    pins = tuple(ENGINE_DEPS[engine])
    digest = hashlib.sha256(" ".join(pins).encode()).hexdigest()[:12]
    site, deps = cache / f"{engine}-{ENGINES[engine]}", cache / f"{engine}-{ENGINES[engine]}-deps-{digest}"
    if not (site / "UNPACKED").is_file():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=cache, prefix=".unpacking-"))
        wheel.extractall(tmp)
        (tmp / "UNPACKED").write_text("")
        shutil.rmtree(site, ignore_errors=True)
        os.replace(tmp, site)
    if not (deps / "PINS").is_file():
        build(deps, pins)
    return [deps, site]


def rename_key(export: Path, out: Path, key: str) -> Path:
    """A copy of `export` with `key` renamed (...mlp.up_proj.weight -> ...mlp.up.weight)."""
    from safetensors.torch import save_file

    shutil.copytree(export, out)
    tensors = load_file(str(out / "model.safetensors"))
    tensors[key.replace("up_proj", "up")] = tensors.pop(key)
    save_file(tensors, str(out / "model.safetensors"))
    return out


def run_engine(engine: str, paths: list[Path], jobs: list[dict], workdir: Path) -> None:
    """engine_load_run.py over `jobs` in one process with the engine's directory on its path."""
    runner = Path(__file__).with_name("engine_load_run.py")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, paths)), "OMP_NUM_THREADS": "1"}
    env |= {"VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1"}
    (workdir / f"{engine}-jobs.json").write_text(json.dumps(jobs, indent=2))
    cmd = [sys.executable, str(runner), engine, str(workdir / f"{engine}-jobs.json")]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=workdir)
    for job in jobs:  # a runner that died before a job wrote its report: the runner's own error
        if not Path(job["out"]).is_file():
            why = done.stderr[-3000:] or f"the runner exited {done.returncode} before this job"
            Path(job["out"]).write_text(json.dumps({"error": why}))


def judged(fmt: str, out: Path) -> dict:
    """The runner's report on one export, judged: every parameter filled and equal to what our files say
    (but those left to the target that our files do not hold), every key landed, d2t the engine's map."""
    report = json.loads(out.read_text())
    if "error" in report:
        return {"ok": False, **report}
    params = report["params"]
    shared = {n for n in FROM_TARGET[fmt] if n in params and not params[n]["from"]}
    wrong = [
        n for n, r in params.items() if n not in shared and not (r["filled"] and r["max_abs_diff"] == 0.0)
    ]
    report["params_wrong"] = wrong
    report["left_to_the_target"] = sorted(n for n in shared if not params[n]["filled"])
    d2t = report["d2t_to_target_ids_equal"] is not False  # None: no d2t (EAGLE-1/2)
    report["ok"] = not wrong and not report["our_keys_not_landed"] and d2t
    return report


def loads(engine_wheels: dict, cache: Path, exports: dict[str, dict[str, Path]], root: Path) -> list[dict]:
    """Each engine's own class for each format it reads (LOADED), over every family's exports, on the
    export and on a copy with a key renamed; one runner process an engine."""
    results = []
    for engine, wheel in engine_wheels.items():
        paths = engine_env(engine, wheel, cache)
        jobs, cases = [], []
        for family, family_exports in exports.items():
            target = family_exports["eagle3"].parent / "target"
            for fmt in LOADED[engine]:
                export = family_exports[fmt]
                work = root / "loads" / engine / export.parent.name  # no family name: main()
                work.mkdir(parents=True, exist_ok=True)
                broken = rename_key(export, work / f"{fmt}-key-renamed", BREAK[fmt])
                for kind, path in (("export", export), ("broken", broken)):
                    out = work / f"{fmt}-{kind}.json"
                    jobs.append({"format": fmt, "export": str(path), "target": str(target), "out": str(out)})
                cases.append((family, fmt, work / f"{fmt}-export.json", work / f"{fmt}-broken.json"))
        run_engine(engine, paths, jobs, root / "loads" / engine)
        for family, fmt, out, broken_out in cases:
            report, check = judged(fmt, out), judged(fmt, broken_out)
            results.append(
                {
                    "kind": "loaded: the engine's own model class built on CPU, its load_weights called on our files",
                    "family": family,
                    "format": fmt,
                    "engine": f"{engine} {ENGINES[engine]}",
                    "engine_class": report.get("engine_class"),
                    "ok": report["ok"],
                    "forward": FORWARD_BLOCKED[engine],
                    "broken_on_purpose": {
                        "breakage": f"{BREAK[fmt]} renamed {BREAK[fmt].replace('up_proj', 'up')}",
                        "check_fails": not check["ok"],
                        "not_landed": check.get("our_keys_not_landed"),
                        "params_wrong": check.get("params_wrong"),
                        "engine_error": (check.get("error") or "").strip().splitlines()[-1:],
                    },
                    "report": report,
                }
            )
    return results


def failures(audits: list[dict], loaded: list[dict]) -> list[str]:
    """What fails the check: an audit of a model file the engine has that no longer matches, a load that
    is not whole, a copy broken on purpose that passes. A format the engine has no file for (vllm-medusa
    in vLLM 0.33.0) is reported, not failed: that engine cannot load it, whatever we write."""
    found = [
        f"audit {r['family']} {r['format']} {r['engine']}"
        for r in audits
        if not r["ok"] and "verdict" not in r
    ]
    for r in loaded:
        what = f"{r['family']} {r['format']} {r['engine']}"
        if not r["ok"]:
            found.append(f"load {what}: {(r['report'].get('error') or '').strip().splitlines()[-1:]}")
        if not r["broken_on_purpose"]["check_fails"]:
            found.append(f"load {what}: a key renamed still passes")
    return found


def parse_families(text: str) -> list[str]:
    names = list(FAMILIES) if text == "all" else [f.strip() for f in text.split(",") if f.strip()]
    unknown = [f for f in names if f not in FAMILIES]
    if unknown or not names:
        raise SystemExit(
            f"--families: unknown {unknown or text!r}; give 'all' or some of {', '.join(FAMILIES)}"
        )
    return names


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("engine_audit.json"))
    p.add_argument("--wheels", type=Path, default=default_cache_dir() / "engine-wheels")
    p.add_argument(
        "--load",
        action="store_true",
        help="also load the exports with the engines' own classes (LOADED)",
    )
    p.add_argument(
        "--families",
        default="llama",
        help=f"'all' or a comma-separated list of scripts/families.py names ({', '.join(FAMILIES)})",
    )
    args = p.parse_args(argv)
    families = parse_families(args.families)
    engine_wheels = wheels(args.wheels)
    with tempfile.TemporaryDirectory() as tmp:
        # folders named by number, not family: SGLang reads a draft folder whose path names both "eagle"
        # and "mistral" as Mistral's native format (params.json; sglang mistral_utils.is_mistral_model)
        exports = {
            family: tiny_exports(Path(tmp) / f"family{i}", family) for i, family in enumerate(families)
        }
        results = [
            {"family": family, **audit(fmt, engine, model_file, arch, rules, engine_wheels[engine], ex[fmt])}
            for family, ex in exports.items()
            for fmt, engine, model_file, arch, rules in AUDITS
        ]
        loaded = loads(engine_wheels, args.wheels / "envs", exports, Path(tmp)) if args.load else []
    failed = failures(results, loaded)
    out = {"versions": ENGINES, "families": families, "audits": results, "loads": loaded, "failures": failed}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    for r in results:
        ok = "ok" if r["ok"] else ("cannot load it" if "verdict" in r else "FAILS")
        print(f"{r['family']:12s} {r['format']:12s} {r['engine']:14s} audit: {ok}")
    for r in loaded:
        broken = "fails as it must" if r["broken_on_purpose"]["check_fails"] else "PASSES: the check is blind"
        print(
            f"{r['family']:12s} {r['format']:12s} {r['engine']:14s} loaded: {'ok' if r['ok'] else 'FAILS'}; "
            f"key renamed: {broken}"
        )
    print(f"wrote {args.out}")
    for line in failed:
        print(f"FAILED: {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
