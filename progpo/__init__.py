"""Step-level group RL for LLM agents: ProGPO and its baselines GRPO, GiGPO and HGPO on ALFWorld and WebShop.

The credit estimators live in ``progpo.credit``, the PPO iteration in ``progpo.algo``, rollouts in ``progpo.rollout``;
``python -m progpo.train`` trains, ``progpo.evaluate``, ``progpo.sweep``, ``progpo.fidelity``, ``progpo.report`` and
``progpo.bench`` evaluate, tune, measure and time it.
"""

import os

# oneDNN, which runs torch's bf16 matmuls on a CPU, caches one primitive (and its buffers) per input shape, up to
# 1,024. Rollouts, scoring and updates feed it new shapes at almost every call (batch x length varies). Measured on the
# default ALFWorld run in bf16 (2 iterations, 4 runs each): peak RSS 3.1-3.2 GB in 3 of 4 runs with the default
# (2.0 in one) against 2.0-2.05 GB in all 4 with 32 entries; identical metrics, no slower.
# Read at torch's first bf16 matmul, so it is set at import; a value the user exported wins.
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "32")
