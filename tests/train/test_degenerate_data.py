"""Data that reads and still cannot train stops the run with the numbers, through the CLI."""

import json
import sys
from pathlib import Path

import pytest

from specheads.cli import main as cli_main

pytestmark = pytest.mark.usefixtures("one_thread")
REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "tiny" / "medusa.yaml"


def console(monkeypatch, capsys, *argv) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", ["specheads", *map(str, argv)])
    capsys.readouterr()
    code = cli_main()
    err = [line for line in capsys.readouterr().err.splitlines() if "error: " in line]
    return code, err[-1] if err else ""


def train_argv(target, data, out, *extra) -> list[str]:
    return [
        "train", RECIPE, f"target={target}", f"data={data}", f"output_dir={out}", "max_length=64",
        "batch_size=4", "num_heads=2", "labels=data", "loss_on=assistant", "eval_data=[]", "eval_every=1000", "max_steps=2",
        "report_to=none", *extra, "--no-progress",
    ]  # fmt: skip


def chats(answer: str, n: int = 24) -> list[dict]:
    return [
        {
            "messages": [
                {"role": "user", "content": f"question {i}?"},
                {"role": "assistant", "content": answer},
            ]
        }
        for i in range(n)
    ]


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_empty_assistant_turns_stop_the_run_with_the_numbers(monkeypatch, capsys, tiny_target_dirs, tmp_path):
    data = write_jsonl(tmp_path / "empty.jsonl", chats(""))
    out = tmp_path / "o"
    code, line = console(monkeypatch, capsys, *train_argv(tiny_target_dirs["llama"], data, out))
    assert (
        code == 1
        and "23 label tokens in 23 rows (1.0 a row" in line
        and "min_label_tokens=16" in line
        and "min_label_tokens_per_row=3 a row" in line
    ), line
    assert "are the assistant turns empty?" in line
    assert not (out / "model.safetensors").exists()
    # the same rows with real answers train, and the floors can be lowered for data meant to be small
    answers = write_jsonl(tmp_path / "answers.jsonl", chats("an answer of a good many words " * 3))
    assert (
        console(monkeypatch, capsys, *train_argv(tiny_target_dirs["llama"], answers, tmp_path / "a"))[0] == 0
    )
    small = ("min_label_tokens=1", "min_label_tokens_per_row=0")
    assert (
        console(monkeypatch, capsys, *train_argv(tiny_target_dirs["llama"], data, tmp_path / "s", *small))[0]
        == 0
    )


def test_a_half_finished_distill_folder_is_refused_as_data(monkeypatch, capsys, tiny_target_dirs, tmp_path):
    source = write_jsonl(tmp_path / "chats.jsonl", chats("hello there", n=8))
    sd = tmp_path / "sd"
    distill = ["distill", "--source", source, "--target", tiny_target_dirs["llama"], "--out", sd]
    distill += ["--max-new-tokens", "4", "--batch-size", "2", "--chunk-rows", "4", "--no-progress"]
    assert console(monkeypatch, capsys, *distill)[0] == 0
    parts = sorted(sd.glob("part-*.jsonl"))
    assert len(parts) == 2
    out = tmp_path / "o"
    # killed after its first chunk: the second part and the summary are not there yet
    summary = json.loads((sd / "_summary.json").read_text())
    (sd / "_summary.json").unlink()
    parts[1].unlink()
    (sd / "_chunks" / "00001.json").unlink()
    code, line = console(monkeypatch, capsys, *train_argv(tiny_target_dirs["llama"], sd, out))
    assert code == 1 and "unfinished `specheads distill` output (no _summary.json)" in line, line
    assert f"--out {sd}` again, it resumes" in line
    # a summary whose counts the parts do not add up to
    (sd / "_summary.json").write_text(json.dumps(summary))
    code, line = console(monkeypatch, capsys, *train_argv(tiny_target_dirs["llama"], sd, out))
    assert code == 1 and f"parts hold 4 rows, its summary counts {summary['output_rows']}" in line, line
    # resumed, it is data (every answer here is cut off at 4 tokens: "capped", kept by include_capped)
    assert console(monkeypatch, capsys, *distill)[0] == 0
    capped = "include_capped=true"
    assert (
        console(
            monkeypatch, capsys, *train_argv(tiny_target_dirs["llama"], sd, out, "min_label_tokens=1", capped)
        )[0]
        == 0
    )
