"""Step-level group RL for LLM agents: ProGPO and its baselines GRPO, GiGPO and HGPO on ALFWorld and WebShop.

The credit estimators live in ``progpo.credit``, the PPO iteration in ``progpo.algo``, rollouts in ``progpo.rollout``;
``python -m progpo.train`` trains, ``progpo.evaluate``, ``progpo.sweep``, ``progpo.fidelity``, ``progpo.report`` and
``progpo.bench`` evaluate, tune, measure and time it.
"""

import os

from progpo.hardware import onednn_cache_capacity

# oneDNN runs torch's bf16 matmuls on a CPU and caches a primitive per input shape (1,024 by default): 32 entries on
# most CPUs, 1,024 on AMX-BF16 (progpo.hardware.onednn_cache_capacity says why). Read at torch's first bf16 matmul,
# so it is set at import; a value the user exported wins.
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(onednn_cache_capacity()))
