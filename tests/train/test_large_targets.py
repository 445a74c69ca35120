"""docs/large-targets.md's Llama-3.3-70B block runs as written, scaled down: every specheads command of it,
in its order, with the tiny target for the 70B one, 2 CPU processes wherever it launches 2 or 8, and a few
rows, tokens and steps. The distillation runs in-process: its `--server` flags go (the server path and its
accounting are tested against a real server in test_distill_server.py); every other flag stays."""

import json
import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from test_docs import commands_in, fenced_lines

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "large-targets.md"
HUB_ID = "meta-llama/Llama-3.3-70B-Instruct"
# recipe keys that scale the 70B recipe down to the tiny target (after the recipe's own path)
SCALE = [
    "target_dtype=float32",
    "mixed_precision='no'",  # quoted: YAML reads a bare no as false
    "max_length=96",
    "eagle3.layers=1,2,3",
    "eagle3.draft_vocab_size=64",
    "eval_fraction=0.25",
    "batch_size=1",
    "grad_accum=1",
    "warmup_steps=1",
    "max_steps=4",
    "eval_every=2",
    "save_every=2",
    "eval_batches=1",
    "log_every=1",
    "report_to=none",
    "include_capped=true",  # a random target's answers all run to --max-new-tokens
]
FLAGS = {"--max-new-tokens": "8", "--max-length": "96", "--dtype": "float32"}


def block(title: str) -> list[str]:
    """The logical lines of the first fenced block after the heading `title`."""
    text = PAGE.read_text().splitlines()
    fences = [i for i in range(text.index(title), len(text)) if text[i].startswith("```")]
    first, last = fences[0] + 1, fences[1] + 1  # the fences' line numbers
    return [line for number, line in fenced_lines(PAGE) if first < number < last]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scaled(argv: list[str], target: Path) -> list[str]:
    """One command of the page, scaled down (module docstring)."""
    out, i = [], 0
    while i < len(argv):
        word = argv[i]
        if word == "--server":
            i += 2
            continue
        if word in FLAGS:
            out += [word, FLAGS[word]]
            i += 2
            continue
        if word == "--num_processes":
            out += [word, "2", "--main_process_port", str(free_port())]
            i += 2
            continue
        if word == HUB_ID:
            word = str(target)
        if word.startswith("recipes/"):
            out.append(str(REPO / word))
            if word.endswith(".yaml") and "accelerate" not in word:
                out += [f"target={target}", *SCALE]
            i += 1
            continue
        out.append(word)
        i += 1
    if out[:2] == ["specheads", "distill"]:
        out += ["--max-rows", "12"]
    if "eval" in out:
        out += ["--num-prompts", "2", "--no-progress"]
    if out[0] == "accelerate":
        out = [sys.executable, "-m", "accelerate.commands.launch", *out[2:]]
    else:
        out = [sys.executable, "-m", "specheads", *out[1:]]
    return out


def sharegpt(path: Path) -> None:
    """A few ShareGPT conversations, in the file the recipe's data names."""
    topics = ["the sea", "a clock", "bread", "rain", "a bridge", "snow", "a lamp", "tea"]
    rows = [
        {
            "id": str(i),
            "conversations": [
                {"from": "human", "value": f"Write two lines about {topic}."},
                {"from": "gpt", "value": f"Two lines about {topic}, short and plain."},
            ],
        }
        for i, topic in enumerate(topics * 2)
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rows))


@pytest.mark.slow
def test_the_70b_commands_run_scaled_down(tiny_target_dirs, tmp_path):
    lines = block("## Llama-3.3-70B, step by step")
    commands = [argv for line in lines for argv in commands_in(line)]
    ran = [argv[argv.index("specheads") + 1] if "specheads" in argv else "train" for argv in commands]
    assert ran == ["distill", "cache", "train", "eval", "export"]
    assert any(re.match(r"CUDA_VISIBLE_DEVICES=\S+ vllm serve " + HUB_ID, line) for line in lines)
    sharegpt(tmp_path / "data" / "ShareGPT_V4.3_unfiltered_cleaned_split.json")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    for argv in commands:
        cmd = scaled(argv, tiny_target_dirs["llama"])
        result = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        assert result.returncode == 0, shlex.join(cmd) + "\n" + result.stdout[-2000:] + result.stderr[-4000:]
    index = json.loads((tmp_path / "cache/llama-3.3-70b-eagle3/train/index.json").read_text())
    assert index["complete"] and index["capture_layers"] == [1, 2, 3, 4]
    summary = json.loads((tmp_path / "runs/llama-3.3-70b-eagle3/train_summary.json").read_text())
    assert summary["processes"] == 2
    results = json.loads((tmp_path / "runs/llama-3.3-70b-eagle3-mt-bench/results.json").read_text())
    assert results["processes"] == 2 and len(results["per_prompt"]) == 2
    assert results["identical_to_baseline"] == "2/2"  # greedy: token for token the target's own
    assert (tmp_path / "exports/llama-3.3-70b-eagle3/config.json").is_file()


def test_the_70b_recipes_cache_with_a_spread_target():
    """A 70B target fits no single 80 GB GPU: every 70B recipe that caches launches the cache on 2 processes,
    each with the target spread over its 4 GPUs, as the page does; the page names every large family."""
    for path in sorted((REPO / "recipes" / "llama-3.3-70b").glob("*.yaml")):
        text = path.read_text()
        caches = re.findall(r"^#\s+(.*specheads cache .*)$", text, re.M)
        if path.stem == "medusa2":  # LoRA on the target: nothing to cache
            assert not caches
            continue
        assert caches == [
            "accelerate launch --config_file recipes/accelerate/ddp.yaml --num_processes 2 -m specheads cache "
            f"recipes/llama-3.3-70b/{path.name} --device-map auto --out cache/llama-3.3-70b-{path.stem}"
        ]
    page = PAGE.read_text()
    for family in ("llama-3.3-70b", "llama-3.1-8b", "qwen2.5-7b", "qwen3-8b", "mistral-7b"):
        assert f"`{family}`" in page
