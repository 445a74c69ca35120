"""Build an engine's own EAGLE-3 / EAGLE model class on CPU and call its load_weights on our exports (engine env).

    python engine_load_run.py ENGINE JOBS.json

JOBS.json lists {"format", "export", "target", "out"}: FORMAT is eagle3 or eagle (both engines) or
speculators (vLLM, which reads a speculators config into its own Eagle-3 draft). All jobs run in this one
process (the engine's import chain is its slow part): the parallel groups are set up once, each job's
model built under its own config. A job that raises writes {"error": traceback} to its `out` and the
next job runs.

Runs with PYTHONPATH at the engine's wheel (installed --no-deps by scripts/check_engines.py --load) and the
pure-Python packages its import chain needs. It imports nothing of specheads. Two import-time stubs, both
for modules whose code the build and load_weights never run (STUBS below), are the only shims.

For each parameter of the engine's model, filled with NaN first: whether load_weights filled it, which of
our tensors it should hold, and max |param - what our files say it holds| (q/k/v and gate/up
stacked into the engine's fused projections, midlayer.* renamed layers.0.*, `model.` prefixed as the
engine's load_weights does). Each of our tensors must land (its parameter filled and equal); d2t is checked against the
engine's own hot-token / draft-to-target map; t2d is read and skipped by both engines.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import sys
import types
from pathlib import Path

import torch

# module prefix -> why a stub is enough (nothing from it runs in the build or load_weights)
STUBS = {
    "sglang": {
        "torchvision": "imported by SGLang's multimodal configs (sglang/srt/configs/__init__.py), "
        "reached from llama_eagle3's import of sglang.srt.configs.draft_parallel; PyPI's torchvision "
        "wheel is built against CUDA torch (libtorch_cuda.so) and cannot load on this CPU torch",
        "vllm": "RotaryEmbedding (sglang/srt/layers/rotary_embedding/base.py:138) imports vLLM's compiled "
        "rotary kernel `vllm._custom_ops.rotary_embedding` as its fallback on a non-CUDA, non-CPU-engine "
        "platform; used only in forward",
    },
    "vllm": {
        "torchvision": "imported at module level by vLLM's multimodal processing code on the import path of "
        "llama_eagle3 (the same CUDA-built torchvision wheel as above cannot load on CPU torch)",
    },
}


class _Any:
    def __init__(self, *a, **k):
        pass

    def __call__(self, *a, **k):
        return _Any()

    def __getattr__(self, name):
        return _Any()

    def __mro_entries__(self, bases):
        return (object,)


class _Stub(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Any()


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, names):
        self.names = names

    def find_spec(self, fullname, path=None, target=None):
        if any(fullname == n or fullname.startswith(n + ".") for n in self.names):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Stub(spec.name)
        module.__path__, module.__version__ = [], "0.0.0+stub"
        return module

    def exec_module(self, module):
        pass


UNSET = -123456789  # integer parameters (vLLM's draft_id_to_target_id) start at this
STACKED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2)}
STACKED |= {"gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}
FUSED_PARTS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
PADDED = ("lm_head.weight", "embed_tokens.weight")  # vocabulary-parallel: rows padded to a multiple of 64


def destinations(
    tensors: dict[str, torch.Tensor], params: dict
) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """(our key -> the engine parameter it should land in, parameter -> what it should then hold): midlayer.*
    read as layers.0.*, q/k/v and gate/up stacked into the fused projections, `model.` prefixed, as both
    engines' load_weights do; d2t into vLLM's draft_id_to_target_id (SGLang turns it into hot_token_id,
    checked apart); t2d skipped by both."""
    where, parts, held = {}, {}, {}
    for name, t in tensors.items():
        if name == "d2t" and "draft_id_to_target_id" in params:
            where[name], held["draft_id_to_target_id"] = "draft_id_to_target_id", t
            continue
        if name in ("d2t", "t2d"):
            continue
        engine = name.replace("midlayer.", "layers.0.")
        module = engine.split(".")[-2]
        if module in STACKED:
            engine = engine.replace(f".{module}.", f".{STACKED[module][0]}.")
        engine = engine if engine in params else f"model.{engine}"
        where[name] = engine
        if module in STACKED:
            parts.setdefault(engine, {})[STACKED[module][1]] = t
        else:
            held[engine] = t
    for engine, pieces in parts.items():
        if sorted(pieces) == list(range(len(FUSED_PARTS[engine.split(".")[-2]]))):  # a part missing: no value
            held[engine] = torch.cat([pieces[i] for i in sorted(pieces)], dim=0)
    return where, held


_READY: set[str] = set()  # engines whose parallel groups are set up (once a process)


def build_sglang(export: Path, target: Path, fmt: str):
    from sglang.srt import runtime_context as rc
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs(
        model_path=str(target),
        device="cpu",
        speculative_algorithm="EAGLE3" if fmt == "eagle3" else "EAGLE",
        speculative_draft_model_path=str(export),
        tp_size=1,
        disable_cuda_graph=True,
    )
    rc.publish(args, role="scheduler", ranks=rc.SpawnRanks(world_rank=0))  # last publish wins
    from sglang.srt.distributed import parallel_state as ps

    if "sglang" not in _READY:
        ps.init_distributed_environment(
            world_size=1,
            rank=0,
            local_rank=0,
            backend="gloo",
            distributed_init_method="tcp://127.0.0.1:29533",
        )
        ps.initialize_model_parallel(backend="gloo")
        _READY.add("sglang")
    from transformers import AutoConfig

    if fmt == "eagle3":
        from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3 as cls
    elif fmt == "eagle":
        from sglang.srt.models.llama_eagle import LlamaForCausalLMEagle as cls
    else:
        raise ValueError(f"SGLang reads no {fmt!r} export here (eagle3, eagle)")

    model = cls(AutoConfig.from_pretrained(export))
    return model, f"{cls.__module__}.{cls.__name__}", lambda m: getattr(m, "hot_token_id", None)


_HELD: list = []  # a context manager collected early would unset vLLM's current config


def build_vllm(export: Path, target: Path, fmt: str):
    import os

    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    from vllm.config import (
        ModelConfig,
        ParallelConfig,
        SpeculativeConfig,
        VllmConfig,
        set_current_vllm_config,
    )
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    target_config = ModelConfig(model=str(target), dtype="float32")
    if fmt == "speculators":  # the method and token count as vLLM reads them from a speculators config
        from vllm.transformers_utils.configs.speculators import SpeculatorsConfig

        config_dict = json.loads((export / "config.json").read_text())
        spec = SpeculatorsConfig.extract_vllm_speculative_config(config_dict)
    else:
        spec = {"method": fmt, "num_speculative_tokens": 3}
    speculative = SpeculativeConfig(
        model=str(export),
        **spec,
        target_model_config=target_config,
        target_parallel_config=ParallelConfig(),
    )
    config = VllmConfig(model_config=target_config, speculative_config=speculative)
    while _HELD:  # the previous job's config: vLLM's worker holds one at a time
        _HELD.pop().__exit__(None, None, None)
    _HELD.append(set_current_vllm_config(config))  # held for the job, as vLLM's worker holds it
    _HELD[-1].__enter__()
    if "vllm" not in _READY:
        init_distributed_environment(
            world_size=1,
            rank=0,
            local_rank=0,
            distributed_init_method="tcp://127.0.0.1:29544",
            backend="gloo",
        )
        initialize_model_parallel(1, 1)
        _READY.add("vllm")
    # the class vLLM's model loader picks for the draft's (renamed) architecture
    from vllm.model_executor.model_loader.utils import get_model_architecture

    cls, _ = get_model_architecture(speculative.draft_model_config)
    model = cls(vllm_config=config)
    d2t = lambda m: torch.arange(m.draft_id_to_target_id.numel()) + m.draft_id_to_target_id.detach()  # noqa: E731
    return model, f"{cls.__module__}.{cls.__name__}", d2t


def load_and_check(model, tensors: dict[str, torch.Tensor], d2t_map) -> dict:
    """Every parameter starts as NaN (integers: UNSET); after the engine's own load_weights, each must be
    filled and equal to what our files say it holds, and each of our keys must have landed."""
    params = dict(model.named_parameters())
    with torch.no_grad():
        for p in params.values():
            p.fill_(float("nan") if p.is_floating_point() else UNSET)
    model.load_weights(iter(tensors.items()))
    where, expected = destinations(tensors, params)
    report = {}
    for name, p in params.items():
        want = expected.get(name)
        # vocabulary-parallel layers pad their rows (to a multiple of 64): compare the rows we fill
        padded = want is not None and name.endswith(PADDED) and want.shape[1:] == p.shape[1:]
        held = p.detach()[: want.shape[0]] if padded else p.detach()
        if want is not None and held.shape != want.shape:
            want = None  # shapes differ: not what our files say
        filled = not (torch.isnan(held) if held.is_floating_point() else held == UNSET).any().item()
        report[name] = {
            "filled": filled,
            "from": sorted(k for k, v in where.items() if v == name),
            "max_abs_diff": float((held - want).abs().max()) if want is not None and filled else None,
            "padding_rows": int(p.shape[0] - want.shape[0]) if padded else 0,
        }
    landed = {n for n, r in report.items() if r["filled"] and r["max_abs_diff"] == 0.0}  # None: no value
    # an all-zero tensor the engine has no parameter for changes nothing (our `eagle` export's fc.bias,
    # zeros for a head trained without one, which SGLang's fc has and vLLM's lacks): listed apart
    zero_no_param = sorted(k for k, d in where.items() if d not in params and not tensors[k].any())
    unused = sorted(k for k, dest in where.items() if dest not in landed and k not in zero_no_param)
    d2t_ok = None
    if "d2t" in tensors:
        d2t_ok = bool(
            torch.equal(d2t_map(model).cpu(), torch.arange(tensors["d2t"].numel()) + tensors["d2t"])
        )
    return {
        "params": report,
        "our_keys_not_landed": unused,
        "zero_keys_without_engine_param": zero_no_param,
        "d2t_to_target_ids_equal": d2t_ok,
    }


def run_job(engine: str, job: dict) -> dict:
    from safetensors.torch import load_file

    export_dir = Path(job["export"])
    tensors = load_file(str(export_dir / "model.safetensors"))
    build = {"sglang": build_sglang, "vllm": build_vllm}[engine]
    model, cls, d2t_map = build(export_dir, Path(job["target"]), job["format"])
    return {"engine_class": cls, "stubs": STUBS[engine], **load_and_check(model, tensors, d2t_map)}


def main(engine: str, jobs_file: str) -> None:
    import traceback

    sys.meta_path.insert(0, _StubFinder(list(STUBS[engine])))
    for job in json.loads(Path(jobs_file).read_text()):
        try:
            result = run_job(engine, job)
        except Exception:  # one job's failure is its report; the next job runs
            result = {"error": traceback.format_exc()}
        Path(job["out"]).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
