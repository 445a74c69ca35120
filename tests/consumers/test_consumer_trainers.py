"""Checkpoints made by the consumers' OWN trainers, imported with `import-heads` and decoded.

trainer_run.py runs, in the consumer env, on a tiny random Llama target:
- eagle-llm 1.2.1: its data generator (eagle/ge_data/ge_data_all_vicuna.py) over a ShareGPT-format file,
  then its trainer (eagle/train/main.py, accelerate) for the 21 epochs it hard-codes; the last state
  accelerate saves (state_20/model.safetensors) with the --configpath config.json beside it, as the
  EAGLE releases pair them, is the checkpoint;
- medusa-llm 0.1: its trainer (medusa/train/train.py, HF Trainer) for a few steps; it writes
  config.json + medusa_lm_head.pt.
Their code runs unchanged; the shims (CUDA calls, transformers-5 API, hard-coded paths, wandb) are listed
with their reasons in trainer_run.py's docstring.

Then `specheads import-heads` reads each checkpoint, and:
- our heads compute what the consumer's own classes compute from the same files (eagle-llm's
  `cnets.Model` loaded strictly, as EaModel loads a release: features; medusa-llm's
  `MedusaModel.from_pretrained`: every head's logits), to fp32 round-off (TOL);
- our decoder with those heads is token-identical to the target's greedy generate() on a few prompts.
Each check fails on a checkpoint broken on purpose (a square weight transposed, a key renamed).

The target carries a Llama-style tokenizer (BOS added, `</s>` its EOS, `<unk>` its pad) over the tiny
byte vocabulary: both trainers tokenize Vicuna-template conversations and mask the loss by counting
tokens per turn as a Llama tokenizer does; with the tests' usual tokenizer (no BOS, no `</s>`) medusa's
preprocess finds a "tokenization mismatch" and masks every label.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from trainer_run import eagle_draft_config, finish_trainer, start_trainer

from specheads.core.target import FrozenTarget
from specheads.decode import EagleDrafter, MedusaDrafter, SpeculativeDecoder, default_tree
from specheads.heads.checkpoint import load_heads
from specheads.heads.formats import FormatError
from specheads.methods import methods

from helpers import causal_mask, command, max_diff

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]  # slow: CI's second stage

T = 12
TOL = 1e-5  # fp32, as test_consumers.py
CONVERSATIONS = 4  # ge_data's and the trainers' data: main.py's 95/5 split makes it 3 train files, 1 test
WORDS = "the a of and to in is it that was for on are with as his they be at one have this".split()


def llama_tokenizer():
    """The tiny byte vocabulary with Llama's conventions: BOS `<s>` added in front, EOS `</s>`, `<unk>`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    vocab.update({"<s>": 256, "</s>": 257, "<unk>": 258})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 256)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<unk>",
        model_max_length=512,  # as a Llama tokenizer_config states it (the target's max positions)
    )


def trainer_target(source: Path, out: Path) -> Path:
    """The tiny Llama target as their trainers read it: its weights and config, a Llama-style tokenizer,
    and a model.safetensors.index.json (main.py and cnets' load_emb find lm_head and embed_tokens only
    through an index)."""
    out.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "generation_config.json"):
        if (source / name).is_file():
            shutil.copy(source / name, out / name)
    llama_tokenizer().save_pretrained(out)
    names = load_file(str(out / "model.safetensors"))
    index = {"metadata": {}, "weight_map": {k: "model.safetensors" for k in sorted(names)}}
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    return out


# fastchat's "vicuna_v1.1" template (get_conversation_template("vicuna")), the one both trainers apply
VICUNA_SYSTEM = (
    "A chat between a curious user and an artificial intelligence assistant. "
    "The assistant gives helpful, detailed, and polite answers to the user's questions."
)


def sharegpt(target_dir: Path, n: int, seed: int = 0, reply: int = 12) -> list[dict]:
    """`n` one-turn conversations in ShareGPT's format: a human turn of plain words, and the target's own
    greedy reply to it in the Vicuna template (kept to ASCII bytes, so the text encodes back to the same
    tokens), as EAGLE's authors advise regenerating the data with the target. eagle's main.py measures
    its test accuracy where the target's prediction is the data's next token: on random text a random
    target never agrees, and main.py divides by zero. Each reply must hold the target's unrestricted
    greedy choice at least `reply // 2` times."""
    from transformers import AutoModelForCausalLM

    rng = random.Random(seed)
    tokenizer = llama_tokenizer()
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    ascii_ids = torch.tensor([tokenizer(chr(b), add_special_tokens=False).input_ids[0] for b in range(128)])
    conversations = []
    for i in range(n):
        question = " ".join(rng.choice(WORDS) for _ in range(6))
        ids = tokenizer(f"{VICUNA_SYSTEM} USER: {question} ASSISTANT: ").input_ids
        answer, agreed = [], 0
        for _ in range(reply):
            with torch.no_grad():
                logits = model(torch.tensor([ids])).logits[0, -1]
            best = int(ascii_ids[logits[ascii_ids].argmax()])
            agreed += best == int(logits.argmax())
            ids.append(best)
            answer.append(int((ascii_ids == best).nonzero()))
        assert agreed >= reply // 2, (
            f"the target's greedy reply leaves ASCII {reply - agreed} times of {reply}"
        )
        conversations.append(
            {
                "id": f"tiny_{i}",
                "conversations": [
                    {"from": "human", "value": question},
                    {"from": "gpt", "value": bytes(answer).decode("ascii")},
                ],
            }
        )
    return conversations


