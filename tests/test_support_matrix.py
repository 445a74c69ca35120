"""The support matrix (tests/support_matrix.py, docs/support-matrix.md): for every model family x method, on a
tiny random model of the family built offline from its config, the heads train online with the target frozen
(its routers too), train offline from a hidden-state cache as online, decode greedily as the target's
generate(), and export to every format the method has and import back bit for bit. Slow: sampled decoding
passes the chi-square test on each family, and each export loads in its consumer's own code.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from support_matrix import COMMON, FAMILIES, METHODS, SLOW, WINDOW, consumer_cases, markdown

from specheads.cli import main as cli_main
from specheads.core.target import FrozenTarget
from specheads.decode import MedusaDrafter, SpeculativeDecoder, StaticTree, default_tree
from specheads.decode.eagle_drafter import EagleDrafter
from specheads.heads import (
    Eagle3Config,
    Eagle3Head,
    EagleConfig,
    EagleHead,
    llama_layer_config_from,
    load_heads,
    save_heads,
)
from specheads.methods import methods

from helpers import tiny_tokenizer

for _folder in ("decode", "consumers"):  # the decoder and consumer tests' helpers, imported by name
    sys.path.insert(0, str(Path(__file__).parent / _folder))

from test_batched import Inject, continuation  # noqa: E402
from test_sampling_decoder import SETTINGS, PrefixSampler, chi_square_p_value, exact_joint  # noqa: E402
from test_sampling_decoder import VOCAB as SAMPLING_VOCAB  # noqa: E402
from test_sampling_decoder import medusa as sampling_medusa  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CELLS = [(family, method) for family in FAMILIES for method in METHODS]
IDS = [f"{family}-{method}" for family, method in CELLS]
EXPORTS = [(family, fmt) for family in FAMILIES for formats in METHODS.values() for fmt in formats]
FORMAT_METHOD = {fmt: method for method, formats in METHODS.items() for fmt in formats}
STEPS = 6

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_config(family: str, **overrides):
    from transformers import AutoConfig

    fam = FAMILIES[family]
    return AutoConfig.for_model(fam.model_type, **{**COMMON, **fam.overrides, **overrides})


def tiny_model(family: str, seed: int = 0, **overrides):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = tiny_config(family, **overrides)
    attention = FAMILIES[family].attention
    return AutoModelForCausalLM.from_config(config, attn_implementation=attention, dtype=torch.float32).eval()


# -- fixtures: the families' HF directories, the data, the runs -------------------------------------------


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    made, root = {}, tmp_path_factory.mktemp("families")

    def get(family: str) -> Path:
        if family not in made:
            tokenizer = tiny_tokenizer()
            model = tiny_model(family, vocab_size=len(tokenizer))
            model.save_pretrained(root / family)
            tokenizer.save_pretrained(root / family)
            made[family] = root / family
        return made[family]

    return get


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """Cyclic text: every byte determines the next ones."""
    path = tmp_path_factory.mktemp("data") / "cycles.jsonl"
    words = ["abcdefghij", "0123456789", "klmnopqrst", "uvwxyz!?.,"]
    rows = [{"text": (words[i % 4] * 8)[i % 7 :]} for i in range(48)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def recipe_args(method: str, target: Path, data: Path) -> list[str]:
    per_method = {
        "medusa": ["medusa.num_heads=3"],
        "eagle": ["eagle.fc_bias=false"],  # the engines' layout: their EAGLE layer has no fc bias
        "eagle3": ["eagle3.ttt_steps=2", "eagle3.draft_vocab_size=128"],
    }
    return [
        str(REPO / "recipes" / "tiny" / f"{method}.yaml"),
        f"target={target}",
        f"data={data}",
        "max_length=48",
        "batch_size=4",
        "lr=0.01",
        "optimizer=adamw",
        "warmup_steps=1",
        f"max_steps={STEPS}",
        "eval_fraction=0.1",
        "eval_data=[]",
        f"eval_every={STEPS}",
        "eval_batches=1",
        "log_every=1",
        "report_to=none",
        *per_method[method],
    ]


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


class Watched:
    """Wraps load_target (train/prepare.py) where train.loop calls it: keeps the target each run loads and a
    copy of its state as loaded."""

    def __init__(self, real):
        self.real, self.loaded = real, []

    def __call__(self, *args, **kwargs):
        target = self.real(*args, **kwargs)
        state = {k: v.detach().clone() for k, v in target.model.state_dict().items()}
        self.loaded.append((target, state))
        return target


@pytest.fixture(scope="module")
def online(target_dir, data, tmp_path_factory):
    """(family, method) -> (run folder, the target the run trained against, its state as loaded)."""
    from specheads.train import loop, prepare

    runs, root = {}, tmp_path_factory.mktemp("online")

    def get(family: str, method: str):
        if (family, method) not in runs:
            out = root / f"{family}-{method}"
            watched = Watched(prepare.load_target)
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(loop, "load_target", watched)
                args = [*recipe_args(method, target_dir(family), data), f"output_dir={out}"]
                assert cli_main(["train", *args, "--no-progress"]) == 0
            ((target, state),) = watched.loaded
            runs[family, method] = (out, target, state)
        return runs[family, method]

    return get


# -- the fast cells ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("family, method", CELLS, ids=IDS)
def test_trains_online(online, family, method):
    out, target, loaded = online(family, method)
    train = [m for m in metrics(out) if m["split"] == "train"]
    assert [m["step"] for m in train] == list(range(1, STEPS + 1))
    assert train[-1]["loss"] < train[0]["loss"], [m["loss"] for m in train]
    # the target stayed frozen: every parameter and buffer as loaded, none trainable, in eval mode
    assert target.attn_implementation == FAMILIES[family].attention
    assert not [n for n, p in target.model.named_parameters() if p.requires_grad]
    assert not [n for n, m in target.model.named_modules() if m.training]
    state = target.model.state_dict()
    assert state.keys() == loaded.keys()
    changed = [k for k in state if not torch.equal(state[k], loaded[k])]
    assert not changed, changed
    routers = [k for k in state if ".mlp.gate." in k or ".router." in k]
    assert bool(routers) == FAMILIES[family].moe, routers  # the MoE routers are among what stayed
    recorded = json.loads((out / "config.json").read_text())["head_config"]
    if method != "medusa":
        assert recorded["draft_arch"] == "llama" and recorded["layer_config"]["model_type"] == "llama"


@pytest.mark.parametrize("family, method", CELLS, ids=IDS)
def test_trains_offline(online, target_dir, data, tmp_path, family, method):
    args = [*recipe_args(method, target_dir(family), data), "max_steps=2", "eval_every=2"]
    cache = tmp_path / "cache"
    assert cli_main(["cache", *args, "--out", str(cache), "--dtype", "float32", "--no-progress"]) == 0
    out = tmp_path / "offline"
    more = ["mode=offline", f"cache_dir={cache}", f"output_dir={out}"]
    assert cli_main(["train", *args, *more, "--no-progress"]) == 0
    offline = [m for m in metrics(out) if m["split"] == "train"]
    assert [m["step"] for m in offline] == [1, 2]
    first_online = metrics(online(family, method)[0])[0]
    assert first_online["step"] == 1
    for key, value in offline[0].items():  # the same batch, the same heads before any update
        if key == "loss" or key.endswith("top1"):
            assert value == pytest.approx(first_online[key], rel=1e-4, abs=1e-6), key


def drafter_of(method: str, heads, target: FrozenTarget):
    if method == "medusa":
        return MedusaDrafter(heads, default_tree("medusa-15", num_heads=heads.config.num_heads))
    if method == "eagle":
        return EagleDrafter(heads, target, default_tree("medusa-15"))
    return EagleDrafter(heads, target, top_k=4, depth=4, total_tokens=16)


def prompts() -> list[torch.Tensor]:
    """A prompt of the training text's bytes and random ones, all longer than the window."""
    random = [torch.randint(0, 256, (1, n), generator=torch.Generator().manual_seed(n)) for n in (11, 17)]
    return [torch.tensor([list(b"abcdefghijabcdef")]), *random]


