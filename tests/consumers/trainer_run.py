"""Run a consumer's OWN trainer on the tiny target, then its own loader on what the trainer wrote (run in
the consumer env, one process per trainer: each builds its own accelerate state).

    python trainer_run.py JOB.json     # {"kind": "eagle" | "medusa", "work", "target", "inputs", "out"}

The tests (test_consumer_trainers.py) and benchmarks/bench_trainers.py both start it with `start_trainer` and
read its out file with `finish_trainer` (this file, imported by path: tests/consumers on sys.path). Job
keys beyond the above: eagle "lr", "bs" (main.py's --bs, default 4); medusa "lr", "steps", "max_length",
and "args" (train.py flags that replace or add to the defaults below, e.g. {"--num_train_epochs": "6"};
a value None drops the flag). The out file also holds "wall_s" (the whole trainer run, data generation
included), "maxrss_kb" (the process's peak resident memory, resource.getrusage) and, for eagle,
"ge_data_s" / "main_s" (its two stages).

Runs with PYTHONPATH at the consumer packages (consumer_env.py); torch, transformers, accelerate, datasets
and wandb are the project's. It imports nothing of specheads. Their files are run as they are, never
edited: `runpy` runs eagle-llm's `eagle/ge_data/ge_data_all_vicuna.py` and `eagle/train/main.py` as
`python -m` runs them, and medusa-llm's `medusa/train/train.py` is imported and its own `train()` called
(what its `__main__` block does), with the argv their READMEs give, scaled down. The out file holds the
consumer's outputs on the job's inputs, computed by the consumer's own classes from the files its trainer
wrote.

eagle  (eagle-llm 1.2.1)
  1. eagle/ge_data/ge_data_all_vicuna.py --start 0 --end N --outdir WORK/data: their data generator,
     reading WORK/ShareGPT_V4.3_unfiltered_cleaned_split.json (written by the test in ShareGPT's format)
     and the target at the path it hard-codes, "vicunav13/13B" (a link in WORK, the cwd, to the target);
     it writes data_{i}.ckpt files {input_ids, hidden_state, loss_mask}.
  2. eagle/train/main.py --basepath TARGET --configpath WORK/config.json --tmpdir WORK/data --cpdir
     WORK/ckpt --bs 4 --lr LR: their trainer, all 21 epochs it hard-codes (~20 s on the tiny target, half
     of it the per-epoch test, getkacc); accelerate's save_state writes WORK/ckpt/state_{epoch}/.
  3. The last state loaded into `cnets.Model(config, bias=True)` with `load_state_dict(strict=True)`, as
     `EaModel.from_pretrained` loads a release; its forward on the job's inputs.

medusa  (medusa-llm 0.1)
  1. medusa/train/train.py's train() with --model_name_or_path TARGET --data_path WORK/train.json
     (ShareGPT format) --medusa_num_heads 3 --medusa_num_layers 1 --max_steps S --save_strategy no ...
     It writes OUTPUT_medusa_mlp_..._layers_1/{config.json, medusa_lm_head.pt}.
  2. That directory loaded by `MedusaModel.from_pretrained` (consumer_run.run_medusa), its heads run on
     the job's inputs.

Shims, each the smallest that lets their unchanged code run here (CPU only, transformers 5, offline):
  both    torch.Tensor.cuda -> the tensor itself when there is no CUDA: ge_data moves input_ids with
          .cuda(), main.py its epoch metrics (torch.tensor(correct).cuda()). Env: WANDB_MODE=disabled
          (main.py calls wandb.init(project="ess", entity="yuhui-li") and wandb.log), HF_HUB_OFFLINE=1,
          HF_DATASETS_CACHE in WORK (ge_data's load_dataset).
  eagle   EConfig.from_pretrained gives back the file's `rope_scaling` (null): transformers 5 rewrites it
          as {"rope_type": "default", ...}, which cnets (transformers 4 code) reads as a scaling spec
          and fails on ["type"].
          The target directory carries model.safetensors.index.json (written by the test): main.py and
          cnets' load_emb find lm_head / embed_tokens only through an index file (their targets are
          sharded; the tiny target is one file).
          The ShareGPT file and the "vicunav13/13B" link, above: their paths are hard-coded.
          DataLoader(num_workers=2, pin_memory=True) loads in-process (num_workers=0, no pinning): for
          speed only (the batches are the same): main.py makes 42 loaders in its 21 epochs, each forking
          two workers; on this shared 2-core machine, with 12 conversations, main.py took 60 s with them
          and 47 s without.
  medusa  Trainer.__init__ takes `tokenizer=` as `processing_class=` (transformers 5 dropped the name).
          CustomizedTrainer.compute_loss drops the `num_items_in_batch` argument (transformers >= 4.46
          passes it; their override predates it).
          MedusaModel.__init__: train.py builds MedusaModel(model, heads, layers) without
          base_model_name_or_path, so __init__ loads the tokenizer of its default, lmsys/vicuna-7b-v1.3,
          from the Hub; the shim passes the base model's own path. And train.py's last lines save
          `model.medusa_head` where `model` is the base model (a bug of the 0.1 release: the heads are
          on the MedusaModel); the shim points the base model's attribute `medusa_head` at the
          MedusaModel's heads (not registered as a submodule: nothing else sees it).
          from_pretrained drops `load_in_4bit` / `load_in_8bit` when false (transformers 5 refuses the
          keywords; they are false here, so nothing is lost).
"""

