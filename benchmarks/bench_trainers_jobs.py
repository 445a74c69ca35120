"""benchmarks/bench_trainers.py's shared parts: the budgets matched to the peers', the data both sides train
on, and the runs (our trainer, imports, evaluation, one child process measured), with the row each run
gives. The per-method jobs and the command line stay in bench_trainers.py."""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.bench_trainers_paired import prompt_steps

ROOT = Path(__file__).resolve().parents[1]

# the recipe folder of each target the bench trains on: `--target tiny` (the default) or `smollm2`
RECIPES = {"tiny": "tiny", "smollm2": "smollm2-135m"}
EAGLE_TRAIN_FRACTION = 0.95  # eagle-llm's main.py: datapath[:int(len(datapath) * 0.95)]
EAGLE_BS = 4  # main.py's --bs default


# -- budgets (pure) -----------------------------------------------------------------------------------


def eagle_budget(rows: int, epochs: int, bs: int = EAGLE_BS) -> dict:
    """eagle-llm's main.py over `rows` data files for `epochs` epochs, and ours matched to it: the same
    batch and optimizer steps (main.py's last batch of an epoch may be short: ours sees the same rows)."""
    n_train = int(rows * EAGLE_TRAIN_FRACTION)
    steps = epochs * math.ceil(n_train / bs)
    return {"peer_rows": n_train, "epochs": epochs, "batch": bs, "grad_accum": 1, "steps": steps,
            "rows_seen": epochs * n_train}  # fmt: skip


def medusa_budget(rows: int, epochs: int, batch: int = 8, grad_accum: int = 4) -> dict:
    """medusa-llm's train.py (HF Trainer) for `epochs` epochs over `rows`, and ours at its optimizer steps.
    The Trainer steps at each epoch's end with what it accumulated: with fewer micro-batches an epoch than
    `grad_accum`, a step holds one epoch's rows, and ours accumulates that many micro-batches."""
    micro = math.ceil(rows / batch)
    steps = epochs * math.ceil(micro / grad_accum)
    return {"peer_rows": rows, "epochs": epochs, "batch": batch, "grad_accum": min(grad_accum, micro),
            "steps": steps, "rows_seen": epochs * rows}  # fmt: skip


def tokens_seen(budget: dict, mean_row_tokens: float) -> int:
    return round(budget["rows_seen"] * mean_row_tokens)


# -- the data -----------------------------------------------------------------------------------------


