"""scripts/engine_load_run.py's judgement of an engine's load_weights, on a toy engine class (the real
engines run from scripts/check_engines.py --load): a parameter left unfilled, a fused projection missing a
part, a key that lands nowhere and a wrong value are each caught; vocabulary padding is not a failure.
Then check_engines' own judgement: the families it builds, when the embedding is left to the target, and
what fails the check (the loads by the real engines run in CI's engines stage)."""

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from scripts import check_engines
from scripts import engine_load_run as run
from scripts.families import FAMILIES, tiny_config
from specheads.heads.eagle import llama_layer_config_from


class ToyEngine(nn.Module):
    """An engine-style draft: fused qkv, `model.` prefix, midlayer read as layers.0, lm_head padded to 8 rows."""

    def __init__(self):
        super().__init__()
        self.model = nn.Module()
        self.model.fc = nn.Linear(4, 2, bias=False)
        self.model.layers = nn.ModuleList([nn.Module()])
        self.model.layers[0].self_attn = nn.Module()
        self.model.layers[0].self_attn.qkv_proj = nn.Linear(2, 6, bias=False)
        self.lm_head = nn.Linear(2, 8, bias=False)

    def load_weights(self, weights):
        params = dict(self.named_parameters())
        offsets = {"q_proj": 0, "k_proj": 2, "v_proj": 4}
        for name, w in weights:
            name = name.replace("midlayer.", "layers.0.")
            for part, at in offsets.items():
                if f".{part}." in name:
                    params["model." + name.replace(part, "qkv_proj")].data[at : at + 2] = w
                    break
            else:
                key = name if name in params else f"model.{name}"
                if key in params:  # engines skip what they do not know, silently
                    params[key].data[: w.shape[0]] = w


def files():
    g = torch.Generator().manual_seed(0)
    names = ["fc.weight", "midlayer.self_attn.q_proj.weight", "midlayer.self_attn.k_proj.weight"]
    names += ["midlayer.self_attn.v_proj.weight", "lm_head.weight"]
    shapes = [(2, 4), (2, 2), (2, 2), (2, 2), (5, 2)]
    return {n: torch.randn(s, generator=g) for n, s in zip(names, shapes, strict=True)}


def judged(tensors):
    report = run.load_and_check(ToyEngine(), tensors, d2t_map=None)
    wrong = [n for n, r in report["params"].items() if not (r["filled"] and r["max_abs_diff"] == 0.0)]
    return report, wrong


def test_a_complete_load_passes_with_the_vocabulary_padding_allowed():
    report, wrong = judged(files())
    assert wrong == [] and report["our_keys_not_landed"] == []
    assert report["params"]["lm_head.weight"]["padding_rows"] == 3


def test_a_fused_projection_missing_a_part_is_caught():
    tensors = files()
    tensors["midlayer.self_attn.v.weight"] = tensors.pop("midlayer.self_attn.v_proj.weight")
    report, wrong = judged(tensors)
    assert wrong == ["model.layers.0.self_attn.qkv_proj.weight"]
    # the renamed key lands nowhere, and q and k went into a projection that is not what our files say
    assert set(report["our_keys_not_landed"]) == {
        f"midlayer.self_attn.{k}.weight" for k in ("q_proj", "k_proj", "v")
    }


def test_a_key_the_engine_skips_and_a_wrong_value_are_caught():
    tensors = files()
    tensors["fc.w"] = tensors.pop("fc.weight")
    report, wrong = judged(tensors)
    assert wrong == ["model.fc.weight"] and report["our_keys_not_landed"] == ["fc.w"]

    class Scaled(ToyEngine):
        def load_weights(self, weights):
            super().load_weights((n, 2 * w if n == "lm_head.weight" else w) for n, w in weights)

    report = run.load_and_check(Scaled(), files(), d2t_map=None)
    assert report["params"]["lm_head.weight"]["max_abs_diff"] > 0
    assert report["our_keys_not_landed"] == ["lm_head.weight"]


# -- scripts/check_engines.py: what it judges and what fails it (the engines themselves: CI's stage) ------