from __future__ import annotations

import inspect
import json
import os
import resource
import runpy
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file


def shim_cuda() -> None:
    if not torch.cuda.is_available():
        torch.Tensor.cuda = lambda self, *a, **kw: self


def run_module(name: str, argv: list[str]) -> None:
    """`python -m name argv...` in this process."""
    saved = sys.argv
    sys.argv = [name, *argv]
    try:
        runpy.run_module(name, run_name="__main__", alter_sys=True)
    finally:
        sys.argv = saved


def shim_econfig() -> None:
    from eagle.model.configs import EConfig

    loader = EConfig.from_pretrained.__func__

    def from_pretrained(cls, path, *a, **kw):
        config = loader(cls, path, *a, **kw)
        file = Path(path) if Path(path).is_file() else Path(path) / "config.json"
        config.rope_scaling = json.loads(file.read_text()).get("rope_scaling")
        return config

    EConfig.from_pretrained = classmethod(from_pretrained)


def shim_loader_workers() -> None:
    from torch.utils.data import DataLoader

    init = DataLoader.__init__

    def in_process(self, *a, num_workers=0, pin_memory=False, **kw):
        init(self, *a, num_workers=0, pin_memory=False, **kw)

    DataLoader.__init__ = in_process


def train_eagle(job: dict) -> dict:
    work, target = Path(job["work"]), Path(job["target"])
    shim_econfig()
    shim_loader_workers()
    os.chdir(work)  # ge_data reads its ShareGPT file and "vicunav13/13B" from the cwd
    n = len(json.loads((work / "ShareGPT_V4.3_unfiltered_cleaned_split.json").read_text()))
    start = time.perf_counter()
    run_module("eagle.ge_data.ge_data_all_vicuna", ["--start", "0", "--end", str(n), "--outdir", "data"])
    ge_data_s = time.perf_counter() - start
    args = ["--basepath", str(target), "--configpath", str(work / "config.json"), "--tmpdir", "data"]
    bs = str(job.get("bs", 4))
    run_module("eagle.train.main", [*args, "--cpdir", "ckpt", "--bs", bs, "--lr", str(job["lr"])])
    main_s = time.perf_counter() - start - ge_data_s

    from eagle.model.cnets import Model
    from eagle.model.configs import EConfig

    states = sorted((work / "ckpt").glob("state_*"), key=lambda p: int(p.name.split("_")[1]))
    config = EConfig.from_pretrained(work / "config.json")
    model = Model(config, bias=True)
    model.load_state_dict(load_file(str(states[-1] / "model.safetensors")), strict=True)
    model.eval()
    inputs = torch.load(job["inputs"], weights_only=True)
    with torch.no_grad():
        features = model(inputs["features"], input_ids=inputs["input_ids"])
    # the same weights under a config whose rotary base is 100000 (SmolLM2's): cnets builds its rotary
    # embedding without reading the config's base, so the features must not change (bench_trainers decodes
    # its heads with base 10000 for that reason: eagle_llm_release_config)
    config.rope_theta = 100000.0
    if isinstance(getattr(config, "rope_parameters", None), dict):
        config.rope_parameters = {**config.rope_parameters, "rope_theta": 100000.0}
    other_base = Model(config, bias=True)
    other_base.load_state_dict(model.state_dict(), strict=True)
    other_base.eval()
    with torch.no_grad():
        features_rope_1e5 = other_base(inputs["features"], input_ids=inputs["input_ids"])
    return {
        "features": features,
        "features_rope_1e5": features_rope_1e5,
        "states": [str(p) for p in states],
        "data_files": sorted(str(p.relative_to(work)) for p in (work / "data").rglob("*.ckpt")),
        "ge_data_s": ge_data_s,
        "main_s": main_s,
    }


