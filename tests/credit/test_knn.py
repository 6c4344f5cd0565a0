"""kNN backends: exact neighbours, the tie rule, block restriction, and faiss == torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from progpo.credit import FaissKNN, ProGPO, StepBatch, TorchKNN
from progpo.credit.knn import TensorVectors

from .batches import random_arrays


def brute_force(x: torch.Tensor, queries, k, blocks=None):
    """Reference neighbours: sort other (same-block) states by (-cosine, index)."""
    unit = x.double() / x.double().norm(dim=1, keepdim=True)
    sim = unit @ unit.T
    out = []
    for q in queries.tolist():
        cands = [j for j in range(x.shape[0]) if j != q and (blocks is None or blocks[j] == blocks[q])]
        cands.sort(key=lambda j: (-float(sim[q, j]), j))
        out.append(set(cands[:k]))
    return out, sim


def as_sets(nb):
    return [{int(i) for i in row if i >= 0} for row in nb.index]


@pytest.mark.parametrize("backend", [TorchKNN, FaissKNN])
@pytest.mark.parametrize("with_blocks", [False, True])
@pytest.mark.parametrize("k", [1, 3, 7, 100])
def test_exact_neighbours(backend, with_blocks, k):
    gen = torch.Generator().manual_seed(k)
    n = 60
    x = torch.randn(n, 16, generator=gen)
    blocks = torch.sort(torch.randint(0, 6, (n,), generator=gen)).values if with_blocks else None
    queries = torch.randperm(n, generator=gen)[:25]
    nb = backend().search(TensorVectors(x), queries, k, blocks)
    expected, sim = brute_force(x, queries, k, blocks)
    assert as_sets(nb) == expected
    for row, q in enumerate(queries.tolist()):
        for col in range(nb.index.shape[1]):
            j = int(nb.index[row, col])
            if j >= 0:
                assert float(nb.sim[row, col]) == pytest.approx(float(sim[q, j]), abs=1e-12)
            else:
                assert float(nb.sim[row, col]) == 0.0


def test_faiss_and_torch_give_the_same_neighbours_on_paper_sized_vectors():
    gen = torch.Generator().manual_seed(0)
    base = torch.randn(40, 256, generator=gen)
    x = base[torch.randint(0, 40, (300,), generator=gen)] + 0.5 * torch.randn(300, 256, generator=gen)
    blocks = torch.arange(300) // 20
    queries = torch.arange(0, 300, 3)
    for b in (None, blocks):
        a = TorchKNN().search(TensorVectors(x), queries, 5, b)
        f = FaissKNN().search(TensorVectors(x), queries, 5, b)
        assert as_sets(a) == as_sets(f)
        torch.testing.assert_close(
            torch.sort(a.sim, 1).values, torch.sort(f.sim, 1).values, atol=1e-6, rtol=0
        )


def test_ties_go_to_the_smaller_state_index():
    x = torch.tensor([[1.0, 1.0], [1.0, 0.0], [2.0, 0.0], [3.0, 0.0], [0.0, 1.0]])
    # From state 0, states 1, 2, 3 (same direction) and 4 all have cosine 1/sqrt(2).
    for backend in (TorchKNN(), FaissKNN()):
        nb = backend.search(TensorVectors(x), torch.tensor([0, 2]), 2)
        assert as_sets(nb) == [{1, 2}, {1, 3}]


def test_zero_vectors_have_zero_similarity():
    x = torch.tensor([[1.0, 0.0], [0.0, 0.0], [-1.0, 0.1]])
    nb = TorchKNN().search(TensorVectors(x), torch.tensor([0, 1]), 2)
    assert as_sets(nb) == [{1, 2}, {0, 2}]
    assert torch.all(nb.sim[1] == 0)


def test_blocks_must_be_grouped():
    with pytest.raises(ValueError, match="blocks: must be non-decreasing"):
        TorchKNN().search(TensorVectors(torch.randn(3, 2)), torch.tensor([0]), 1, torch.tensor([1, 0, 1]))


def test_progpo_backends_agree_on_a_realistic_batch():
    arrays = random_arrays(np.random.default_rng(5), n_groups=5, max_rollouts=8, max_len=30, vocab=12, dim=128,
                           dtype=np.float32)  # fmt: skip
    batch = StepBatch(**arrays.fields())
    for scope in ("group", "batch"):
        a = ProGPO(sem_scope=scope, knn_backend="torch")(batch)
        b = ProGPO(sem_scope=scope, knn_backend="faiss")(batch)
        torch.testing.assert_close(a.advantage, b.advantage, atol=1e-6, rtol=0)


def test_large_single_block_is_tiled():
    """sem_scope='batch' with many states: the similarity is computed in row tiles, same answer."""
    import progpo.credit.knn as knn

    gen = torch.Generator().manual_seed(1)
    x = torch.randn(500, 8, generator=gen)
    queries = torch.arange(0, 500, 2)
    full = TorchKNN().search(TensorVectors(x), queries, 4)
    old = knn._TILE
    knn._TILE = 1000
    try:
        tiled = TorchKNN().search(TensorVectors(x), queries, 4)
    finally:
        knn._TILE = old
    assert as_sets(full) == as_sets(tiled)


def test_many_blocks_are_chunked():
    """Blocks are processed in cache-sized chunks; a tiny chunk budget gives the same neighbours."""
    import progpo.credit.knn as knn

    gen = torch.Generator().manual_seed(2)
    x = torch.randn(400, 8, generator=gen)
    blocks = torch.sort(torch.randint(0, 40, (400,), generator=gen)).values
    queries = torch.randperm(400, generator=gen)[:150]
    full = TorchKNN().search(TensorVectors(x), queries, 3, blocks)
    old = knn._CHUNK_BYTES
    knn._CHUNK_BYTES = 1
    try:
        chunked = TorchKNN().search(TensorVectors(x), queries, 3, blocks)
    finally:
        knn._CHUNK_BYTES = old
    assert as_sets(full) == as_sets(chunked) == brute_force(x, queries, 3, blocks)[0]


def test_auto_uses_faiss_only_for_large_unrestricted_searches_and_finds_the_exact_neighbours():
    from progpo.credit.knn import FAISS_MIN_STATES, AutoKNN, make_knn

    auto = make_knn("auto")
    assert isinstance(auto, AutoKNN)
    blocks = torch.zeros(FAISS_MIN_STATES, dtype=torch.long)
    assert isinstance(auto.pick(FAISS_MIN_STATES, None), FaissKNN)
    assert isinstance(auto.pick(FAISS_MIN_STATES, blocks), TorchKNN)  # group scope: torch was faster
    assert isinstance(auto.pick(FAISS_MIN_STATES - 1, None), TorchKNN)  # small batch: torch was faster
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(FAISS_MIN_STATES + 50, 32, generator=gen)
    queries = torch.randperm(x.shape[0], generator=gen)[:20]
    expected, _ = brute_force(x, queries, 5)
    assert as_sets(auto.search(TensorVectors(x), queries, 5)) == expected