@pytest.fixture(scope="module")
def trained(consumer_env, tiny_target_dirs, tmp_path_factory) -> dict:
    """kind -> (the consumer's outputs, the inputs, its checkpoint directory, the target directory)."""
    root = tmp_path_factory.mktemp("trainers")
    target_dir = trainer_target(tiny_target_dirs["llama"], root / "target")
    target = FrozenTarget.from_pretrained(str(target_dir), dtype="float32")
    tokens = torch.randint(0, 256, (1, T + 1), generator=torch.Generator().manual_seed(3))
    L = target.num_layers
    features = target(tokens[:, :T], capture=(L,), logits=False).hidden[L]  # after the final norm
    results, jobs = {}, {}

    work = root / "eagle"
    work.mkdir()
    (work / "ShareGPT_V4.3_unfiltered_cleaned_split.json").write_text(
        json.dumps(sharegpt(target_dir, CONVERSATIONS))
    )
    (work / "vicunav13").mkdir()
    (work / "vicunav13" / "13B").symlink_to(target_dir)
    eagle_draft_config(target_dir, work / "config.json")
    torch.save({"features": features, "input_ids": tokens[:, 1:]}, work / "inputs.pt")
    jobs["eagle"] = {"kind": "eagle", "work": str(work), "target": str(target_dir), "lr": 0.3}

    work = root / "medusa"
    work.mkdir()
    (work / "train.json").write_text(json.dumps(sharegpt(target_dir, CONVERSATIONS, seed=1)))
    torch.save({"hidden": features}, work / "inputs.pt")
    jobs["medusa"] = {"kind": "medusa", "work": str(work), "target": str(target_dir), "lr": 1e-2, "steps": 4}
    jobs["medusa"]["max_length"] = 256

    runs = {}
    for kind, job in jobs.items():
        work = Path(job["work"])
        job.update(inputs=str(work / "inputs.pt"), out=str(work / "out.pt"))
        runs[kind] = start_trainer(consumer_env, job, work)
    returncodes = {kind: run.wait() for kind, run in runs.items()}
    for kind, job in jobs.items():
        work = Path(job["work"])
        got = finish_trainer(returncodes[kind], job, work)
        inputs = torch.load(work / "inputs.pt")
        if kind == "eagle":
            # the last state's draft beside the --configpath config, as EAGLE ships them (the state also
            # holds model_1.safetensors: accelerate saves every prepared model, and main.py prepares the
            # frozen lm_head too)
            checkpoint = work / "release"
            checkpoint.mkdir()
            shutil.copy(Path(got["states"][-1]) / "model.safetensors", checkpoint / "model.safetensors")
            shutil.copy(work / "config.json", checkpoint / "config.json")
        else:
            checkpoint = Path(got["checkpoint"])
        results[kind] = (got, inputs, checkpoint, target_dir)
    return results


def imported(checkpoint: Path, fmt: str, target_dir: Path, out: Path):
    args = ["--format", fmt, "--checkpoint", str(checkpoint), "--target", str(target_dir), "--out", str(out)]
    assert command("import-heads")(args) == 0
    target = FrozenTarget.from_pretrained(str(target_dir), dtype="float32")
    heads, _ = load_heads(out, target, methods=methods())
    return heads, target


def check_eagle(heads, target, got: dict, inputs: dict) -> float:
    embeds = target.embed_tokens(inputs["input_ids"])
    with torch.no_grad():
        ours = heads(inputs["features"], embeds, torch.arange(T)[None], causal_mask(T))
    diff = max_diff(ours, got["features"])
    assert diff <= TOL, f"imported EAGLE heads differ from eagle-llm's cnets.Model by {diff}"
    return diff


def check_medusa(heads, target, got: dict, inputs: dict) -> float:
    assert got["missing"] == got["unexpected"] == [], (got["missing"], got["unexpected"])
    with torch.no_grad():
        diff = max_diff(heads(inputs["hidden"]), got["logits"])
    assert diff <= TOL, f"imported Medusa heads differ from medusa-llm's MedusaModel by {diff}"
    return diff


CHECK = {"eagle": check_eagle, "medusa": check_medusa}


