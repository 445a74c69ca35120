"""scripts/engine_load_run.py's judgement of an engine's load_weights, on a toy engine class (the real
engines run from scripts/check_engines.py --load): a parameter left unfilled, a fused projection missing a
part, a key that lands nowhere and a wrong value are each caught; vocabulary padding is not a failure."""

import torch
from torch import nn

from scripts import engine_load_run as run


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
