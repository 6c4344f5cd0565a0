"""The output of every credit estimator, and the small helpers the estimators share."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

import torch

__all__ = ["DIAGNOSTIC_STATS", "CreditResult"]

# The credit diagnostics, as shares of a batch's steps (logged as ``credit/<name>``; plotted by the run's curves and
# the report's Figure 5): peer comparison gives nothing, transition credit acts, acts alone, nothing acts, more
# than one history depth is fused. Estimators report the subset that applies to them.
DIAGNOSTIC_STATS = ("peer_zero", "transition_active", "transition_only", "still_zero", "multi_depth")


@dataclass(eq=False)
class CreditResult:
    """``advantage``: float tensor ``[n]`` in the batch's input order; ``returns``: the returns ``R_t``
    used (``[n]``, input order); ``stats``: diagnostics as plain floats (fractions of the batch's steps);
    ``parts``: optional per-step components of the advantage (``[n]`` each, input order), e.g. ProGPO's
    ``a_hier`` and ``a_trans``, for trajectory tables and debugging."""

    advantage: torch.Tensor
    returns: torch.Tensor
    stats: dict[str, float] = field(default_factory=dict)
    parts: dict[str, torch.Tensor] = field(default_factory=dict)


# -- constructor argument checks (ValueError naming the parameter) ---------------------------------------


def check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        if isinstance(value, numbers.Real) and float(value).is_integer():
            value = int(value)
        else:
            raise ValueError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_float(
    name: str,
    value,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
) -> float:
    """A finite float in ``[low, high]`` (``(low, high]`` when ``low_open``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    value = float(value)
    if math.isnan(value) or math.isinf(value):
        raise ValueError(f"{name} must be finite, got {value}")
    left = "(" if low_open else "["
    if high is None:
        if low is not None and (value <= low if low_open else value < low):
            raise ValueError(f"{name} must be {'>' if low_open else '>='} {low:g}, got {value}")
    elif (low is not None and (value <= low if low_open else value < low)) or value > high:
        raise ValueError(f"{name} must be in {left}{low:g}, {high:g}], got {value}")
    return value


def check_choice(name: str, value, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


def fractions(device_values: dict[str, torch.Tensor]) -> dict[str, float]:
    """Means of boolean per-step tensors (or ready scalars) as Python floats, with one host sync."""
    if not device_values:
        return {}
    names = list(device_values)
    vals = torch.stack(
        [
            v.to(torch.float64).mean() if v.numel() else v.new_zeros((), dtype=torch.float64)
            for v in device_values.values()
        ]
    )
    return dict(zip(names, vals.tolist()))


def empty_result(device: torch.device, stat_names: tuple[str, ...]) -> CreditResult:
    zero = torch.zeros(0, dtype=torch.float64, device=device)
    return CreditResult(advantage=zero, returns=zero.clone(), stats={name: 0.0 for name in stat_names})
