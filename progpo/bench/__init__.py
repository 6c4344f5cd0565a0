"""Benchmarks, run as ``python -m progpo.bench SUBCOMMAND``.

``credit`` (``progpo.bench.credit``): every credit estimator's wall time on a paper-scale synthetic batch.
``knn`` (``progpo.bench.credit``): ProGPO's semantic search, torch against faiss. ``iteration``
(``progpo.bench.iteration``): one training iteration's phases, float32 against bf16, against the machine's matmul
peak. ``decoding`` (``progpo.bench.decoding``): the HF engine's KV-cache loop against transformers ``generate`` on
one iteration's recorded engine calls.
"""
