"""benchmarks/bf16_divergence.py on a made-up compare run: it finds the first token where a method's answer
parts from generate()'s, and the two tokens' logit gap there in the target's own fp32 forward; an answer
identical to generate()'s gives no row."""

import json

import pytest
import torch

from benchmarks import bf16_divergence
from specheads.core.target import FrozenTarget
from specheads.evaluate.prompts import encode_prompts, read_prompts

from helpers import save_tiny_target

pytestmark = pytest.mark.usefixtures("one_thread")  # as every evaluation test


def answer(question_id, text):
    return json.dumps({"question_id": question_id, "choices": [{"index": 0, "turns": [text]}]}) + "\n"


def test_divergence_is_found_with_its_logit_gap(tmp_path, capsys):
    target_dir = save_tiny_target("llama", tmp_path / "target")
    questions = tmp_path / "questions.jsonl"
    questions.write_text(json.dumps({"question_id": 7, "category": "x", "turns": ["def add(a, b):"]}) + "\n")
    target = FrozenTarget.from_pretrained(str(target_dir))
    tokenizer = target.tokenizer
    texts = read_prompts(str(questions), str(target_dir))
    [prompt], _ = encode_prompts(texts, tokenizer, use_chat_template=True, prompt_tokens=64)
    base_text, other_text = "    return a + b\n", "    return a - b\n"
    a = tokenizer(base_text, add_special_tokens=False)["input_ids"]
    b = tokenizer(other_text, add_special_tokens=False)["input_ids"]
    i = next(k for k in range(len(a)) if a[k] != b[k])
    with torch.no_grad():
        prefix = torch.cat([prompt.input_ids.view(1, -1), torch.tensor([a[:i]])], dim=1)
        logits = target.model(prefix).logits[0, -1]
    (tmp_path / "run" / "answers").mkdir(parents=True)
    (tmp_path / "run" / "answers" / "generate.jsonl").write_text(answer(7, base_text))
    (tmp_path / "run" / "answers" / "eagle.jsonl").write_text(answer(7, other_text))
    (tmp_path / "run" / "answers" / "medusa.jsonl").write_text(answer(7, base_text))  # identical: no row

    argv = ["--run", str(tmp_path / "run"), "--target", str(target_dir), "--prompts", str(questions)]
    bf16_divergence.main(argv)
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| eagle")]
    assert len(rows) == 1 and "medusa" not in capsys.readouterr().out
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert cells[:5] == ["eagle", "7", str(i), str(a[i]), str(b[i])]
    assert float(cells[5]) == round(float(logits[a[i]] - logits[b[i]]), 4)