def shim_medusa(train_module) -> None:
    import transformers
    from medusa.model import medusa_model

    init = transformers.Trainer.__init__
    if "tokenizer" not in inspect.signature(init).parameters:  # transformers 5

        def trainer_init(self, *a, tokenizer=None, **kw):
            init(self, *a, processing_class=kw.pop("processing_class", tokenizer), **kw)

        transformers.Trainer.__init__ = trainer_init

    compute_loss = train_module.CustomizedTrainer.compute_loss

    def compute_loss_without_count(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        return compute_loss(self, model, inputs, return_outputs=return_outputs)

    train_module.CustomizedTrainer.compute_loss = compute_loss_without_count

    heads_init = medusa_model.MedusaModel.__init__

    def medusa_init(self, base_model, medusa_num_heads=2, medusa_num_layers=1, base_model_name_or_path=None):
        path = base_model_name_or_path or base_model.name_or_path
        heads_init(self, base_model, medusa_num_heads, medusa_num_layers, path)
        object.__setattr__(base_model, "medusa_head", self.medusa_head)

    medusa_model.MedusaModel.__init__ = medusa_init

    auto = transformers.AutoModelForCausalLM.from_pretrained.__func__

    def from_pretrained(cls, *a, **kw):
        for key in ("load_in_4bit", "load_in_8bit"):
            if kw.get(key) is False:
                kw.pop(key)
        return auto(cls, *a, **kw)

    transformers.AutoModelForCausalLM.from_pretrained = classmethod(from_pretrained)


def train_medusa(job: dict) -> dict:
    from consumer_run import run_medusa
    from medusa.train import train as train_module

    work, target = Path(job["work"]), Path(job["target"])
    shim_medusa(train_module)
    os.chdir(work)
    flags = {
        "--model_name_or_path": str(target),
        "--data_path": str(work / "train.json"),
        "--output_dir": str(work / "medusa"),
        "--medusa_num_heads": "3",
        "--medusa_num_layers": "1",
        "--model_max_length": str(job["max_length"]),
        "--lazy_preprocess": "True",
        "--per_device_train_batch_size": "2",
        "--max_steps": str(job.get("steps")),
        "--learning_rate": str(job["lr"]),
        "--weight_decay": "0.0",
        "--warmup_steps": "1",
        "--lr_scheduler_type": "cosine",
        "--save_strategy": "no",
        "--logging_steps": "1",
        "--report_to": "none",
        "--seed": "0",
        **job.get("args", {}),
    }
    argv = [x for k, v in flags.items() if v is not None for x in (k, v)]
    saved = sys.argv
    sys.argv = ["train.py", *argv]
    try:
        train_module.train()
    finally:
        sys.argv = saved
    (out,) = work.glob("medusa_medusa_mlp_*")
    inputs = torch.load(job["inputs"], weights_only=True)
    return {**run_medusa(out, target, inputs), "checkpoint": str(out)}


def main(argv: list[str]) -> int:
    job = json.loads(Path(argv[0]).read_text())
    shim_cuda()
    start = time.perf_counter()
    result = {"eagle": train_eagle, "medusa": train_medusa}[job["kind"]](job)
    result["wall_s"] = time.perf_counter() - start
    result["maxrss_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    torch.save(result, job["out"])
    return 0


# -- started from the tests and benchmarks/bench_trainers.py (the project's environment) ---------------


def eagle_draft_config(target: Path, out: Path) -> Path:
    """main.py's --configpath: the target's config with one layer, as the EAGLE repo's configs are."""
    config = json.loads((target / "config.json").read_text())
    config.update(num_hidden_layers=1, architectures=["LlamaForCausalLM"])
    out.write_text(json.dumps(config))
    return out


def start_trainer(env: Path, job: dict, work: Path) -> subprocess.Popen:
    """This file on `job`, in the consumer env `env`, started in the background (the two trainers run side
    by side: most of each run is importing torch, transformers and fastchat)."""
    (work / "job.json").write_text(json.dumps(job))
    environ = {
        **os.environ,
        "PYTHONPATH": str(env),
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "WANDB_MODE": "disabled",
        "HF_DATASETS_CACHE": str(work / "hf-datasets"),
        "TOKENIZERS_PARALLELISM": "false",
    }
    cmd = [sys.executable, str(Path(__file__).resolve()), str(work / "job.json")]
    with open(work / "trainer.log", "w") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=environ, cwd=work)


def finish_trainer(returncode: int, job: dict, work: Path) -> dict:
    """The trainer's out file, or its log's tail in the error when it failed."""
    if returncode != 0:
        log = (work / "trainer.log").read_text()
        raise AssertionError(f"{job['kind']}'s trainer run failed:\n{log[-6000:]}")
    return torch.load(job["out"], weights_only=False)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
