"""``model=qwen2.5-1.5b`` / ``qwen2.5-3b``: instruct checkpoints from the hub or a local folder (GPU runs).

bf16 on CUDA, optional gradient checkpointing and optional LoRA (peft, the ``lora`` extra). With
``HF_HUB_OFFLINE=1`` (or a local ``path``) nothing is downloaded; missing weights fail with the fix.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from envs.base import EnvSuite
from progpo.types import Policy

log = logging.getLogger(__name__)


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def apply_lora(model, r: int, alpha: int, target_modules: Sequence[str], dropout: float = 0.0):
    """Wrap ``model`` with LoRA adapters (only the adapters train)."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as err:
        raise ImportError(
            "model.lora is set but peft is not installed: `pip install 'progpo[lora]'` or set model.lora=null"
        ) from err
    config = LoraConfig(
        r=r,
        lora_alpha=alpha,
        target_modules=list(target_modules),
        lora_dropout=dropout,
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def build_hf(
    suite: EnvSuite | None = None,
    device: str = "cuda",
    name: str = "qwen2.5-1.5b",
    hub_id: str = "Qwen/Qwen2.5-1.5B-Instruct",
    path: str | None = None,
    dtype: str = "bfloat16",
    max_context: int = 4096,
    gradient_checkpointing: bool = True,
    attn_implementation: str | None = "sdpa",
    lora: Mapping[str, Any] | None = None,
) -> Policy:
    """Load a causal LM from ``path`` (a local folder) or ``hub_id``.

    Args:
        suite: unused (the weights do not depend on the env); accepted so every model builder looks alike.
        device: where the model lives ("cuda" for these sizes).
        hub_id: Hugging Face hub id, used when ``path`` is None.
        path: local folder with the weights and tokenizer; wins over ``hub_id``.
        dtype: torch dtype name of the weights.
        max_context: longest prompt + response used.
        gradient_checkpointing: trade compute for activation memory in the PPO updates.
        attn_implementation: transformers attention backend ("sdpa", "flash_attention_2", "eager" or None).
        lora: None for full fine-tuning, or ``{r, alpha, target_modules, dropout}`` for LoRA adapters.
    """
    source = path or hub_id
    local_only = path is not None or _offline()
    kwargs: dict[str, Any] = {"local_files_only": local_only}
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=getattr(torch, dtype), attn_implementation=attn_implementation, **kwargs
        )
    except OSError as err:
        where = "hub access is off (HF_HUB_OFFLINE=1)" if local_only and path is None else "loading failed"
        raise FileNotFoundError(
            f"cannot load {source!r} ({where}): set model.path=/local/dir to a downloaded checkpoint, "
            f"or allow hub access to download {hub_id!r} (unset HF_HUB_OFFLINE). Cause: {err}"
        ) from err
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.to(device)
    if gradient_checkpointing:
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x name
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if lora:
        model = apply_lora(model, **dict(lora))
        log.info("LoRA adapters: %s", dict(lora))
    return Policy(model=model, tokenizer=tokenizer, name=name, max_context=max_context, source=source)
