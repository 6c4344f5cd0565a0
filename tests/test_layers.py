"""The house's layers: every import of our own code points down, never back up (nor sideways across a room).

Read from every module's source with ``ast`` (function-level imports included), so a late ``import`` inside a
function cannot hide an arrow running back up.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# package -> the packages of ours it may import (besides itself)
ALLOWED: dict[str, set[str]] = {
    "envs": set(),
    "progpo.types": set(),
    "progpo.masks": set(),
    "progpo.algo.loss": set(),  # the PPO loss: a leaf inside the algorithm
    "progpo.progress": set(),  # progress bars (TTY or plain log lines): a leaf
    "progpo.credit": set(),
    "progpo.config": {"progpo.hardware"},  # ``auto`` values checked with the hardware leaf's predicate
    "progpo.hardware": set(),  # CPU feature flags: a leaf
    "progpo.dist": set(),  # rank, world size, gathers: a leaf (torch.distributed only)
    "progpo.tracking": {"progpo.config", "progpo.hardware"},  # runs are tagged with their machine
    # the bf16 attention kernel: a leaf inside the models but for the hardware leaf (AMX-BF16 CPUs give SDPA the
    # passes without gradients)
    "progpo.models.attention": {"progpo.hardware"},
    # decoder passes at the response window only (its width rounded as the shapes leaf rounds)
    "progpo.models.window": {"progpo.models.attention", "progpo.models.shapes"},
    # scoring and update batches padded to a few shapes where the CPU is AMX-BF16 (oneDNN's kernels re-used)
    "progpo.models.shapes": {"progpo.hardware", "progpo.models.attention"},
    "progpo.models": {"progpo.types", "progpo.masks", "progpo.models.attention", "progpo.models.window",
                      "progpo.models.shapes", "envs"},
    # decoding runs the policy's layers through the window leaf, never the rest of the models room; its batch size
    # follows the hardware leaf's rule for the precision in force (the attention leaf tells CPU bf16 autocast)
    "progpo.rollout": {"progpo.types", "progpo.masks", "progpo.dist", "progpo.progress", "progpo.models.window",
                       "progpo.models.attention", "progpo.hardware", "envs"},
    "progpo.warmstart": {"progpo.models", "progpo.rollout", "progpo.types", "progpo.config", "progpo.hardware",
                         "progpo.progress", "envs"},  # warm_start.precision=auto asks the hardware leaf
    "progpo.algo": {"progpo.types", "progpo.models", "progpo.credit", "progpo.algo.loss", "progpo.config",
                    "progpo.dist"},
    "progpo.lit": {"progpo.algo", "progpo.types", "progpo.config", "progpo.tracking", "progpo.credit", "progpo.dist",
                   "progpo.progress", "envs"},
}


# Entry points at the top of the house (``python -m progpo.<name>``): they may import any layer.
ENTRY_POINTS = {"progpo.sweep", "progpo.report", "progpo.fidelity", "progpo.bench"}


def _package(module: str) -> str | None:
    """The layer a dotted module name belongs to (the longest ALLOWED key it starts with)."""
    matches = [p for p in ALLOWED if module == p or module.startswith(p + ".")]
    return max(matches, key=len) if matches else None


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module in ("progpo", "envs") and node.level == 0:
            names.update(f"{node.module}.{a.name}" for a in node.names)  # ``from progpo import dist``
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return {n for n in names if n.split(".")[0] in ("progpo", "envs")}


def test_no_import_runs_back_up_a_layer():
    wrong = []
    for path in sorted([*(REPO / "progpo").rglob("*.py"), *(REPO / "envs").rglob("*.py")]):
        module = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        layer = _package(module)
        if layer is None:  # entry points (train, sweep, report, bench, ...) may import anything
            continue
        for name in _imports(path):
            target = _package(name) or name
            # a layer that may import a package may import the leaves inside it too
            inside_allowed = any(target == a or target.startswith(a + ".") for a in ALLOWED[layer])
            if target != layer and not inside_allowed:
                wrong.append(f"{module} imports {name}")
    assert not wrong, "\n".join(wrong)


def test_the_layer_map_covers_every_package():
    packages = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "progpo").rglob("__init__.py")}
    unmapped = sorted(p for p in packages - {"progpo"} - ENTRY_POINTS if _package(p) is None)
    assert not unmapped, f"add these packages to ALLOWED: {unmapped}"
