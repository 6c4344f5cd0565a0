"""ProGPO: prefix-consistent peer comparison plus transition credit from fused state potentials.

Paper Section 4.2; the exact contract is ``docs/guide/credit.md``:

1. ``A_hier`` (Eqs. 3-5): exact-prefix groups of depths ``k = 1..history+1``; depth ``k`` is valid for a
   step when ``n_k >= 2`` and its returns are not all identical; ``A_k = (R - mu_k) / (sd_k + eps)`` averaged
   with weights ``(k+1)^alpha``; 0 with no valid depth.
2. Depth potentials (Eq. 6): ``(n_k, V_k = mu_k, var_k)`` for every depth whose prefix exists.
3. Semantic expansion (Eq. 10) of depth 1 when ``n_1 < min_value_group`` (see ``semantic``).
4. Reliability-aware fusion (Eqs. 7-8): eligible depths have ``n_k >= min_fusion_group``;
   ``w_k = n_k / (var_k + var_floor)``, ``V = sum w_k V_k / sum w_k`` (``fusion="single"``: the deepest
   eligible depth's ``V_k``). No eligible depth: V undefined.
5. Transition credit (Eq. 9): ``A_trans = V(next) - V(current)``, 0 at the last step or when undefined.
6. Composition (Eqs. 11-12): ``c = |A_hier| > eps``, ``eta = lambda_fb if c else 1``,
   ``A = A_hier + lambda_tr * eta * A_trans``.
"""

from __future__ import annotations

import torch

from .batch import StepBatch
from .groups import hierarchical_advantage, prefix_groups, segment_stats
from .knn import make_knn
from .potentials import fused_potential, transition_credit
from .result import CreditResult, check_choice, check_float, check_int, empty_result, fractions
from .returns import returns_to_go, sorted_rewards
from .semantic import semantic_expansion

__all__ = ["ProGPO"]

STATS = ("peer_zero", "transition_active", "transition_only", "still_zero", "multi_depth")


