"""Plain-Python reference of the credit estimators, written from ``docs/guide/credit.md`` alone.

Dictionaries and for-loops over Python floats only: no torch, no numpy vectorisation, no code shared with
``progpo.credit``. The vectorised estimators must agree with these functions to 1e-6.

A batch here is a list of ``Step`` records in input order. Every function returns
``(advantage, returns, stats)`` with lists in input order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SPREAD_TOL = 1e-9


@dataclass
class Step:
    group: int
    traj: int
    t: int
    obs: int
    reward: float
    embedding: list[float] | None = None


def steps_from_arrays(group, traj, t, obs, reward, embedding=None) -> list[Step]:
    out = []
    for i in range(len(group)):
        emb = None if embedding is None else [float(v) for v in embedding[i]]
        out.append(Step(int(group[i]), int(traj[i]), int(t[i]), int(obs[i]), float(reward[i]), emb))
    return out


# -- shared quantities ---------------------------------------------------------------------------------


def index_by_traj(steps: list[Step]) -> dict[int, dict[int, int]]:
    """traj -> {t: input index}."""
    table: dict[int, dict[int, int]] = {}
    for i, s in enumerate(steps):
        table.setdefault(s.traj, {})[s.t] = i
    return table


def returns_to_go(steps: list[Step], gamma: float) -> list[float]:
    by_traj = index_by_traj(steps)
    out = [0.0] * len(steps)
    for rows in by_traj.values():
        running = 0.0
        for t in range(len(rows) - 1, -1, -1):
            i = rows[t]
            running = steps[i].reward + gamma * running
            out[i] = running
    return out


def prefix(steps: list[Step], by_traj, i: int, k: int):
    """P_k(i) = (group, o_{t-k+1}, ..., o_t), or None when t < k-1."""
    s = steps[i]
    if s.t < k - 1:
        return None
    rows = by_traj[s.traj]
    return (s.group,) + tuple(steps[rows[u]].obs for u in range(s.t - k + 1, s.t + 1))


def mean(xs):
    return sum(xs) / len(xs)


def pop_var(xs):
    m = mean(xs)
    return sum((x - m) ** 2 for x in xs) / len(xs)


def not_all_identical(xs) -> bool:
    return max(xs) - min(xs) > SPREAD_TOL


def relative(x, xs, eps, normalize_std=True):
    """(x - mean) / (sd + eps) when the group has >= 2 members and non-identical values, else 0."""
    if len(xs) < 2 or not not_all_identical(xs):
        return 0.0
    dev = x - mean(xs)
    return dev / (math.sqrt(pop_var(xs)) + eps) if normalize_std else dev


def prefix_groups(steps, by_traj, depths):
    """k -> {prefix: [input indices]} for k in depths."""
    groups = {}
    for k in depths:
        table: dict[tuple, list[int]] = {}
        for i in range(len(steps)):
            key = prefix(steps, by_traj, i, k)
            if key is not None:
                table.setdefault(key, []).append(i)
        groups[k] = table
    return groups


def fraction(flags):
    return sum(1 for f in flags if f) / len(flags) if flags else 0.0


# -- GRPO and GiGPO ------------------------------------------------------------------------------------


def episode_advantages(steps, normalize_std, eps) -> list[float]:
    episode: dict[int, float] = {}
    traj_group: dict[int, int] = {}
    for s in steps:
        episode[s.traj] = episode.get(s.traj, 0.0) + s.reward
        traj_group[s.traj] = s.group
    members: dict[int, list[float]] = {}
    for traj, g in traj_group.items():
        members.setdefault(g, []).append(episode[traj])
    adv_traj = {tr: relative(episode[tr], members[traj_group[tr]], eps, normalize_std) for tr in episode}
    return [adv_traj[s.traj] for s in steps]


def grpo(steps, normalize_std=True, eps=1e-6):
    adv = episode_advantages(steps, normalize_std, eps)
    zero = [abs(a) <= eps for a in adv]
    return adv, returns_to_go(steps, 1.0), {"peer_zero": fraction(zero), "still_zero": fraction(zero)}


def gigpo(steps, gamma=0.95, omega=1.0, normalize_std=True, eps=1e-6):
    by_traj = index_by_traj(steps)
    R = returns_to_go(steps, gamma)
    episode = episode_advantages(steps, normalize_std, eps)
    anchor = prefix_groups(steps, by_traj, [1])[1]
    step_adv = []
    for i in range(len(steps)):
        peers = [R[j] for j in anchor[prefix(steps, by_traj, i, 1)]]
        step_adv.append(relative(R[i], peers, eps, normalize_std))
    adv = [episode[i] + omega * step_adv[i] for i in range(len(steps))]
    stats = {
        "peer_zero": fraction([abs(a) <= eps for a in step_adv]),
        "still_zero": fraction([abs(a) <= eps for a in adv]),
    }
    return adv, R, stats


# -- HGPO and ProGPO -----------------------------------------------------------------------------------


def hierarchical(steps, by_traj, R, groups, alpha, eps) -> list[float]:
    out = []
    for i in range(len(steps)):
        num = den = 0.0
        for k in sorted(groups):
            key = prefix(steps, by_traj, i, k)
            if key is None:
                continue
            peers = [R[j] for j in groups[k][key]]
            if len(peers) >= 2 and not_all_identical(peers):
                a_k = (R[i] - mean(peers)) / (math.sqrt(pop_var(peers)) + eps)
                weight = (k + 1) ** alpha
                num += weight * a_k
                den += weight
        out.append(num / den if den > 0 else 0.0)
    return out


def hgpo(steps, gamma=0.95, history=2, alpha=1.0, eps=1e-6):
    by_traj = index_by_traj(steps)
    R = returns_to_go(steps, gamma)
    groups = prefix_groups(steps, by_traj, range(1, history + 2))
    adv = hierarchical(steps, by_traj, R, groups, alpha, eps)
    zero = [abs(a) <= eps for a in adv]
    return adv, R, {"peer_zero": fraction(zero), "still_zero": fraction(zero)}


def normalised(vec):
    norm = math.sqrt(sum(v * v for v in vec))
    return [v / norm for v in vec] if norm > 0 else [0.0 for _ in vec]


def dot(a, b):
    return sum(x * y for x, y in zip(a, b))


def expand_states(steps, R, depth1, min_value_group, k_sem, tau, sem_scope):
    """Semantic expansion: {state key: (n', V', var')} for the states with n_1 < m."""
    embedding, value = {}, {}
    for key, rows in depth1.items():
        dim = len(steps[rows[0]].embedding)
        mean_vec = [sum(steps[j].embedding[c] for j in rows) / len(rows) for c in range(dim)]
        embedding[key] = normalised(mean_vec)
        value[key] = mean([R[j] for j in rows])
    expanded = {}
    for key, rows in depth1.items():
        if len(rows) >= min_value_group:
            continue
        candidates = [c for c in depth1 if c != key and (sem_scope == "batch" or c[0] == key[0])]
        # Highest similarity first; ties by the smaller (group, obs) key.
        ranked = sorted(candidates, key=lambda c: (-dot(embedding[key], embedding[c]), c))
        taken = ranked[:k_sem]
        sims = [dot(embedding[key], embedding[c]) for c in taken]
        if taken:
            top = max(s / tau for s in sims)
            exps = [math.exp(s / tau - top) for s in sims]
            weights = [e / sum(exps) for e in exps]
        else:
            weights = []
        own = [R[j] for j in rows]
        n_new = len(own) + (1.0 if taken else 0.0)  # the softmax weights sum to 1 (spec)
        v_new = (sum(own) + sum(w * value[c] for w, c in zip(weights, taken))) / n_new
        var_new = (
            sum((r - v_new) ** 2 for r in own)
            + sum(w * (value[c] - v_new) ** 2 for w, c in zip(weights, taken))
        ) / n_new
        expanded[key] = (n_new, v_new, var_new)
    return expanded


def progpo(
    steps,
    gamma=0.95,
    history=2,
    alpha=1.0,
    min_value_group=3,
    k_sem=5,
    sem_temperature=0.1,
    lambda_tr=0.5,
    lambda_fb=0.3,
    var_floor=1e-3,
    min_fusion_group=2,
    eps=1e-6,
    sem_scope="group",
    fusion="inverse_variance",
    knn_backend="auto",
):
    del knn_backend  # a speed choice of the vectorised code, not part of the maths
    n = len(steps)
    by_traj = index_by_traj(steps)
    R = returns_to_go(steps, gamma)
    depths = list(range(1, history + 2))
    groups = prefix_groups(steps, by_traj, depths)
    a_hier = hierarchical(steps, by_traj, R, groups, alpha, eps)

    use_sem = steps and steps[0].embedding is not None and min_value_group > 0 and k_sem > 0
    expanded = (
        expand_states(steps, R, groups[1], min_value_group, k_sem, sem_temperature, sem_scope)
        if use_sem
        else {}
    )

    potential: list[float | None] = []
    multi: list[bool] = []
    for i in range(n):
        entries = []  # (k, n_k, V_k, var_k) for the eligible depths
        for k in depths:
            key = prefix(steps, by_traj, i, k)
            if key is None:
                continue
            if k == 1 and key in expanded:
                n_k, v_k, var_k = expanded[key]
            else:
                rs = [R[j] for j in groups[k][key]]
                n_k, v_k, var_k = len(rs), mean(rs), pop_var(rs)
            if n_k >= min_fusion_group:
                entries.append((k, n_k, v_k, var_k))
        if not entries:
            potential.append(None)
            multi.append(False)
            continue
        multi.append(any(k >= 2 for k, *_ in entries))
        if fusion == "single":
            potential.append(max(entries)[2])
        else:
            ws = [n_k / (var_k + var_floor) for _, n_k, _, var_k in entries]
            potential.append(sum(w * e[2] for w, e in zip(ws, entries)) / sum(ws))

    adv, a_trans = [], []
    for i, s in enumerate(steps):
        nxt = by_traj[s.traj].get(s.t + 1)
        if nxt is None or potential[i] is None or potential[nxt] is None:
            a_trans.append(0.0)
        else:
            a_trans.append(potential[nxt] - potential[i])
        c = abs(a_hier[i]) > eps
        eta = lambda_fb if c else 1.0
        adv.append(a_hier[i] + lambda_tr * eta * a_trans[i])

    peer = [abs(a) > eps for a in a_hier]
    active = [abs(a) > eps for a in a_trans]
    defined = [i for i in range(n) if potential[i] is not None]
    stats = {
        "peer_zero": fraction([not c for c in peer]),
        "transition_active": fraction(active),
        "transition_only": fraction([(not c) and a for c, a in zip(peer, active)]),
        "still_zero": fraction([abs(a) <= eps for a in adv]),
        "multi_depth": fraction([multi[i] for i in defined]),
    }
    return adv, R, stats