@pytest.mark.parametrize("family, method", CELLS, ids=IDS)
def test_greedy_is_generate(online, family, method):
    out, target, _ = online(family, method)
    heads, _ = load_heads(out, target, methods=methods())
    heads = heads.eval()
    new = 3 * WINDOW
    for prompt in prompts():
        assert prompt.shape[1] > WINDOW
        got = SpeculativeDecoder(target, drafter_of(method, heads, target)).generate(prompt, new)
        reference = target.model.generate(prompt, max_new_tokens=new, do_sample=False)[:, prompt.shape[1] :]
        assert torch.equal(got.tokens, reference), prompt.tolist()
    # whole correct paths put on the trained drafts' trees: accepted across the window
    truths = {r: continuation(target.model, p, new + 8) for r, p in enumerate(prompts())}
    accepted = []
    for r, prompt in enumerate(prompts()):
        drafter = Inject(drafter_of(method, heads, target), truths, max_depth=3, row=r)
        got = SpeculativeDecoder(target, drafter).generate(prompt, new, eos_token_id=[])
        assert got.tokens[0].tolist() == truths[r][prompt.shape[1] :][:new], r
        accepted += got.accept_lengths
    assert max(accepted) >= 3  # whole drafted paths accepted


@pytest.mark.parametrize("family, fmt", EXPORTS, ids=[f"{f}-{x}" for f, x in EXPORTS])
def test_exports_import_back(online, target_dir, tmp_path, family, fmt):
    method = FORMAT_METHOD[fmt]
    out, target, _ = online(family, method)
    flags = ["--target", str(target_dir(family))] if fmt == "speculators" else []
    assert (
        cli_main(["export", "--heads", str(out), "--format", fmt, "--out", str(tmp_path / fmt), *flags]) == 0
    )
    args = ["import-heads", "--format", fmt, "--checkpoint", str(tmp_path / fmt)]
    assert cli_main([*args, "--target", str(target_dir(family)), "--out", str(tmp_path / "back")]) == 0
    heads, _ = load_heads(out, target, methods=methods())
    back, _ = load_heads(tmp_path / "back", target, methods=methods())
    assert type(back) is type(heads)
    assert heads.state_dict().keys() == back.state_dict().keys()
    for key, value in heads.state_dict().items():
        assert torch.equal(value, back.state_dict()[key]), key
    if method != "medusa":
        config = json.loads((tmp_path / fmt / "config.json").read_text())
        layer = config.get("transformer_layer_config", config)
        assert (layer["model_type"], layer["num_hidden_layers"]) == ("llama", 1)


