"""What one evaluation or comparison does, as typed options: `specheads eval`'s and `specheads compare`'s
flags, one field each, with the flags' defaults. The commands (cli/eval.py, cli/compare.py) only parse
argv into these; the library runs them:

    evaluate.run.run_eval(EvalOptions(target=..., ...), methods())            -> results.json's dict
    evaluate.compare.compare_heads(CompareOptions(target=..., ...), methods())  -> results.json's dict

(`methods()`: the method table, `specheads.methods.methods`.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class EvalOptions:
    """`specheads eval`: one heads checkpoint against the target's own generate() (evaluate/run.py)."""

    target: str  # HF directory, hub id, or a named target ("tiny", "smollm2")
    heads: str  # native head checkpoint directory (its config.json names the method)
    prompts: str  # mt-bench, spec-bench, a .jsonl of such questions, heldout, or a .json file list
    out: Path  # the folder for results.json and report.md
    overwrite: bool = False  # replace the results `out` holds (refused without it)
    allow_target_mismatch: bool = False  # heads whose recorded target weights differ: a warning
    resume: bool = False  # go on from the prompts a stopped run kept in out/progress.jsonl
    num_prompts: int | None = None  # the first N prompts (None: all)
    category: str | None = None  # only questions of this category
    no_chat_template: bool = False  # questions as raw text, not chat turns
    chat_template: str | None = None  # a .jinja file (or the text) replacing the target's template
    enable_thinking: bool | None = None  # a thinking model's template switch (None: its default)
    prompt_tokens: int = 64  # tokens taken from the start of each held-out file
    max_new_tokens: int = 128
    tree: str | None = None  # a tree name, or auto (calibrated); None: the method's default
    calibration_prompts: int | None = None  # --tree auto: the last K prompts calibrate, not evaluated
    recalibrate: bool = False  # --tree auto: measure afresh, not take an earlier run's choice on this machine
    draft_vocab: int | None = None  # EAGLE-1/2 and Medusa heads propose from their N most frequent labels
    temperature: float = 0.0  # 0: greedy; > 0: both sides sample
    top_k: int = 0  # sampling: the k most likely tokens (0: all)
    top_p: float = 1.0  # sampling: nucleus mass kept
    seed: int = 0  # sampling: prompt (or batch) i is sampled with seed + i
    warmup: int = 1  # untimed prompts decoded first
    batch_size: int = 1  # decode B prompts at a time against the target's batched generate
    dtype: str = "float32"
    device: str = "cpu"
    attn: str = (
        "auto"  # the target's attention implementation; auto: sdpa, or eager where transformers refuses it
    )
    trust_remote_code: bool = False  # run the modelling code a custom architecture ships
    threads: int | None = None  # CPU threads for torch (None: torch's own)
    no_progress: bool = False
    device_map: str | None = None  # "auto": the target spread over the GPUs (each process's share)

    def __post_init__(self) -> None:
        self.out = Path(self.out)
        self.target, self.heads, self.prompts = str(self.target), str(self.heads), str(self.prompts)


@dataclass
class CompareOptions:
    """`specheads compare`: heads beside generate() and the peers (evaluate/compare.py)."""

    target: str  # HF directory, hub id, or a named target ("tiny", "smollm2")
    prompts: str  # mt-bench, spec-bench, a .jsonl of such questions, heldout, or a .json file list
    out: Path  # the folder for results, report, plots and answers
    heads: list[str] = field(default_factory=list)  # native head checkpoints (any methods, any number)
    overwrite: bool = False  # replace the results `out` holds (refused without it)
    peers: str | None = None  # comma-separated PEERS; None: generate,prompt-lookup (+assisted with a draft)
    draft_model: str | None = None  # the assistant's HF directory (same tokenizer)
    num_prompts: int | None = None
    category: str | None = None
    max_turns: int | None = None
    skip_long: bool = False
    no_chat_template: bool = False
    chat_template: str | None = None  # a .jinja file (or the text) replacing the target's template
    enable_thinking: bool | None = None  # a thinking model's template switch (None: its default)
    prompt_tokens: int = 64  # tokens taken from the start of each held-out file
    max_new_tokens: int = 128  # per turn
    tree: list[str] | None = None  # one name for every heads directory, or one each; auto: calibrated
    calibration_prompts: int | None = None  # --tree auto: the last K prompts calibrate, not compared
    recalibrate: bool = False  # --tree auto: measure afresh, not take an earlier run's choice on this machine
    draft_vocab: int | None = None  # EAGLE-1/2 and Medusa heads propose from their N most frequent labels
    prompt_lookup_tokens: int = 10
    prompt_lookup_ngram: int | None = None
    assistant_tokens: int = 20  # transformers' default
    assistant_confidence: float = 0.4  # transformers' default; 0: never stop a draft early
    warmup: int = 1  # untimed prompts every method decodes first
    dtype: str = "float32"
    device: str = "cpu"
    attn: str = "auto"
    trust_remote_code: bool = False  # run the modelling code a custom architecture ships
    threads: int | None = None  # CPU threads for torch (None: torch's own)
    no_plots: bool = False
    no_progress: bool = False
    allow_target_mismatch: bool = False  # heads trained against other weights of the same shapes: a warning
    resume: bool = False  # go on from the conversations a stopped run kept in out/progress.jsonl
    device_map: str | None = None  # "auto": the target spread over the GPUs (each process's share)

    def __post_init__(self) -> None:
        self.out = Path(self.out)
        self.target, self.prompts = str(self.target), str(self.prompts)
        self.heads = [str(h) for h in self.heads]
