"""A user's own model, brought as a plain HF directory and used the way docs/train-your-model.md says:
a base Gemma-3 (text) checkpoint whose layers mix sliding-window and full attention, with no chat
template of its own. `distill` answers the user's prompts through a template given with
`--chat-template`, `train` fits an EAGLE-3 head on those answers (its Llama draft layer, the default),
`export` writes what vLLM and SGLang load, and `eval` decodes prompts and answers longer than the window
with output identical to the target's own `generate()`."""

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from specheads.heads.formats.io import read_config

from helpers import MIXED_FAMILIES, MIXED_LAYERS, command, tiny_tokenizer

TEMPLATE = Path(__file__).parent / "train" / "chat_templates" / "chatml.jinja"
WINDOW = 8


def save_base_gemma3(path: Path) -> Path:
    """A tiny random Gemma-3 text model with sliding layers of WINDOW tokens, saved as a user would find it:
    config.json, safetensors weights and a tokenizer with no chat template."""
    from helpers import tiny_model

    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = None
    attn, family_overrides = MIXED_FAMILIES["gemma3_text"]
    model = tiny_model(
        "gemma3_text",
        attn_implementation=attn,
        vocab_size=len(tokenizer),
        sliding_window=WINDOW,
        layer_types=MIXED_LAYERS,
        **family_overrides,
    )
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    assert not (path / "chat_template.jinja").exists()
    return path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_base_gemma3_directory_distils_trains_exports_and_decodes_as_generate(tmp_path):
    target = save_base_gemma3(tmp_path / "my-gemma3")
    chats = write_jsonl(
        tmp_path / "my-chats.jsonl",
        [
            {"messages": [{"role": "user", "content": f"Write a function that sorts list number {i}."}]}
            for i in range(8)
        ],
    )

    # Without a template, a conversation cannot be rendered: the error names the setting that gives one.
    with pytest.raises(ValueError, match="--chat-template"):
        command("distill")(
            ["--source", str(chats), "--target", str(target), "--out", str(tmp_path / "refused")]
        )
    assert not (tmp_path / "refused").exists()

    data = tmp_path / "data" / "my-sd"
    command("distill")(
        [
            "--source",
            str(chats),
            "--target",
            str(target),
            "--chat-template",
            str(TEMPLATE),
            "--out",
            str(data),
        ]
        + ["--max-new-tokens", "24", "--no-progress"]
    )
    run = tmp_path / "runs" / "my-eagle3"
    command("train")(
        [
            "recipes/tiny/eagle3.yaml",
            f"target={target}",
            f"data=[{data}]",
            "eval_data=[]",
            "loss_on=assistant",
        ]
        + [
            f"chat_template={TEMPLATE}",
            "max_steps=3",
            "batch_size=2",
            "eval_every=3",
            "include_capped=true",
        ]
        + ["eagle3.draft_vocab_size=64", "report_to=none", f"output_dir={run}", "--threads", "1"]
    )
    head = read_config(run)
    assert head["method"] == "eagle3"
    assert (
        json.dumps(head).count('"draft_arch": "llama"') >= 1
    )  # the engines' draft layer, whatever the target's family

    exported = tmp_path / "exports" / "my-eagle3"
    command("export")(["--heads", str(run), "--format", "eagle3", "--out", str(exported)])
    config = json.loads((exported / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert any(k.startswith("midlayer.") for k in load_file(exported / "model.safetensors"))

    prompts = write_jsonl(
        tmp_path / "my-prompts.jsonl",
        [
            {
                "question_id": 1,
                "category": "coding",
                "turns": ["Write a function that merges two sorted lists."],
            },
            {
                "question_id": 2,
                "category": "coding",
                "turns": ["Explain what a sliding window of attention is."],
            },
        ],
    )
    out = tmp_path / "eval"
    command("eval")(
        [
            "--target",
            str(target),
            "--heads",
            str(run),
            "--prompts",
            str(prompts),
            "--chat-template",
            str(TEMPLATE),
        ]
        + ["--max-new-tokens", "40", "--out", str(out), "--threads", "1", "--no-progress"]
    )
    results = json.loads((out / "results.json").read_text())
    assert results["identical_to_baseline"] == "2/2"
    assert results["prompts"]["chat_template"] and results["prompts"]["chat_template_file"] == str(TEMPLATE)
    assert all(r["prompt_tokens"] > WINDOW and r["new_tokens"] > WINDOW for r in results["per_prompt"])
