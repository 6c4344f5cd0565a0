"""k-nearest-neighbour search over state embeddings for semantic expansion (paper Eq. 10).

A backend answers: for each query state, the ``k`` other states with the highest cosine similarity,
optionally restricted to states of the same *block* (the task group when ``sem_scope="group"``).
State vectors come from a ``Vectors`` provider (``gather(index) -> [m, d]``, zero rows for index -1), so a
backend can materialise only the vectors it needs, block by block (``semantic.StateSums`` computes
per-state embedding sums on demand; ``TensorVectors`` wraps a plain ``[S, d]`` tensor).

Tie rule (the spec leaves it open; decided here): candidates are ranked by similarity, higher first, and
equal similarities by the smaller state index. State indices follow ``(group, obs)`` order, so the rule does
not depend on the batch's input order.

- ``TorchKNN``: exact, pure torch, similarities in float64. Blocks are padded to the widest one and
  compared with batched matmuls, so the cost is ``sum_blocks Q_b * S_b * d`` rather than ``Q * S * d``.
  Blocks are processed in chunks sized to stay in cache (a short loop over chunks, not over blocks), which
  keeps the time linear in the batch size.
- ``FaissKNN``: faiss flat inner-product index on L2-normalised vectors (a GPU index when the vectors are on
  CUDA and faiss has GPU support). Blocks are enforced loop-free by appending a scaled one-hot block code to
  each vector (same-block pairs gain a constant larger than any cosine gap). Similarities of the returned
  candidates are recomputed exactly and re-ranked with the tie rule, so both backends return the same
  neighbours up to near-ties at float32 resolution.

``knn_backend="auto"`` (``AutoKNN``) picks per search, by measurement (``python -m progpo.bench knn``, 2-core
CPU): ``TorchKNN`` for block-restricted searches (``sem_scope="group"``: 1.4-7x faster than faiss) and for small
unrestricted ones; ``FaissKNN`` for an unrestricted search over ``FAISS_MIN_STATES`` states or more
(``sem_scope="batch"`` at 4-8x the paper's batch: 1.4-3x faster than torch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

__all__ = [
    "AutoKNN",
    "FaissKNN",
    "KNNBackend",
    "Neighbours",
    "TensorVectors",
    "TorchKNN",
    "Vectors",
    "make_knn",
    "select_top_k",
]

# Budget of one candidate chunk (float64 bytes) and of one similarity tile (elements).
_CHUNK_BYTES = 1 << 22
_TILE = 1 << 21


@dataclass(frozen=True, eq=False)
class Neighbours:
    """``index[q, l]``: state index of the l-th neighbour of query q (-1 when fewer than k exist);
    ``sim[q, l]``: its cosine similarity (float64, 0 where ``index == -1``). Columns are not ordered."""

    index: torch.Tensor
    sim: torch.Tensor

    @property
    def valid(self) -> torch.Tensor:
        return self.index >= 0


class Vectors(Protocol):
    """``n`` state vectors of dimension ``dim`` on ``device``, fetched by index."""

    n: int
    dim: int
    device: torch.device

    def gather(self, index: torch.Tensor) -> torch.Tensor:
        """Rows ``index`` as ``[len(index), dim]`` (zero rows where ``index == -1``)."""
        ...


class TensorVectors:
    """``Vectors`` over a plain ``[S, d]`` tensor."""

    def __init__(self, x: torch.Tensor) -> None:
        self.x = x
        self.n, self.dim = x.shape
        self.device = x.device

    def gather(self, index: torch.Tensor) -> torch.Tensor:
        rows = self.x.index_select(0, index.clamp_min(0))
        return rows * (index >= 0)[:, None]


class KNNBackend(Protocol):
    def search(
        self, vectors: Vectors, queries: torch.Tensor, k: int, blocks: torch.Tensor | None = None
    ) -> Neighbours:
        """Neighbours of states ``queries`` among the other states (cosine similarity), restricted to the
        same block when ``blocks`` (non-decreasing, one entry per state) is given."""
        ...


def _empty(q: int, device: torch.device) -> Neighbours:
    return Neighbours(
        torch.full((q, 0), -1, dtype=torch.long, device=device),
        torch.zeros((q, 0), dtype=torch.float64, device=device),
    )


def _check_blocks(blocks: torch.Tensor | None, n: int, device: torch.device) -> torch.Tensor:
    if blocks is None:
        return torch.zeros(n, dtype=torch.long, device=device)
    if blocks.numel() != n:
        raise ValueError(f"blocks: expected {n} entries (one per state), got {blocks.numel()}")
    if n > 1 and bool((blocks[1:] < blocks[:-1]).any()):
        raise ValueError("blocks: must be non-decreasing (states grouped by block)")
    return blocks


def select_top_k(sim: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Columns of the ``k`` largest finite entries of each row of ``sim`` (``-inf`` marks non-candidates),
    equal values broken by the smaller column. Returns ``(cols [..., k], valid [..., k])``."""
    n_cols = sim.shape[-1]
    kth = torch.topk(sim, k, dim=-1).values[..., -1:]
    finite = torch.isfinite(sim)
    above = (sim > kth) & finite
    tied = (sim == kth) & finite
    need = k - above.sum(dim=-1, keepdim=True)
    chosen = above | (tied & (torch.cumsum(tied, dim=-1) <= need))
    col = torch.arange(n_cols, device=sim.device, dtype=torch.float64)
    score = torch.where(chosen, -col, torch.full_like(col, -torch.inf))
    cols = torch.topk(score, k, dim=-1).indices
    return cols, torch.gather(chosen, -1, cols)


