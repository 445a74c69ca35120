"""Load one of our exports with a consumer's own code and run its forward (run in the consumer env).

    python consumer_run.py JOBS.json      # [{"kind", "export", "target", "inputs", "out"}, ...]

Runs with PYTHONPATH at the consumer packages (speculators, eagle-llm, medusa-llm, installed apart by
tests/consumers/consumer_env.py); torch and transformers are the project's. It imports nothing of
specheads: each job's inputs (the target's hidden states, token ids) come in its inputs file, computed by
the test, and its out file holds the consumer's outputs and what its loader left missing or unused. One
process runs every job, so torch and transformers are imported once.

KIND:
  speculators   speculators 0.9.0 `Eagle3DraftModel.from_pretrained(EXPORT_DIR)` (a `speculators` export);
                one step of its own forward (ttt_steps=1); logits read off its lm_head
  speculators-converter
                an `eagle3` export converted by speculators 0.9.0's own `Eagle3Converter` (layer ids and
                norm_before_residual from our config.json), then loaded as above
  eagle         eagle-llm 1.2.1 `eagle.model.cnets.Model` (EAGLE-1/2) built from EXPORT_DIR/config.json
                as `EaModel.__init__` builds it (`EConfig`, `bias` key of config.json, default true), its
                state dict loaded from our weights plus the target's embedding (what EaModel reads from an
                official checkpoint; the export, like SGLang's and vLLM's, shares the target's); it
                reads no rope_theta (always 10000, the tiny target's)
  medusa        medusa-llm 0.1 `MedusaModel.from_pretrained(EXPORT_DIR)`, its own loader of
                medusa_lm_head.pt; its KV-cache Llama fork is replaced by transformers' LlamaForCausalLM
                (the fork predates transformers 5; the heads never touch it)
  write-medusa, write-eagle, write-speculators
                the other direction: heads built by the consumer's own classes, saved into EXPORT_DIR as
                its trainer / official checkpoints save them, with the consumer's outputs on the inputs
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file


def run_speculators(export: Path, target: Path, inputs: dict, ours: dict | None = None) -> dict:
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    config = Eagle3SpeculatorConfig.from_pretrained(export)
    config.transformer_layer_config._attn_implementation = "eager"  # flex attention wants a GPU compile
    # (output_loading_info breaks its from_pretrained, which expects a model back: compare by hand)
    model = Eagle3DraftModel.from_pretrained(export, config=config, dtype=torch.float32)
    if "embed_tokens.weight" not in load_file(str(export / "model.safetensors")):
        # a checkpoint without the embedding: speculators' from_pretrained leaves it uninitialised (its
        # NaN sentinel does not survive transformers' loading); fill it with its own verifier loader
        model._load_verifier_weights(overwrite_embed_tokens=True)
    model.eval()
    logits, ids = _speculators_step(model, inputs)
    draft = logits.argmax(-1)
    return {
        "logits": logits,
        "target_ids": draft + model.d2t[draft],  # the consumer's own vocabulary map
        "layer_ids": ids,
        **loading_report(
            model.state_dict(), ours or load_file(str(export / "model.safetensors")), VERIFIER_OWNED
        ),
        "embed_matches_target": bool(torch.equal(model.embed_tokens.weight, _target_tensor(target, "embed"))),
    }


def _speculators_step(model, inputs: dict) -> tuple[torch.Tensor, list[int]]:
    """One step of the model's own forward (ttt_steps=1) on the layers its config names; the logits are
    read off its lm_head."""
    seen = {}
    model.lm_head.register_forward_hook(lambda m, i, o: seen.setdefault("logits", o.detach()))
    T = inputs["input_ids"].shape[1]
    ids = list(model.config.eagle_aux_hidden_state_layer_ids)  # captured as vLLM does: HF ids
    hidden = torch.cat([inputs["every_layer"][i] for i in ids], dim=-1)  # (1, T, 3H)
    with torch.no_grad():
        model(
            hidden_states=hidden,
            input_ids=inputs["input_ids"],
            document_ids=torch.zeros(1, T, dtype=torch.long),
            position_ids=inputs["position_ids"],
            ttt_steps=1,
        )
    return seen["logits"], ids  # (1, T, Vd)


# Filled from the verifier (our target) by speculators' load_verifier_weights, not from the draft's file.
VERIFIER_OWNED = ("embed_tokens.weight", "verifier_lm_head.weight", "verifier_norm.weight")


def loading_report(state: dict, ours: dict, owned_elsewhere: tuple[str, ...]) -> dict:
    """What the loader left out: keys of ours it has no place for (unexpected), parameters of its own not
    in our file (missing), and ours it holds with other values (mismatched)."""
    return {
        "unexpected": sorted(set(ours) - set(state)),
        "missing": sorted(set(state) - set(ours) - set(owned_elsewhere)),
        "mismatched": sorted(k for k in set(ours) & set(state) if not torch.equal(state[k], ours[k])),
    }


def _target_tensor(target: Path, which: str) -> torch.Tensor:
    weights = {}
    for f in sorted(target.glob("*.safetensors")):
        weights.update(load_file(str(f)))
    return weights["model.embed_tokens.weight"]


def run_eagle(export: Path, target: Path, inputs: dict) -> dict:
    from eagle.model.cnets import Model
    from eagle.model.configs import EConfig

    config = EConfig.from_pretrained(export)
    written = json.loads((export / "config.json").read_text())
    # transformers 5 rewrites the file's `rope_scaling: null` as {"rope_type": "default", ...}, which
    # cnets (written for transformers 4) takes for a scaling spec; give it back what the file says.
    config.rope_scaling = written["rope_scaling"]
    bias = written.get("bias", True)  # as EaModel.__init__ reads it
    model = Model(config, bias=bias)
    state = load_file(str(export / "model.safetensors"))
    state["embed_tokens.weight"] = _target_tensor(target, "embed")
    info = model.load_state_dict(state, strict=False)
    model.eval()
    with torch.no_grad():
        features = model(inputs["features"], input_ids=inputs["input_ids"])
    return {
        "features": features,
        "missing": sorted(info.missing_keys),
        "unexpected": sorted(info.unexpected_keys),
    }


def run_medusa(export: Path, target: Path, inputs: dict) -> dict:
    import transformers
    from medusa.model import medusa_model

    medusa_model.KVLlamaForCausalLM = transformers.LlamaForCausalLM
    loaded = {}
    original = torch.nn.Module.load_state_dict

    def recording(self, state_dict, strict=True, **kw):  # note what from_pretrained's own call left over
        result = original(self, state_dict, strict=strict, **kw)
        if self is getattr(recording, "heads", None):
            loaded.update(missing=sorted(result.missing_keys), unexpected=sorted(result.unexpected_keys))
        return result

    init = medusa_model.MedusaModel.__init__

    def init_and_mark(self, *a, **kw):
        init(self, *a, **kw)
        recording.heads = self.medusa_head

    medusa_model.MedusaModel.__init__ = init_and_mark
    torch.nn.Module.load_state_dict = recording
    try:
        model = medusa_model.MedusaModel.from_pretrained(str(export), dtype=torch.float32)
    finally:
        torch.nn.Module.load_state_dict = original
    model.eval()
    with torch.no_grad():
        logits = torch.stack([head(inputs["hidden"]) for head in model.medusa_head])  # (K, B, T, V)
    return {"logits": logits, **loaded}


def run_speculators_converter(export: Path, target: Path, inputs: dict) -> dict:
    """An `eagle3` export through speculators' own EAGLE-3 converter (`speculators convert`), with the
    layer ids and norm placement our config.json states, then loaded as run_speculators loads."""
    from speculators.convert.eagle.eagle3_converter import Eagle3Converter

    written = json.loads((export / "config.json").read_text())
    converted = export.parent / f"{export.name}-speculators"
    Eagle3Converter().convert(
        export,
        converted,
        base_model=str(target),
        norm_before_residual=written["norm_before_residual"],
        eagle_aux_hidden_state_layer_ids=written["eagle_aux_hidden_state_layer_ids"],
    )
    ours = {
        k.replace("midlayer.", "layers.0."): v
        for k, v in load_file(str(export / "model.safetensors")).items()
    }
    return run_speculators(converted, target, inputs, ours)


def _perturb(params, seed: int = 0) -> None:
    """Move freshly built weights off their initialisation, as training would."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in params:
            p.add_(0.05 * torch.randn(p.shape, generator=g))


