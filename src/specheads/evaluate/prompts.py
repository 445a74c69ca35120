"""Evaluation prompts: read from MT-Bench / Spec-Bench question files or held-out file lists, encoded
with the target's tokenizer (and chat template), and checked against its context length.

    *.jsonl      MT-Bench / Spec-Bench questions ({"question_id", "category", "turns": [...]}): the
                 first turn, rendered with the target's chat template when it has one.
    heldout      the target directory's heldout_files.json (written by `specheads tiny-target`): the
                 first prompt_tokens tokens of each listed file, as raw text.
    *.json       any file list in that same format ({"stdlib": root, "files": [paths under root]}).
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from specheads.core.confined import confined
from specheads.core.question_sets import prompt_set_path, read_questions
from specheads.data.chat_masks import read_chat_template, set_chat_template

# Written beside the embedded target by `specheads tiny-target` (builders/tiny_target.py); decode/
# does not import train/, so the name is repeated here.
HELDOUT_FILE = "heldout_files.json"
logger = logging.getLogger(__name__)


@dataclass
class PromptText:
    """One prompt before tokenization.

    chat: the text is a user turn, rendered with the chat template; False: raw text, cut to the
        first `--prompt-tokens` tokens when it is a whole file.
    """

    id: str
    category: str | None
    text: str
    chat: bool


@dataclass
class Prompt:
    id: str
    category: str | None
    input_ids: torch.Tensor  # (1, T)


def read_prompts(
    source: str, target_dir: str, category: str | None = None, num_prompts: int | None = None
) -> list[PromptText]:
    """The prompts named by `--prompts`, filtered by category and cut to `num_prompts`.

    Raises:
        FileNotFoundError: the prompts file (or a listed file) does not exist.
        ValueError: an unknown format, a malformed or empty file, or no prompt left after filtering.
    """
    if source == "heldout":
        path = Path(target_dir) / HELDOUT_FILE
        if not path.is_file():
            raise FileNotFoundError(
                f"--prompts heldout reads {path}, which does not exist (only `specheads tiny-target` "
                f"writes one); give a .jsonl of questions instead"
            )
    else:
        path = Path(prompt_set_path(source))  # `mt-bench` / `spec-bench` by name, as compare takes them
        if not path.is_file():
            raise FileNotFoundError(f"prompts file {source!r} does not exist")
    if path.suffix == ".jsonl":
        prompts = _questions(path)
    elif path.suffix == ".json":  # the target folder's own list may name nothing outside it
        prompts = _file_list(path, confine=source == "heldout")
    else:
        raise ValueError(
            f"prompts file {source!r} has an unknown format: expected a .jsonl of MT-Bench / Spec-Bench "
            f"questions, a .json file list like {HELDOUT_FILE}, `heldout`, `mt-bench` or `spec-bench`"
        )
    if not prompts:
        raise ValueError(f"prompts file {path} holds no prompts")
    if category is not None:
        known = sorted({p.category for p in prompts if p.category is not None})
        prompts = [p for p in prompts if p.category == category]
        if not prompts:
            raise ValueError(f"no prompt in {path} has category {category!r}; categories there: {known}")
    return prompts[:num_prompts]


def _questions(path: Path) -> list[PromptText]:
    """MT-Bench / Spec-Bench questions (checked by core/question_sets.read_questions): the first turn of
    each."""
    if not path.read_bytes().strip():
        return []  # read_prompts says the file holds no prompts
    return [
        PromptText(str(q["question_id"]), q["category"], q["turns"][0], chat=True)
        for q in read_questions(path)
    ]


def _file_list(path: Path, confine: bool = False) -> list[PromptText]:
    """A held-out file list, {"root": folder, "files": [paths relative to it]}: each file's text.

    A relative root is taken from the list's own folder (a tiny target's `heldout/`); "stdlib" is the
    older name of "root". `confine`: the list is a target folder's, whose root and files must stay inside
    that folder (core/confined.py)."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        key = "root" if "root" in record else "stdlib"
        root = path.parent / record.get(key, ".")
        files = record["files"]
        if confine:
            root = confined(path.parent, record.get(key, "."), path, f'"{key}"')
            for name in files:
                confined(path.parent, Path(record.get(key, ".")) / name, path, f'"files" entry {name!r}')
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(
            f'{path}: expected a file list like {{"root": "heldout", "files": ["a.py"]}} ({e!r})'
        ) from e
    prompts = []
    for name in files:
        file = root / name
        if not file.is_file():
            raise FileNotFoundError(f"{path} lists {name!r}, but {file} does not exist")
        text = file.read_text(encoding="utf-8", errors="replace")
        if text.strip():  # an empty module (a bare __init__.py) is no prompt
            prompts.append(PromptText(str(name), None, text, chat=False))
    return prompts