def make_conversations(target_dir: Path, n: int, prompt_tokens: int, answer_tokens: int, seed: int) -> list:
    """[(prompt text, answer text)]: windows of the training files, the target's greedy continuation."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specheads.train.sources import stdlib_rows

    tok = AutoTokenizer.from_pretrained(target_dir)
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    texts = stdlib_rows(heldout=False)["text"]
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        text = texts[rng.randrange(len(texts))]
        lines = text.splitlines(keepends=True)
        if len(lines) < 8:
            continue
        start = rng.randrange(len(lines) - 4)
        ids = tok("".join(lines[start : start + 40]), add_special_tokens=False).input_ids[:prompt_tokens]
        if len(ids) < prompt_tokens:
            continue
        prompt = tok.decode(ids)
        ids = tok(prompt, add_special_tokens=False).input_ids
        with torch.no_grad():
            gen = model.generate(
                torch.tensor([[tok.bos_token_id, *ids]]), max_new_tokens=answer_tokens, do_sample=False
            )[0, len(ids) + 1 :].tolist()
        if tok.eos_token_id in gen:
            gen = gen[: gen.index(tok.eos_token_id)]
        answer = tok.decode(gen, skip_special_tokens=True)
        if answer.strip():
            out.append((prompt, answer))
    return out


def chat_conversations(
    target_dir: Path, n: int, answer_tokens: int, seed: int, batch: int = 16, device: str = "cpu"
) -> list:
    """[(prompt text, answer text)] for a chat target: the first n of the project's seed prompts in `seed`'s
    order (data/seed_prompts.py; never MT-Bench or Spec-Bench, which a test proves) and, as the answer,
    the target's own greedy reply in its chat template (at most `answer_tokens`, up to its EOS), `batch`
    prompts at a time through the evaluation's baseline runner (left-padded, as `generate` gives each alone),
    in fp32 on `device`; kept in the specheads cache for the next run (conversations_cache)."""
    import torch

    from specheads.core.atomic import write_json
    from specheads.core.target import FrozenTarget
    from specheads.data.seed_prompts import seed_prompts
    from specheads.decode.baseline import generate_rows, pad_token_id
    from specheads.decode.batched_inputs import left_pad
    from specheads.decode.step import eos_ids

    prompts = [r["messages"][0]["content"] for r in seed_prompts(seed)][:n]
    cached = conversations_cache(target_dir, prompts, answer_tokens, batch, device)
    if cached.is_file():
        return [tuple(pair) for pair in json.loads(cached.read_text())]
    target = FrozenTarget.from_pretrained(str(target_dir), dtype="float32",
                                          device_map=None if device == "cpu" else device)  # fmt: skip
    tok, eos = target.tokenizer, eos_ids(target)
    out = []
    for start in range(0, len(prompts), batch):
        chunk = prompts[start : start + batch]
        texts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                         add_generation_prompt=True) for p in chunk]  # fmt: skip
        ids, mask = left_pad([torch.tensor(tok(t, add_special_tokens=False).input_ids) for t in texts],
                             pad_token_id(target))  # fmt: skip
        for prompt, row in zip(chunk, generate_rows(target, ids.to(device), answer_tokens, mask.to(device))):
            answer = row[:-1] if row and row[-1] in eos else row  # the EOS ends the turn; not answer text
            out.append((prompt, tok.decode(answer, skip_special_tokens=True)))
    cached.parent.mkdir(parents=True, exist_ok=True)
    write_json(cached, out)
    return out


def conversations_cache(
    target_dir: Path, prompts: list[str], answer_tokens: int, batch: int, device: str
) -> Path:
    """Where chat_conversations keeps its answers (greedy, so the same every run, and minutes of CPU for a
    few hundred): under the specheads cache, named by a hash of the target's files (their sizes and times),
    the prompts and the generation's settings."""
    import hashlib

    from specheads.core.manifest import cache_root

    files = sorted(
        (f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in Path(target_dir).iterdir() if f.is_file()
    )
    key = json.dumps([str(Path(target_dir).resolve()), files, prompts, answer_tokens, batch, device])
    return cache_root() / "bench-conversations" / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"


def eval_prompts(target: str, out: Path, n: int) -> str:
    """What `specheads eval --prompts` reads for `target`: the tiny target's held-out files, else n MT-Bench
    questions, one from each category in turn (every 10th: MT-Bench lists ten a category), in a file under
    `out`."""
    if target == "tiny":
        return "heldout"
    from specheads.core.question_sets import prompt_set_path

    lines = Path(prompt_set_path("mt-bench")).read_text().splitlines()
    picked = [lines[(i % 8) * 10 + i // 8] for i in range(min(n, len(lines)))]
    out.mkdir(parents=True, exist_ok=True)
    (out / "mt-bench-eval.jsonl").write_text("\n".join(picked) + "\n")
    return str(out / "mt-bench-eval.jsonl")


def sharegpt_rows(conversations: list) -> list[dict]:
    return [
        {"id": f"tiny_{i}", "conversations": [{"from": "human", "value": p}, {"from": "gpt", "value": a}]}
        for i, (p, a) in enumerate(conversations)
    ]


def message_rows(conversations: list) -> list[dict]:
    return [
        {"messages": [{"role": "user", "content": p}, {"role": "assistant", "content": a}]}
        for p, a in conversations
    ]


def chat_target_view(tokens: str, masking: str) -> str:
    """A table note: how a peer reads a chat target, through `peer_target`. `tokens`: what the view spells
    for it beyond the BOS and EOS; `masking`: the peer's step that masks by counting Llama tokens."""
    return (
        f"the rows in its Vicuna template through a Vicuna view of the target (bench_trainers_jobs.peer_target: "
        f"BOS added, `</s>` its EOS, {tokens}), not the target's ChatML, which ours trains on and the evaluation "
        f"prompts use: its {masking} masks by counting a Llama tokenizer's tokens and cannot read ChatML"
    )


def peer_target(source: Path, out: Path, max_length: int) -> Path:
    """A target as the peers' Vicuna code reads it: the same weights and token ids; the tokenizer adds its
    BOS in front, its EOS is spelt `</s>` (the Vicuna template ends each answer with that text), and its
    pad token is also its unk token (medusa pads with the unk token): the tiny target's `<|pad|>`; where
    the pad token is the EOS (SmolLM2's `<|im_end|>`), the unk token (`<|endoftext|>`). Plus an index
    file that names `lm_head.weight` even where the embeddings are tied (eagle-llm reads it from there)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    out.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "generation_config.json"):
        shutil.copy(source / name, out / name)
    tj = json.loads((source / "tokenizer.json").read_text())
    cfg = json.loads((source / "tokenizer_config.json").read_text())
    eos, bos = cfg["eos_token"], cfg["bos_token"]
    for t in tj["added_tokens"]:
        if t["content"] == eos:
            t["content"] = "</s>"
    vocab = tj["model"]["vocab"]
    if eos in vocab:
        vocab["</s>"] = vocab.pop(eos)
    bos_id = next(t["id"] for t in tj["added_tokens"] if t["content"] == bos)
    tj["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}},
    }  # fmt: skip
    (out / "tokenizer.json").write_text(json.dumps(tj))
    pad = cfg.get("unk_token") if cfg.get("pad_token") in (None, eos) else cfg["pad_token"]
    if pad is None:
        raise ValueError(
            f"{source}: its tokenizer has neither a pad token apart from its EOS nor an unk token"
        )
    cfg.update(eos_token="</s>", pad_token=pad, unk_token=pad, model_max_length=max_length)
    cfg["extra_special_tokens"] = [t for t in cfg.get("extra_special_tokens", []) if t != eos]
    (out / "tokenizer_config.json").write_text(json.dumps(cfg))
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        names = sorted(f.keys())
        index = {"metadata": {}, "weight_map": {k: "model.safetensors" for k in names}}
        if "lm_head.weight" not in names:
            # tied embeddings (SmolLM2): eagle-llm's main.py reads `lm_head.weight` by name through the
            # index. A file of its own holds the embedding under that name; the config stays tied, and
            # transformers loads model.safetensors, not the index, so the target's function is unchanged.
            save_file({"lm_head.weight": f.get_tensor("model.embed_tokens.weight").contiguous()},
                      str(out / "lm_head.safetensors"))  # fmt: skip
            index["weight_map"]["lm_head.weight"] = "lm_head.safetensors"
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    return out


def mean_tokens(tokenizer, texts: list[str]) -> float:
    return sum(len(tokenizer(t).input_ids) for t in texts) / len(texts)


# -- runs ---------------------------------------------------------------------------------------------


def specheads_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "specheads", *args]


def run_measured(cmd: list[str], log: Path, env: dict | None = None) -> tuple[float, float]:
    """(wall s, peak RSS MiB) of one child process (os.wait4: its own rusage, not all children's)."""
    start = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{log.read_text()[-4000:]}")
    return wall, usage.ru_maxrss / 1024


def recipe_path(target: str, method: str) -> Path:
    """Our recipe for `method` on `target` (RECIPES)."""
    if target not in RECIPES:
        raise SystemExit(f"--target {target!r}: the bench has recipes for {sorted(RECIPES)}")
    return ROOT / "recipes" / RECIPES[target] / f"{method}.yaml"


# ours on a GPU as the recipes' GPU commands train: the target in bf16 under bf16 autocast, fp32 weights
OURS_CUDA = {"target_dtype": "bfloat16", "mixed_precision": "bf16"}


def train_ours(
    method: str, data: Path, budget: dict, out: Path, extra: dict, target: str = "tiny", device: str = "cpu"
) -> dict:
    overrides = {
        "data": f"[{data}]",
        "max_steps": budget["steps"],
        "batch_size": budget["batch"],
        "grad_accum": budget["grad_accum"],
        "eval_every": budget["steps"],
        "report_to": "none",
        "output_dir": str(out),
        # a chat target's recipe holds out a share of its data; here both sides train on every row. The tiny
        # recipes' loss on every token is for their plain-text rows: on the bench's chat rows ours trains the
        # answers, as the peers' masks do; a chat target's recipe keeps its own (SmolLM2's EAGLE-3: every token)
        **({"loss_on": "assistant"} if target == "tiny" else {"eval_fraction": 0}),
        **(OURS_CUDA if device == "cuda" else {}),
        **extra,
    }
    recipe = recipe_path(target, method)
    # what this function changes of the recipe, for the row's footnote (the caller adds the budget's keys)
    changes = [
        "loss_on=assistant on the tiny target (chat rows; its recipe's text rows use all)"
        if target == "tiny"
        else "eval_fraction=0 (the recipe holds 2% of its rows out; here it trains on every row, as modelopt)"
    ]
    if device == "cuda":
        changes.append("CUDA: target_dtype=bfloat16, mixed_precision=bf16 (the recipe's GPU command)")
    cache_s = None
    if overrides.get("mode") == "offline":
        # offline mode as a user runs it: `specheads cache` (the target once over the rows) then training
        # from the cache, both in the wall time and the peak, as eagle-llm's ge_data stage is in its
        cache = out.parent / f"{out.name}-cache"
        overrides["cache_dir"] = str(cache)
        keys = [f"{k}={v}" for k, v in overrides.items() if k not in ("mode", "cache_dir", "output_dir")]
        cmd = specheads_cmd("cache", str(recipe), *keys, "--out", str(cache), "--no-progress", "--overwrite")
        cache_s, cache_rss = run_measured(cmd, out.parent / f"{out.name}-cache.log")
    args = ["train", str(recipe), *(f"{k}={v}" for k, v in overrides.items()), "--no-progress", "--overwrite"]
    wall, rss = run_measured(specheads_cmd(*args), out.parent / f"{out.name}.log")
    if cache_s is not None:
        wall, rss = wall + cache_s, max(rss, cache_rss)
        changes.append(f"offline mode: `specheads cache` (bf16, {cache_s:.0f} s) then `train mode=offline`, both in "
                       "the wall time")  # fmt: skip
    summary = (
        json.loads((out / "train_summary.json").read_text()) if (out / "train_summary.json").is_file() else {}
    )
    step_s = summary.get("step_seconds")
    return {
        "wall_s": wall,
        "peak_rss_mib": rss,
        "peak_accelerator_mib": accelerator_mib(summary.get("peak_accelerator_bytes")),
        # the optimizer steps alone: no start-up, loading, tokenising, evaluation or saving
        "loop_s": None if step_s is None else step_s * summary["steps"],
        "heads": str(out),
        "overrides": {k: str(v) for k, v in overrides.items()},
        "cache_s": cache_s,  # offline mode: the cache's share of wall_s
        "changes": changes,
    }


def accelerator_mib(peaks) -> float | None:
    """The largest per-process accelerator peak (bytes; -1 where there was none) in MiB, or None."""
    top = max(peaks or [-1])
    return top / 2**20 if top > 0 else None


def import_heads(fmt: str, checkpoint: Path, target: Path, out: Path) -> Path:
    args = ["import-heads", "--format", fmt, "--checkpoint", str(checkpoint), "--target", str(target)]
    run_measured(specheads_cmd(*args, "--out", str(out)), out.parent / f"{out.name}.log")
    return out


def evaluate(
    heads: Path,
    tree: str,
    out: Path,
    prompts: int,
    new_tokens: int,
    target: str = "tiny",
    source: str = "heldout",
    device: str = "cpu",
) -> dict:
    """`specheads eval` of `heads` on `target`, `prompts` of `source` (eval_prompts), with `tree`, in fp32 on
    `device` (so that every output must equal `generate()`'s there too)."""
    args = ["eval", "--target", target, "--heads", str(heads), "--prompts", source, "--tree", tree]
    args += ["--device", device, "--dtype", "float32"]
    args += ["--num-prompts", str(prompts), "--max-new-tokens", str(new_tokens), "--out", str(out)]
    run_measured(specheads_cmd(*args, "--no-progress", "--overwrite"), out.parent / f"{out.name}.log")
    return json.loads((out / "results.json").read_text())


VICUNA_SYSTEM = (  # fastchat's "vicuna_v1.1" template, which both peers apply
    "A chat between a curious user and an artificial intelligence assistant. "
    "The assistant gives helpful, detailed, and polite answers to the user's questions."
)


def vicuna_text(prompt: str, answer: str) -> str:
    return f"{VICUNA_SYSTEM} USER: {prompt} ASSISTANT: {answer}</s>"


def row_result(
    method, trainer, budget, mean_row_tokens, ev, wall=None, rss=None, changes=(), loop_s=None, **extra
) -> dict:
    """One run's row. wall: the training process's wall seconds, start-up and saving included; loop_s: its
    training loop's alone, where the trainer says (ours: train_summary.json; Model Optimizer: the Trainer's
    train()), which on a GPU is most of the difference (a process spends 20 to 30 s starting there)."""
    seen = tokens_seen(budget, mean_row_tokens)
    return {
        "method": method,
        "trainer": trainer,
        "budget": budget,
        "tokens_seen": seen,
        "tau": ev["mean_accept_length"],
        "identical": ev["identical_to_baseline"],
        "accept_rate_per_depth": ev.get("accept_rate_per_depth"),
        "per_prompt": prompt_steps(ev),  # {id: [new tokens, steps]}, for the paired verdict
        "wall_s": wall,
        "peak_rss_mib": rss,
        "tokens_per_s": None if wall is None else seen / wall,
        "loop_s": loop_s,
        "loop_tokens_per_s": None if not loop_s else seen / loop_s,
        "changes": list(changes),
        **extra,
    }


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]