def write_medusa(export: Path, target: Path, inputs: dict) -> dict:
    """Heads built by medusa-llm's MedusaModel and saved as its trainer saves them (train/train.py: the
    MedusaConfig's save_pretrained, then torch.save(medusa_head.state_dict(), "medusa_lm_head.pt"))."""
    import transformers
    from medusa.model.medusa_model import MedusaConfig, MedusaModel

    torch.manual_seed(0)
    base = transformers.LlamaForCausalLM.from_pretrained(target, dtype=torch.float32)
    model = MedusaModel(base, medusa_num_heads=3, medusa_num_layers=1, base_model_name_or_path=str(target))
    _perturb(model.medusa_head.parameters())
    MedusaConfig(
        medusa_num_heads=3, medusa_num_layers=1, base_model_name_or_path=str(target)
    ).save_pretrained(export)
    torch.save(model.medusa_head.state_dict(), export / "medusa_lm_head.pt")
    with torch.no_grad():
        logits = torch.stack([head(inputs["hidden"]) for head in model.medusa_head])
    return {"logits": logits}


def write_eagle(export: Path, target: Path, inputs: dict) -> dict:
    """An EAGLE-1 head built by eagle-llm's cnets.Model from a one-layer Llama config of the target (what
    its trainer, train/main.py, reads as --configpath), the target's embedding copied in as load_emb does,
    saved as the official checkpoints are (config.json + pytorch_model.bin of the whole state dict)."""
    from eagle.model.cnets import Model
    from eagle.model.configs import EConfig

    config = json.loads((target / "config.json").read_text())
    config.update(num_hidden_layers=1, architectures=["LlamaForCausalLM"])
    export.mkdir(parents=True, exist_ok=True)
    (export / "config.json").write_text(json.dumps(config))
    econfig = EConfig.from_pretrained(export)
    econfig.rope_scaling = None  # transformers 5 rewrites the default rope as a dict cnets cannot read
    torch.manual_seed(0)
    model = Model(econfig, bias=True)
    with torch.no_grad():
        model.embed_tokens.weight.copy_(_target_tensor(target, "embed"))
    _perturb(p for n, p in model.named_parameters() if not n.startswith("embed_tokens"))
    torch.save(model.state_dict(), export / "pytorch_model.bin")
    model.eval()
    with torch.no_grad():
        features = model(inputs["features"], input_ids=inputs["input_ids"])
    return {"features": features}