# -- the table and the doc ----------------------------------------------------------------------------------


def test_the_table_is_the_method_tables_formats():
    table = methods()
    assert {m: table[m].export_formats for m in METHODS} == METHODS


def test_the_engines_stage_loads_every_family_of_the_table():
    """The vLLM / SGLang column claims CI's engines stage for every family: scripts/families.py, which that
    stage builds, must name the same families, each of the same transformers model_type."""
    from scripts import families

    assert {k: f.model_type for k, f in families.FAMILIES.items()} == {
        k: f.model_type for k, f in FAMILIES.items()
    }


def test_the_doc_is_the_table():
    doc = (REPO / "docs" / "support-matrix.md").read_text()
    assert doc == markdown(), (
        "docs/support-matrix.md is stale: python -m tests.support_matrix > docs/support-matrix.md"
    )
    written = subprocess.run(
        [sys.executable, "-m", "tests.support_matrix"], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert written.stdout == doc


# -- the slow cells: sampling in law, the consumers ----------------------------------------------------------


def sampling_target(family: str) -> FrozenTarget:
    """The family's tiny config with a 16-token vocabulary (the sampling tests' joint has 16³ cells), a
    window of 4 where it slides (under their 5-token prompt and 3 new tokens), its lm_head scaled up as
    theirs is (p peaked, not one-hot)."""
    window = {"sliding_window": 4} if "sliding_window" in FAMILIES[family].overrides else {}
    model = tiny_model(
        family, vocab_size=SAMPLING_VOCAB, bos_token_id=0, eos_token_id=1, pad_token_id=2, **window
    )
    with torch.no_grad():
        if model.config.tie_word_embeddings:  # SmolLM2: the final norm, not the embeddings with the head
            model.model.norm.weight.mul_(16)  # (x20 leaves a context 1e-6 from the top-p boundary)
        else:
            model.lm_head.weight.mul_(20)
    return FrozenTarget(model)


def sampling_drafter(method: str, target: FrozenTarget):
    """Medusa heads as the sampling tests make them; a random EAGLE / EAGLE-3 head with a Llama draft layer
    (EAGLE-3's lm_head and norm the target's, as training starts them), on a static tree as wide as the
    vocabulary at its first level: a random draft layer ranks the target's likely tokens low on some
    families, and children ranked by it alone are seldom accepted (the test needs drafts accepted)."""
    if method == "medusa":
        return sampling_medusa(target)
    torch.manual_seed(0)
    layer = llama_layer_config_from(target.config)
    if method == "eagle":
        return EagleDrafter(EagleHead(EagleConfig(layer, draft_arch="llama")).eval(), target, SAMPLING_TREE)
    config = Eagle3Config(layer, draft_arch="llama", draft_vocab_size=SAMPLING_VOCAB, target_layers=(1, 2, 3))
    head = Eagle3Head(config).init_from_target(target.lm_head, target.norm).eval()
    return EagleDrafter(head, target, SAMPLING_TREE)


SAMPLING_TREE = StaticTree.from_choices(
    [(r,) for r in range(SAMPLING_VOCAB)] + [(r, 0) for r in range(4)] + [(0, 1), (0, 0, 0), (1, 0, 0)]
)


@pytest.mark.slow
@pytest.mark.parametrize("family, method", CELLS, ids=IDS)
def test_sampling_follows_the_target(family, method):
    target = sampling_target(family)
    params = SETTINGS["t0.8-k6-p0.8"]
    sampler = PrefixSampler(SpeculativeDecoder(target, sampling_drafter(method, target)), params)
    generator = torch.Generator().manual_seed(0)
    counts = Counter(sampler.sample(generator) for _ in range(6000))
    p_value = chi_square_p_value(counts, exact_joint(target, params))
    accepted = sum(n > 1 for n in sampler.accept_lengths) / len(sampler.accept_lengths)
    assert accepted > 0.1, f"drafted tokens were accepted in only {accepted:.0%} of steps"
    assert p_value > 1e-3, p_value


CONSUMED = consumer_cases()


@pytest.fixture(scope="module")
def consumed(target_dir, tmp_path_factory) -> dict:
    """(family, format) -> (what the consumer computed, what our heads computed): one consumer run."""
    from test_consumers import T, eagle3_case, eagle_case, medusa_case

    from consumer_env import build, env_dir, run_consumers

    env = env_dir()
    if not (env / "PINS").is_file():
        build(env)
    tokens = torch.randint(0, 256, (1, T + 1), generator=torch.Generator().manual_seed(3))
    cases = {
        "medusa": ("medusa", medusa_case),
        "eagle": ("eagle", lambda t, x: eagle_case(t, x, fc_bias=False, draft_arch="llama")),
        "eagle3": ("speculators-converter", lambda t, x: eagle3_case(t, x, draft_arch="llama")),
        "speculators": ("speculators", lambda t, x: eagle3_case(t, x, draft_arch="llama")),
    }
    root = tmp_path_factory.mktemp("consumers")
    jobs, expected = [], {}
    for family, fmt in CONSUMED:
        kind, case = cases[fmt]
        family_dir = target_dir(family)
        target = FrozenTarget.from_pretrained(str(family_dir), dtype="float32")
        heads, inputs, expected[family, fmt] = case(target, tokens)
        work = root / f"{family}-{fmt}"
        save_heads(heads, work / "native", target.record())
        flags = ["--target", str(family_dir)] if fmt == "speculators" else []
        args = ["export", "--heads", str(work / "native"), "--format", fmt, "--out", str(work / fmt)]
        assert cli_main([*args, *flags]) == 0
        torch.save(inputs, work / "inputs.pt")
        out = str(work / "out.pt")
        jobs.append(
            {
                "kind": kind,
                "export": str(work / fmt),
                "target": str(family_dir),
                "inputs": str(work / "inputs.pt"),
                "out": out,
            }
        )
    run_consumers(env, jobs, root)
    return {
        case: (job["kind"], torch.load(job["out"], weights_only=False), expected[case])
        for case, job in zip(CONSUMED, jobs, strict=True)
    }


@pytest.mark.slow
@pytest.mark.parametrize("family, fmt", CONSUMED, ids=[f"{f}-{x}" for f, x in CONSUMED])
def test_the_consumer_loads_the_export(consumed, family, fmt):
    """The consumer's own loader takes the export of a Llama draft (Medusa heads) over the family's target
    and computes what our heads compute (test_consumers.py's checks: every key used, outputs to fp32
    round-off)."""
    from test_consumers import CHECKS

    kind, got, expected = consumed[family, fmt]
    assert "error" not in got, got.get("error")
    diff = CHECKS[kind](got, expected)
    print(f"{family}-{fmt}: max |diff| {diff:.2e}")


def test_every_test_the_doc_names_is_one_of_this_module():
    """Each `function[params]` of docs/support-matrix.md is a parametrized test here, and each one here is in
    the doc."""
    import re

    here = sys.modules[__name__]
    tests = set()
    for name in dir(here):
        marks = getattr(getattr(here, name), "pytestmark", []) if name.startswith("test_") else []
        for mark in marks:
            if mark.name == "parametrize":
                tests |= {f"{name}[{i}]" for i in mark.kwargs["ids"]}
        if marks:  # the doc's "(slow)" is the mark
            assert ("slow" in [m.name for m in marks]) == (name in SLOW), name
    named = set(re.findall(r"`(test_\w+\[[^\]]+\])`", markdown()))
    assert named == tests, (sorted(named - tests), sorted(tests - named))