def test_every_family_builds_a_tiny_config_and_a_llama_draft_layer_over_it():
    for family, spec in FAMILIES.items():
        config = tiny_config(family)
        assert config.model_type == spec.model_type
        assert (config.hidden_size, config.num_hidden_layers, config.vocab_size) == (64, 4, 264)
        layer = llama_layer_config_from(config)
        assert (layer["model_type"], layer["hidden_size"], layer["vocab_size"]) == ("llama", 64, 264), family
    mixed = [
        f for f in FAMILIES if "sliding_attention" in (getattr(tiny_config(f), "layer_types", None) or [])
    ]
    assert mixed == ["gemma2", "gemma3_text", "gpt_oss"]


def test_families_are_parsed_and_an_unknown_one_is_named():
    assert check_engines.parse_families("all") == list(FAMILIES)
    assert check_engines.parse_families("qwen3, phi3") == ["qwen3", "phi3"]
    with pytest.raises(SystemExit, match="unknown \\['qwen9'\\].*llama"):
        check_engines.parse_families("llama,qwen9")


def report(params, landed=(), d2t=True):
    return {"params": params, "our_keys_not_landed": list(landed), "d2t_to_target_ids_equal": d2t}


def test_the_embedding_is_left_to_the_target_only_when_our_files_do_not_hold_it(tmp_path):
    filled = {"filled": True, "from": ["fc.weight"], "max_abs_diff": 0.0}
    empty = {"filled": False, "from": [], "max_abs_diff": None}
    out = tmp_path / "r.json"
    out.write_text(json.dumps(report({"model.fc.weight": filled, "model.embed_tokens.weight": empty})))
    judged = check_engines.judged("speculators", out)
    assert judged["ok"] and judged["left_to_the_target"] == ["model.embed_tokens.weight"]
    # our files hold it and the engine left it unfilled: a failure
    held = {"filled": False, "from": ["embed_tokens.weight"], "max_abs_diff": None}
    out.write_text(json.dumps(report({"model.fc.weight": filled, "model.embed_tokens.weight": held})))
    judged = check_engines.judged("speculators", out)
    assert not judged["ok"] and judged["params_wrong"] == ["model.embed_tokens.weight"]
    out.write_text(json.dumps(report({"model.fc.weight": filled}, d2t=False)))
    assert not check_engines.judged("eagle3", out)["ok"]
    out.write_text(json.dumps({"error": "Traceback ...\nValueError: no"}))
    assert check_engines.judged("eagle3", out) == {"ok": False, "error": "Traceback ...\nValueError: no"}


def test_a_failed_load_or_a_blind_check_fails_and_a_format_the_engine_lacks_does_not():
    lacking = {
        "family": "llama",
        "format": "vllm-medusa",
        "engine": "vllm 0.33.0",
        "ok": False,
        "verdict": "...",
    }
    changed = {"family": "qwen3", "format": "eagle3", "engine": "sglang 0.5.23", "ok": False}
    assert check_engines.failures([lacking], []) == []
    assert check_engines.failures([changed], []) == ["audit qwen3 eagle3 sglang 0.5.23"]

    def load(ok, check_fails, error=None):
        return {
            "family": "phi3",
            "format": "eagle",
            "engine": "vllm 0.33.0",
            "ok": ok,
            "report": {"error": error} if error else {},
            "broken_on_purpose": {"check_fails": check_fails},
        }

    assert check_engines.failures([], [load(True, True)]) == []
    assert check_engines.failures([], [load(False, True, "Traceback\nKeyError: 'x'")]) == [
        "load phi3 eagle vllm 0.33.0: [\"KeyError: 'x'\"]"
    ]
    assert check_engines.failures([], [load(True, False)]) == [
        "load phi3 eagle vllm 0.33.0: a key renamed still passes"
    ]


def test_a_runner_that_dies_leaves_each_job_its_error(tmp_path):
    jobs = [
        {"format": "eagle3", "export": "x", "target": "y", "out": str(tmp_path / f"{i}.json")} for i in (0, 1)
    ]
    check_engines.run_engine("no-such-engine", [tmp_path], jobs, tmp_path)
    for job in jobs:
        judged = check_engines.judged("eagle3", Path(job["out"]))
        assert not judged["ok"] and "KeyError: 'no-such-engine'" in judged["error"]