def write_speculators(export: Path, target: Path, inputs: dict) -> dict:
    """An Eagle3DraftModel built from speculators' own config classes (as its converter builds them), its
    vocabulary maps and verifier weights loaded by its own methods, saved with its save_pretrained."""
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import AutoConfig

    layer = AutoConfig.from_pretrained(target)
    layer.num_hidden_layers = 1
    layer._attn_implementation = "eager"
    verifier = VerifierConfig(name_or_path=str(target), architectures=["LlamaForCausalLM"])
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer,
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[GreedyTokenProposalConfig(proposal_type="greedy", speculative_tokens=3)],
            default_proposal_method="greedy",
            verifier=verifier,
        ),
        draft_vocab_size=100,
        norm_before_residual=False,
        eagle_aux_hidden_state_layer_ids=[1, 2, 3],
    )
    torch.manual_seed(0)
    model = Eagle3DraftModel(config)
    vocab = layer.vocab_size
    draft_ids = torch.randperm(vocab, generator=torch.Generator().manual_seed(1))[:100].sort().values
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[draft_ids] = True
    model.load_vocab_mappings(t2d, draft_ids - torch.arange(100))
    model.load_verifier_weights()
    _perturb(p for n, p in model.named_parameters() if not n.startswith(("embed_tokens", "verifier_")))
    model.save_pretrained(export)
    model.eval()
    logits, _ = _speculators_step(model, inputs)
    draft = logits.argmax(-1)
    return {"logits": logits, "target_ids": draft + model.d2t[draft]}


RUNNERS = {
    "speculators": run_speculators,
    "speculators-converter": run_speculators_converter,
    "eagle": run_eagle,
    "medusa": run_medusa,
    "write-medusa": write_medusa,
    "write-eagle": write_eagle,
    "write-speculators": write_speculators,
}


def main(argv: list[str]) -> int:
    """Run every job of JOBS.json (a list of {kind, export, target, inputs, out}) in this one process;
    a job that raises leaves {"error": its traceback} in its out file, and the others still run."""
    import traceback

    for job in json.loads(Path(argv[0]).read_text()):
        try:
            inputs = torch.load(job["inputs"], weights_only=True)
            result = RUNNERS[job["kind"]](Path(job["export"]), Path(job["target"]), inputs)
        except Exception:
            result = {"error": traceback.format_exc()}
        torch.save(result, job["out"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