def _block_top_k(
    x_query: torch.Tensor,
    q_norm: torch.Tensor,
    self_col: torch.Tensor,
    x_cand: torch.Tensor,
    cand_norm: torch.Tensor,
    cand_real: torch.Tensor,
    k: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-k candidate columns of padded blocks: queries ``[m, depth, d]`` against candidates
    ``[m, width, d]`` (cosine, float64), excluding each query's own column and padding. Returns
    ``(cols, valid, sim)``, each ``[m, depth, k]``; query rows are processed in tiles of bounded size."""
    m, depth, _ = x_query.shape
    width = x_cand.shape[1]
    device = x_query.device
    cols = torch.empty(m, depth, k, dtype=torch.long, device=device)
    valid = torch.empty(m, depth, k, dtype=torch.bool, device=device)
    best = torch.empty(m, depth, k, dtype=torch.float64, device=device)
    lane = torch.arange(width, device=device)
    tiny = torch.finfo(torch.float64).tiny
    x_cand_t = x_cand.transpose(1, 2)
    rows = max(1, _TILE // (m * width))
    for r0 in range(0, depth, rows):
        r1 = min(depth, r0 + rows)
        sim = torch.bmm(x_query[:, r0:r1], x_cand_t)
        sim /= (q_norm[:, r0:r1, None] * cand_norm[:, None, :]).clamp_min(tiny)
        ok = cand_real[:, None, :] & (lane != self_col[:, r0:r1, None])
        sim = torch.where(ok, sim, torch.full_like(sim, -torch.inf))
        c, v = select_top_k(sim, k)
        cols[:, r0:r1], valid[:, r0:r1] = c, v
        best[:, r0:r1] = torch.gather(sim, -1, c)
    return cols, valid, best


class TorchKNN:
    """Exact blockwise cosine kNN in torch (CPU or CUDA), similarities in float64. See the module docstring."""

    name = "torch"

    def search(
        self, vectors: Vectors, queries: torch.Tensor, k: int, blocks: torch.Tensor | None = None
    ) -> Neighbours:
        device = vectors.device
        f64 = torch.float64
        n_states, dim = vectors.n, vectors.dim
        n_q = queries.numel()
        k = min(k, n_states - 1)
        if n_q == 0 or k <= 0:
            return _empty(n_q, device)
        blocks = _check_blocks(blocks, n_states, device)
        _, block_of_state, size = torch.unique_consecutive(blocks, return_inverse=True, return_counts=True)
        start = torch.cumsum(size, 0) - size
        # Queries sorted by block; active blocks are those holding a query.
        q_block = block_of_state[queries]
        q_order = torch.argsort(q_block, stable=True)
        q_sorted = queries[q_order]
        q_block_sorted = q_block[q_order]
        active, q_count = torch.unique_consecutive(q_block_sorted, return_counts=True)
        q_first = torch.cumsum(q_count, 0) - q_count  # first sorted query of each active block
        width = int(size[active].max())
        k = min(k, width)
        per_chunk = max(1, _CHUNK_BYTES // (width * dim * 8))
        index_out = torch.full((n_q, k), -1, dtype=torch.long, device=device)
        sim_out = torch.zeros((n_q, k), dtype=f64, device=device)
        lane = torch.arange(width, device=device)
        bounds = torch.cat([q_first, q_first.new_tensor([n_q])]).tolist()
        # Float64 candidate and query buffers reused by every chunk (fresh large allocations are slow).
        chunk_blocks = min(per_chunk, active.numel())
        buffer = torch.empty(chunk_blocks * width, dim, dtype=f64, device=device)
        query_buffer = torch.empty(chunk_blocks * int(q_count.max()), dim, dtype=f64, device=device)
        for c0 in range(0, active.numel(), per_chunk):
            c1 = min(active.numel(), c0 + per_chunk)
            blocks_c = active[c0:c1]
            m = c1 - c0
            # Candidate table of the chunk [m, width] (state ids, -1 pads) and its float64 vectors.
            cand = torch.where(
                lane < size[blocks_c, None], start[blocks_c, None] + lane, torch.full_like(lane, -1)
            )
            x_cand = buffer[: m * width]
            x_cand.copy_(vectors.gather(cand.reshape(-1)))
            cand_norm = torch.linalg.vector_norm(x_cand, dim=1).view(m, width)
            x_cand = x_cand.view(m, width, dim)
            # The chunk's queries, padded per block: slot j, rank r inside the block.
            lo, hi = bounds[c0], bounds[c1]
            qs = q_sorted[lo:hi]
            slot = torch.repeat_interleave(torch.arange(m, device=device), q_count[c0:c1])
            rank = torch.arange(hi - lo, device=device) - (q_first[c0:c1] - lo)[slot]
            depth = int(q_count[c0:c1].max())
            pos = qs - start[q_block_sorted[lo:hi]]
            x_query = query_buffer[: m * depth].zero_()
            x_query.index_copy_(
                0, slot * depth + rank, x_cand.view(m * width, dim).index_select(0, slot * width + pos)
            )
            x_query = x_query.view(m, depth, dim)
            q_norm = torch.zeros(m * depth, dtype=f64, device=device)
            q_norm[slot * depth + rank] = cand_norm.view(-1)[slot * width + pos]
            q_norm = q_norm.view(m, depth)
            self_col = torch.full((m * depth,), -1, dtype=torch.long, device=device)
            self_col[slot * depth + rank] = pos
            self_col = self_col.view(m, depth)
            cols, valid, best = _block_top_k(x_query, q_norm, self_col, x_cand, cand_norm, cand >= 0, k)
            c = cols[slot, rank]
            v = valid[slot, rank]
            out_rows = q_order[lo:hi]
            index_out[out_rows] = torch.where(v, torch.gather(cand[slot], 1, c), torch.full_like(c, -1))
            sim_out[out_rows] = torch.where(v, best[slot, rank], torch.zeros_like(best[slot, rank]))
        return Neighbours(index=index_out, sim=sim_out)


class FaissKNN:
    """Flat inner-product faiss index over L2-normalised vectors. See the module docstring.

    Args:
        margin: extra candidates fetched beyond ``k`` so that re-ranking with exact similarities can
            resolve float32 near-ties.
        use_gpu: use a GPU index for CUDA input when faiss has GPU support (default True).
    """

    name = "faiss"
    _BLOCK_GAIN = 3.0  # > max cosine gap (2): same-block candidates always outrank other blocks

    def __init__(self, margin: int = 4, use_gpu: bool = True) -> None:
        import faiss

        self._faiss = faiss
        self.margin = int(margin)
        self.use_gpu = bool(use_gpu)
        self._gpu_resources = None

    def _index(self, dim: int, on_cuda: bool):
        faiss = self._faiss
        if on_cuda and self.use_gpu and hasattr(faiss, "StandardGpuResources"):
            if self._gpu_resources is None:
                self._gpu_resources = faiss.StandardGpuResources()
            return faiss.GpuIndexFlatIP(self._gpu_resources, dim)
        return faiss.IndexFlatIP(dim)

    def search(
        self, vectors: Vectors, queries: torch.Tensor, k: int, blocks: torch.Tensor | None = None
    ) -> Neighbours:
        device = vectors.device
        n_states = vectors.n
        n_q = queries.numel()
        k = min(k, n_states - 1)
        if n_q == 0 or k <= 0:
            return _empty(n_q, device)
        x = vectors.gather(torch.arange(n_states, device=device)).to(torch.float64)
        norms = torch.linalg.vector_norm(x, dim=1)
        unit = x / norms.clamp_min(torch.finfo(torch.float64).tiny)[:, None]
        points = unit.to(torch.float32)
        if blocks is not None:
            blocks = _check_blocks(blocks, n_states, device)
            _, block_rank = torch.unique_consecutive(blocks, return_inverse=True)
            n_blocks = int(block_rank.max()) + 1
            if n_blocks > 1:
                code = torch.zeros(n_states, n_blocks, dtype=torch.float32, device=device)
                code[torch.arange(n_states, device=device), block_rank] = self._BLOCK_GAIN**0.5
                points = torch.cat([points, code], dim=1)
        host = points.cpu().numpy()
        index = self._index(host.shape[1], device.type == "cuda")
        index.add(host)
        fetch = min(n_states, k + 1 + self.margin)
        _, found = index.search(host[queries.cpu().numpy()], fetch)
        found = torch.from_numpy(found).to(device)
        ok = (found >= 0) & (found != queries[:, None])
        safe = found.clamp_min(0)
        if blocks is not None:
            ok &= blocks[safe] == blocks[queries][:, None]
        # Exact similarities of the fetched candidates, then the tie rule among them: columns ordered by
        # state index so that select_top_k's column tie-break is the state-index rule.
        safe, perm = torch.sort(torch.where(ok, safe, torch.full_like(safe, n_states)), dim=1)
        ok = torch.gather(ok, 1, perm)
        sim = torch.einsum("qd,qfd->qf", unit[queries], unit[safe.clamp_max(n_states - 1)])
        sim = torch.where(ok, sim, torch.full_like(sim, -torch.inf))
        cols, valid = select_top_k(sim, min(k, fetch))
        index = torch.where(valid, torch.gather(safe, 1, cols), torch.full_like(cols, -1))
        sim = torch.where(
            valid, torch.gather(sim, 1, cols), torch.zeros(cols.shape, dtype=torch.float64, device=device)
        )
        return Neighbours(index=index, sim=sim)


FAISS_MIN_STATES = 2048  # crossover measured between 1,390 (torch 1.5x faster) and 2,797 states (faiss 1.35x)


class AutoKNN:
    """``TorchKNN`` or ``FaissKNN``, whichever the benchmark found faster for this search (module docstring)."""

    name = "auto"

    def __init__(self) -> None:
        self.exact = TorchKNN()
        self._faiss: FaissKNN | None = None

    def pick(self, n_states: int, blocks: torch.Tensor | None) -> KNNBackend:
        if blocks is None and n_states >= FAISS_MIN_STATES:
            if self._faiss is None:
                self._faiss = FaissKNN()
            return self._faiss
        return self.exact

    def search(
        self, vectors: Vectors, queries: torch.Tensor, k: int, blocks: torch.Tensor | None = None
    ) -> Neighbours:
        return self.pick(vectors.n, blocks).search(vectors, queries, k, blocks)


def make_knn(backend: str) -> KNNBackend:
    """``"torch"`` (exact), ``"faiss"`` or ``"auto"`` (the faster of the two for each search)."""
    if backend == "auto":
        return AutoKNN()
    if backend == "torch":
        return TorchKNN()
    if backend == "faiss":
        return FaissKNN()
    raise ValueError(f"knn_backend must be one of 'auto', 'faiss', 'torch', got {backend!r}")