def read_template(options) -> str:
    """The template text of `options.chat_template` (EvalOptions, CompareOptions), read before the target
    loads so that a wrong path fails at once; "" when it names none."""
    return read_chat_template(options.chat_template) if options.chat_template else ""


def apply_chat_options(tokenizer, template: str, options) -> None:
    """Give the target's tokenizer the template `read_template` read and `options.enable_thinking`."""
    if tokenizer is not None:
        set_chat_template(tokenizer, template, options.enable_thinking)


def chat_template_record(tokenizer, options) -> dict:
    """What rendered the chat prompts, for results.json and a resume's settings: the --chat-template file
    (None: the target's own template), enable_thinking, and the sha256 of the template text."""
    template = getattr(tokenizer, "chat_template", None)
    return {
        "chat_template_file": options.chat_template,
        "enable_thinking": options.enable_thinking,
        "chat_template_sha256": hashlib.sha256(template.encode()).hexdigest() if template else None,
    }


def note_raw_questions(tokenizer, use_chat_template: bool, questions: bool) -> None:
    """Say so when questions go to the target as raw text because it has no chat template (a base model)."""
    if use_chat_template and questions and getattr(tokenizer, "chat_template", None) is None:
        logger.warning(
            "the target has no chat template (a base model): the questions go to it as raw text; "
            "--chat-template FILE renders them as chat turns"
        )


def encode_prompts(
    texts: list[PromptText], tokenizer, use_chat_template: bool, prompt_tokens: int
) -> tuple[list[Prompt], bool]:
    """Tokenize; returns the prompts and whether the chat template was used for any of them.

    A user turn goes through `apply_chat_template(..., add_generation_prompt=True)` when the tokenizer
    has a template and `use_chat_template`; otherwise it is tokenized as raw text. Whole files are cut
    to their first `prompt_tokens` tokens.
    """
    templated = use_chat_template and getattr(tokenizer, "chat_template", None) is not None
    templated = templated and any(p.chat for p in texts)
    note_raw_questions(tokenizer, use_chat_template, any(p.chat for p in texts))
    prompts = []
    for p in texts:
        if p.chat and templated:
            messages = [{"role": "user", "content": p.text}]
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]  # the template has its BOS
        else:
            ids = tokenizer(p.text)["input_ids"]
            ids = ids if p.chat else ids[:prompt_tokens]
        prompts.append(Prompt(p.id, p.category, torch.tensor([ids], dtype=torch.long)))
    return prompts, templated


def check_prompt_lengths(prompts: list[Prompt], config, max_new_tokens: int, tree_depth: int) -> None:
    """Raise if a prompt plus its output (and the draft tree past it) outruns the target's positions."""
    limit = getattr(config, "max_position_embeddings", None)
    for p in prompts:
        if p.input_ids.shape[1] == 0:
            raise ValueError(f"prompt {p.id!r} is empty after tokenization")
        needed = p.input_ids.shape[1] + max_new_tokens + tree_depth
        if limit is not None and needed > limit:
            raise ValueError(
                f"prompt {p.id!r} is {p.input_ids.shape[1]} tokens; with --max-new-tokens {max_new_tokens} "
                f"and a tree {tree_depth} deep it needs {needed} positions, but the target has "
                f"max_position_embeddings={limit}"
            )
