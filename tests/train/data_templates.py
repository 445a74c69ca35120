"""Chat-template families on the tiny byte-level tokenizer, for the data-pipeline tests.

Each family's template (chat_templates/*.jinja) follows the structure of the public original; its
control tokens are added to the tokenizer as special tokens, as the real tokenizers have them.
"""

from __future__ import annotations

from pathlib import Path

from helpers import tiny_tokenizer

TEMPLATES = Path(__file__).parent / "chat_templates"
# family -> (template file, special tokens, bos, eos); "tiny" is the embedded target's own template.
FAMILIES = {
    "llama3": (
        "llama3.jinja",
        ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
        "<|begin_of_text|>",
        "<|eot_id|>",
    ),
    "chatml": ("chatml.jinja", ["<|im_start|>", "<|im_end|>"], None, "<|im_end|>"),
    "mistral": ("mistral.jinja", ["<s>", "</s>", "[INST]", "[/INST]"], "<s>", "</s>"),
    "tiny": (None, [], None, None),
}


def family_tokenizer(family: str):
    """The tiny byte-level tokenizer dressed as `family` (special tokens, BOS/EOS, chat template)."""
    template, specials, bos, eos = FAMILIES[family]
    tok = tiny_tokenizer()
    if template is None:
        return tok
    tok.add_tokens(specials, special_tokens=True)
    tok.bos_token = bos
    tok.eos_token = eos
    tok.chat_template = (TEMPLATES / template).read_text()
    return tok


def qwen3_tokenizer():
    """The tiny byte-level tokenizer with Qwen3's own chat template (chat_templates/qwen3.jinja, verbatim
    after its one-line source note) and Qwen3's control tokens: <|im_start|> and <|im_end|> special,
    <think> and </think> added tokens that are not special, as Qwen3's tokenizer has them."""
    tok = tiny_tokenizer()
    tok.add_tokens(["<|im_start|>", "<|im_end|>"], special_tokens=True)
    tok.add_tokens(["<think>", "</think>"])
    tok.eos_token = "<|im_end|>"
    note, template = (TEMPLATES / "qwen3.jinja").read_text().split("\n", 1)
    assert note.startswith("{#-") and note.endswith("-#}")
    tok.chat_template = template
    return tok