class ProGPO:
    """Progress- and reliability-oriented group credit (Eqs. 3-12). Defaults are the paper's Sec. 5.1 values.

    Args:
        gamma: discount of the returns-to-go ``R_t``, in (0, 1] (default 0.95).
        history: past observations in the deepest prefix, >= 0 (default 2, so k in {1, 2, 3}).
            ``history=0`` is the current-observation-only ablation.
        alpha: depth-weight exponent ``alpha_h`` of Eq. 5 (default 1.0).
        min_value_group: ``m`` of Eq. 10; depth-1 groups smaller than this are expanded semantically,
            >= 0 (default 3; 0 disables expansion).
        k_sem: neighbours used by the expansion, >= 0 (default 5; all candidates if fewer).
        sem_temperature: softmax temperature ``tau`` of the neighbour weights, > 0 (default 0.1; the paper
            does not give it).
        lambda_tr: scale of transition credit, >= 0 (default 0.5; 0 gives HGPO).
        lambda_fb: residual gate of transition credit where peer comparison is active, in [0, 1] (default 0.3).
        var_floor: ``eps_var`` of Eq. 7, > 0 (default 1e-3).
        min_fusion_group: smallest (expanded) group count eligible for fusion, >= 1 (default 2).
        eps: stabiliser of Eq. 4 and the "nonzero" threshold of Eq. 11 and the diagnostics (default 1e-6).
        sem_scope: ``"group"`` (neighbours from the same task group) or ``"batch"`` (any other state).
        fusion: ``"inverse_variance"`` (Eq. 8) or ``"single"`` (deepest eligible depth only).
        knn_backend: ``"auto"`` (the faster per search: torch within groups, faiss over a large batch), ``"torch"``
            (exact) or ``"faiss"`` (see ``knn``).

    Stats (fractions of the batch's steps, paper Table 2): ``peer_zero`` (not c), ``transition_active``
    (``|A_trans| > eps``), ``transition_only`` (not c and ``|A_trans| > eps``), ``still_zero``
    (``|A| <= eps``), ``multi_depth`` (among steps whose V is defined: some depth ``k >= 2`` was eligible).
    """

    def __init__(
        self,
        gamma: float = 0.95,
        history: int = 2,
        alpha: float = 1.0,
        min_value_group: int = 3,
        k_sem: int = 5,
        sem_temperature: float = 0.1,
        lambda_tr: float = 0.5,
        lambda_fb: float = 0.3,
        var_floor: float = 1e-3,
        min_fusion_group: int = 2,
        eps: float = 1e-6,
        sem_scope: str = "group",
        fusion: str = "inverse_variance",
        knn_backend: str = "auto",
    ) -> None:
        self.gamma = check_float("gamma", gamma, low=0.0, high=1.0, low_open=True)
        self.history = check_int("history", history, 0)
        self.alpha = check_float("alpha", alpha)
        self.min_value_group = check_int("min_value_group", min_value_group, 0)
        self.k_sem = check_int("k_sem", k_sem, 0)
        self.sem_temperature = check_float("sem_temperature", sem_temperature, low=0.0, low_open=True)
        self.lambda_tr = check_float("lambda_tr", lambda_tr, low=0.0)
        self.lambda_fb = check_float("lambda_fb", lambda_fb, low=0.0, high=1.0)
        self.var_floor = check_float("var_floor", var_floor, low=0.0, low_open=True)
        self.min_fusion_group = check_int("min_fusion_group", min_fusion_group, 1)
        self.eps = check_float("eps", eps, low=0.0)
        self.sem_scope = check_choice("sem_scope", sem_scope, ("group", "batch"))
        self.fusion = check_choice("fusion", fusion, ("inverse_variance", "single"))
        self.knn_backend = check_choice("knn_backend", knn_backend, ("auto", "torch", "faiss"))
        self._knn = None  # built on first use (faiss is imported only when asked for)

    def __repr__(self) -> str:
        names = (
            "gamma", "history", "alpha", "min_value_group", "k_sem", "sem_temperature", "lambda_tr",
            "lambda_fb", "var_floor", "min_fusion_group", "eps", "sem_scope", "fusion", "knn_backend",
        )  # fmt: skip
        return "ProGPO(" + ", ".join(f"{k}={getattr(self, k)!r}" for k in names) + ")"

    @property
    def knn(self):
        if self._knn is None:
            self._knn = make_knn(self.knn_backend)
        return self._knn

    def __call__(self, batch: StepBatch) -> CreditResult:
        layout = batch.layout
        n = layout.n
        if n == 0:
            return empty_result(batch.device, STATS)
        returns = returns_to_go(sorted_rewards(batch), layout, self.gamma)
        groups = prefix_groups(layout, self.history)
        stats = segment_stats(groups.seg, returns[groups.pos], groups.n_seg)
        a_hier = hierarchical_advantage(returns, groups, stats, self.alpha, self.eps)

        # Depth potentials (Eq. 6), depth 1 expanded semantically (Eq. 10).
        count, value, var = stats.count, stats.mean, stats.var
        if batch.embedding is not None and self.min_value_group > 0 and self.k_sem > 0:
            expansion = semantic_expansion(
                batch.embedding,
                returns,
                layout,
                groups,
                stats,
                min_value_group=self.min_value_group,
                k_sem=self.k_sem,
                temperature=self.sem_temperature,
                same_group=self.sem_scope == "group",
                knn=self.knn,
            )
            if expansion is not None:
                count, value, var = count.clone(), value.clone(), var.clone()
                count[expansion.states] = expansion.count
                value[expansion.states] = expansion.value
                var[expansion.states] = expansion.var

        # Reliability-aware fusion (Eqs. 7-8) and transition credit (Eq. 9).
        potential = fused_potential(
            groups,
            count,
            value,
            var,
            min_fusion_group=self.min_fusion_group,
            var_floor=self.var_floor,
            fusion=self.fusion,
        )
        a_trans = transition_credit(potential, layout)

        # Composition (Eqs. 11-12).
        peer = a_hier.abs() > self.eps
        eta = torch.where(peer, torch.full_like(a_hier, self.lambda_fb), torch.ones_like(a_hier))
        adv = a_hier + self.lambda_tr * eta * a_trans

        active = a_trans.abs() > self.eps
        out = fractions(
            {
                "peer_zero": ~peer,
                "transition_active": active,
                "transition_only": ~peer & active,
                "still_zero": adv.abs() <= self.eps,
                "multi_depth": potential.multi_depth[potential.defined],
            }
        )
        return CreditResult(
            advantage=layout.to_input_order(adv),
            returns=layout.to_input_order(returns),
            stats=out,
            parts={"a_hier": layout.to_input_order(a_hier), "a_trans": layout.to_input_order(a_trans)},
        )
