"""What the CPU can do fast: bf16 matmuls need AMX-BF16 or AVX512-BF16, else they are emulated (slower than float32)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

BF16_FLAGS = ("amx_bf16", "avx512_bf16")


@cache
def cpu_flags() -> frozenset[str] | None:
    """The CPU feature flags of /proc/cpuinfo; None where they cannot be read (not Linux)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return None


def cpu_has_fast_bf16() -> bool | None:
    """True with AMX-BF16 or AVX512-BF16, False without either, None when unknown."""
    flags = cpu_flags()
    return None if flags is None else any(f in flags for f in BF16_FLAGS)
