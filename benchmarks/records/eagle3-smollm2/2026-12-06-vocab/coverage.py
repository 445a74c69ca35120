"""How much of the target's own MT-Bench output a draft vocabulary of each size holds: the SmolLM2 EAGLE-3 recipe's
vocabulary is the 8,192 most frequent label tokens of its training rows (heads/eagle3.py draft_vocab_from_counts;
unseen tokens fill the rest in id order), and a token outside it can never be drafted.

    python benchmarks/records/eagle3-smollm2/2026-12-06-vocab/coverage.py HEADS PROMPTS OUT.json [ANSWERS.json]

Run from the repository root. HEADS: a head folder trained by the recipe (its label_counts.safetensors are the
training rows' label counts, whatever its own vocabulary). PROMPTS: the 80 MT-Bench first turns as `specheads eval`
reads them. The target's greedy answers (64 new tokens, the eval's) are generated once and kept in ANSWERS.json
(default: beside OUT), which later runs read instead of generating again.
"""

import json
import sys
from collections import defaultdict
from pathlib import Path

import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repository root, for `benchmarks`
from benchmarks.records import write_json
from specheads.builders.named_targets import resolve_target
from specheads.core.target import FrozenTarget
from specheads.decode.baseline import generate_rows
from specheads.evaluate.prompts import encode_prompts, read_prompts
from specheads.heads.eagle3 import draft_vocab_from_counts, vocab_maps

SIZES = (4096, 8192, 12288, 16384, 24576, 32768)
heads, prompts_file, out = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
answers_file = Path(sys.argv[4]) if len(sys.argv) > 4 else out.with_name("mt80_greedy.json")
if answers_file.exists():
    answers = json.loads(answers_file.read_text())
else:
    torch.set_num_threads(1)
    target = FrozenTarget.from_pretrained(resolve_target("smollm2"), dtype="float32")
    prompts, _ = encode_prompts(read_prompts(prompts_file, "", num_prompts=80), target.tokenizer, True, 64)
    answers = [
        {"id": p.id, "category": p.category, "tokens": generate_rows(target, p.input_ids, 64)[0]}
        for p in prompts
    ]
    answers_file.write_text(json.dumps(answers))
counts = load_file(str(heads / "label_counts.safetensors"))["counts"]
by_category = defaultdict(list)
for a in answers:
    by_category[a["category"]] += a["tokens"]
by_category = {c: torch.tensor(t) for c, t in by_category.items()}
tokens = torch.tensor([t for a in answers for t in a["tokens"]])
result = {"answer_tokens": len(tokens), "label_tokens": int(counts.sum()), "distinct_labels": int((counts > 0).sum()),
          "answers_in_labels": float((counts[tokens] > 0).float().mean()), "sizes": {}}  # fmt: skip
for size in SIZES:
    _, inside = vocab_maps(draft_vocab_from_counts(counts, size), counts.numel())  # t2d: the mask
    result["sizes"][size] = {
        "answers": float(inside[tokens].float().mean()),
        "labels": float(counts[inside].sum() / counts.sum()),
        "by_category": {c: round(float(inside[t].float().mean()), 4) for c, t in by_category.items()},
    }
write_json(out, result)
print(json.dumps({k: v for k, v in result.items() if k != "sizes"}))
for size, r in result["sizes"].items():
    print(size, f"answers {r['answers']:.4f} labels {r['labels']:.4f}", r["by_category"])