def greedy_equals_generate(target, drafter, seed: int) -> float:
    prompt = torch.randint(0, 256, (1, 6), generator=torch.Generator().manual_seed(seed))
    out = SpeculativeDecoder(target, drafter).generate(prompt, max_new_tokens=24)
    reference = target.model.generate(prompt, max_new_tokens=24, do_sample=False)[:, 6:]
    assert torch.equal(out.tokens, reference), (out.tokens.tolist(), reference.tolist())
    return out


def test_the_trainers_ran_and_moved_the_weights(trained):
    """Their trainers really trained: EAGLE's ge_data wrote one file per conversation and main.py saved
    states whose weights differ from the first; Medusa's heads moved off the target's lm_head copy."""
    got, _, _, target_dir = trained["eagle"]
    assert len(got["data_files"]) == CONVERSATIONS, got["data_files"]
    # cnets' rotary base is 10000 whatever its config says (bench_trainers' EAGLE_LLM_ROPE_THETA)
    assert torch.equal(got["features_rope_1e5"], got["features"])
    first = load_file(str(Path(got["states"][0]) / "model.safetensors"))
    last = load_file(str(Path(got["states"][-1]) / "model.safetensors"))
    moved = max(float((first[k] - last[k]).abs().max()) for k in first if k != "embed_tokens.weight")
    assert moved > 1e-3, f"main.py's weights moved by {moved} only"
    _, _, checkpoint, _ = trained["medusa"]
    heads = torch.load(checkpoint / "medusa_lm_head.pt", weights_only=True)
    # a Vicuna-template "tokenization mismatch" masks every label: the loss, then the heads, turn NaN
    assert all(bool(v.isfinite().all()) for v in heads.values()), "medusa's trained heads hold NaN"
    lm_head = load_file(str(target_dir / "model.safetensors"))["lm_head.weight"]
    moved = float((heads["0.1.weight"].float() - lm_head).abs().max())
    assert moved > 1e-3, f"medusa's heads moved by {moved} only"
    print(f"eagle states {len(got['states'])}; medusa heads moved {moved:.3g}")


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_a_checkpoint_their_trainer_wrote_imports_and_decodes_as_generate(trained, tmp_path, kind):
    got, inputs, checkpoint, target_dir = trained[kind]
    heads, target = imported(checkpoint, kind, target_dir, tmp_path / "native")
    diff = CHECK[kind](heads, target, got, inputs)
    print(f"{kind} trainer checkpoint imported: max |diff| {diff:.2e}")
    for seed in range(3):
        if kind == "medusa":
            drafter = MedusaDrafter(heads, default_tree("medusa-15", num_heads=3))
        else:
            drafter = EagleDrafter(heads, target, default_tree("medusa-15"))
        greedy_equals_generate(target, drafter, seed)


# -- broken on purpose ----------------------------------------------------------------------------


def transpose(tensors: dict, key: str) -> None:
    tensors[key] = tensors[key].t().contiguous()


def rename(tensors: dict, key: str) -> None:
    tensors[key.replace("weight", "w")] = tensors.pop(key)


BREAKAGES = {
    "eagle-transposed-o_proj": ("eagle", transpose, "layers.0.self_attn.o_proj.weight"),
    "eagle-transposed-fc-half": ("eagle", None, "fc.weight"),
    "eagle-renamed-key": ("eagle", rename, "layers.0.mlp.up_proj.weight"),
    "medusa-transposed-resblock": ("medusa", transpose, "1.0.linear.weight"),
    "medusa-renamed-key": ("medusa", rename, "2.0.linear.weight"),
}


def broken_copy(checkpoint: Path, kind: str, edit, key: str, out: Path) -> Path:
    shutil.copytree(checkpoint, out)
    if kind == "eagle":
        tensors = load_file(str(out / "model.safetensors"))
        if edit is None:  # fc over cat(embed, feature): the two halves swapped
            H = tensors[key].shape[0]
            tensors[key] = torch.cat([tensors[key][:, H:], tensors[key][:, :H]], dim=1)
        else:
            edit(tensors, key)
        save_file(tensors, str(out / "model.safetensors"))
    else:
        tensors = torch.load(out / "medusa_lm_head.pt", weights_only=True)
        edit(tensors, key)
        torch.save(tensors, out / "medusa_lm_head.pt")
    return out


@pytest.mark.parametrize("name", list(BREAKAGES))
def test_the_checks_fail_on_a_trainer_checkpoint_broken_on_purpose(trained, tmp_path, name):
    kind, edit, key = BREAKAGES[name]
    got, inputs, checkpoint, target_dir = trained[kind]
    broken = broken_copy(checkpoint, kind, edit, key, tmp_path / "broken")
    with pytest.raises((AssertionError, FormatError)) as failed:
        heads, target = imported(broken, kind, target_dir, tmp_path / "native")
        CHECK[kind](heads, target, got, inputs)
    print(f"{name}: {str(failed.value).splitlines()[0][:160]}")
