"""``model=qwen2.5-1.5b`` / ``qwen2.5-3b``: instruct checkpoints from the hub or a local folder (GPU runs).

bf16 on CUDA, optional gradient checkpointing and optional LoRA (peft, the ``lora`` extra). With
``HF_HUB_OFFLINE=1`` (or a local ``path``) nothing is downloaded; missing weights fail with the fix. Without
``HF_HUB_OFFLINE`` the hub is probed once (one TCP connect, a few seconds at most): when it cannot be reached, only
the local cache is tried, so a machine without network fails in seconds instead of after a minute of retries.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
from huggingface_hub import try_to_load_from_cache
from transformers import AutoModelForCausalLM, AutoTokenizer

import progpo.models.attention  # noqa: F401  (registers attn_implementation="bf16_matmul")
from envs.base import EnvSuite
from progpo.models.compile import compile_layers
from progpo.types import Policy

log = logging.getLogger(__name__)


HUB_PROBE_TIMEOUT_S = 3.0


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


@functools.cache
def hub_reachable(endpoint: str, timeout_s: float = HUB_PROBE_TIMEOUT_S) -> bool:
    """One TCP connect to the hub endpoint (``HF_ENDPOINT``); remembered for the process."""
    url = urlparse(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def _hub_access() -> str | None:
    """Why the hub is not used (None: it is): off by ``HF_HUB_OFFLINE``, or probed and unreachable."""
    if _offline():
        return "hub access is off (HF_HUB_OFFLINE=1)"
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    if not hub_reachable(endpoint):
        log.warning("the hub (%s) cannot be reached: loading from the local cache only", endpoint)
        return f"the hub {endpoint} cannot be reached from this machine"
    return None


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


def locate_weights(path: str | None, hub_id: str) -> tuple[str, bool]:
    """Where to load from and whether only local files may be used; fails in seconds when there is nothing.

    A ``path`` must be a checkpoint folder. Without one, ``hub_id`` is downloaded unless the hub is off or
    unreachable; then it must already be in the local Hugging Face cache.
    """
    if path is not None:
        if not (Path(path) / "config.json").is_file():
            raise FileNotFoundError(
                f"model.path={path!r} is not a transformers checkpoint folder (no config.json): point model.path "
                "at the folder holding config.json, the weights and the tokenizer"
            )
        return path, True
    no_hub = _hub_access()
    if no_hub is not None and not isinstance(try_to_load_from_cache(hub_id, "config.json"), str):
        raise FileNotFoundError(
            f"cannot load {hub_id!r}: {no_hub} and it is not in the local Hugging Face cache. Set "
            f"model.path=/local/dir to a downloaded checkpoint (e.g. `hf download {hub_id} --local-dir DIR` "
            "on a machine with network)"
        )
    return hub_id, no_hub is not None


def preflight(path: str | None = None, hub_id: str = "Qwen/Qwen2.5-1.5B-Instruct", **_: Any) -> None:
    """Run by ``validate_config`` before anything is built: missing weights fail in seconds (``locate_weights``)."""
    locate_weights(path, hub_id)


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
    compile: bool = False,
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
        compile: ``torch.compile`` the decoder layers (``progpo.models.compile``).
    """
    source, local_only = locate_weights(path, hub_id)
    kwargs: dict[str, Any] = {"local_files_only": local_only}
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=getattr(torch, dtype), attn_implementation=attn_implementation, **kwargs
        )
    except OSError as err:
        raise FileNotFoundError(
            f"cannot load {source!r}: set model.path=/local/dir to a complete transformers checkpoint "
            f"(config.json, weights, tokenizer). Cause: {err}"
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
    if compile:
        compile_layers(model)
    return Policy(model=model, tokenizer=tokenizer, name=name, max_context=max_context, source=source)


build_hf.preflight = preflight  # the hook validate_config looks for on a model builder
