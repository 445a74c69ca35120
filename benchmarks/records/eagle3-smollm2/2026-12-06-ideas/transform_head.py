"""A copy of a native EAGLE-3 head (config.json + model.safetensors) with its weights changed after training:

    python transform_head.py scale SRC OUT S        # the draft's lm_head times S, so its logits times S
    python transform_head.py average SRC OUT STEP.. # the mean of the final weights and those of SRC's
                                                    # checkpoints/step-STEP (equal weights)

Neither trains anything: both ask whether a head that training already made decodes better changed so.
"""

import shutil
import sys
from pathlib import Path

from safetensors.torch import load_file, save_file


def main(kind: str, src: Path, out: Path, args: list[str]) -> None:
    weights = load_file(src / "model.safetensors")
    if kind == "scale":
        (scale,) = map(float, args)
        head = weights["lm_head.weight"]
        weights["lm_head.weight"] = (head.double() * scale).to(head.dtype).contiguous()
    elif kind == "average":
        others = [load_file(src / "checkpoints" / f"step-{step}" / "model.safetensors") for step in args]
        for name, final in weights.items():
            if final.is_floating_point():
                total = sum(o[name].double() for o in others) + final.double()
                weights[name] = (total / (1 + len(others))).to(final.dtype).contiguous()
            elif not all(o[name].equal(final) for o in others):  # d2t / t2d: the data's vocabulary
                raise SystemExit(f"{name} differs between the checkpoints")
    else:
        raise SystemExit(f"unknown transform {kind!r}: scale or average")
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "config.json", out / "config.json")
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4:])
