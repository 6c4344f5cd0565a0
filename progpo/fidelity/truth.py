"""The Monte-Carlo truth of a batch's advantages, and the file that keeps it.

For a measured step ``t`` of a recorded trajectory, the true advantage under the sampling policy is
``A(s_t, a_t) = Q(s_t, a_t) - V(s_t)``. Both are estimated by continuations played through the collector: each
restores ``s_t`` in a fresh env of the same task by replaying the recorded actions (every replayed observation and
reward checked against the record), then
- ``Q``: takes the recorded ``a_t`` and samples with the policy to the episode's end or step limit;
- ``V``: samples a fresh action at ``s_t`` and goes on alike.
The return is the one the estimators target: ``sum_{u >= t} gamma^(u-t) r_u`` with the env's rewards.

Two estimators of ``A`` from these (``fidelity.truth_estimator``):
- ``sampled``: ``A_hat = mean(Q returns) - mean(V returns)``, the textbook one, for any engine;
- ``complement``: where the policy's probability ``p`` of ``a_t`` is known exactly (an engine that decodes only
  admissible commands reports it) the V continuations take an action *other than* ``a_t``, drawn from the policy
  renormalised over the others, and ``A = Q(a_t) - [p Q(a_t) + (1-p) Q_other] = (1-p) (Q(a_t) - Q_other)``:
  ``A_hat = (1-p) (mean(Q returns) - mean(other returns))``. Unbiased like ``sampled``, with a standard error
  ``(1-p)`` times smaller where the policy is confident: ``sampled`` spends most V continuations re-playing ``a_t``
  there, and its noise swamps a small advantage. A step whose action is not an admissible command as written (a
  WebShop search query) falls back to ``sampled`` (``FidelityTruth.complement`` says which).
Standard errors come from the sample variances. A step whose replay diverges from its record in any continuation
is dropped and counted.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from progpo.credit import StepBatch
from progpo.progress import progress_bar
from progpo.rollout.collector import ContinuedEpisode, EpisodeStart, PlayTiming
from progpo.types import Episode, Turn

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
ARRAYS = ("group", "traj", "t", "obs", "reward", "won", "steps", "q_returns", "v_returns", "p_action", "complement")


@dataclass
class FidelityTruth:
    """One batch with the Monte-Carlo truth of some of its steps: everything scoring needs, and nothing more.

    Batch arrays (``[n]``, the order of the batch's turns): ``group``, ``traj``, ``t``, ``obs``, ``reward``,
    ``embedding`` (``[n, d]`` or None), ``won`` (the step's trajectory was won). Measured steps (``[s]``):
    ``steps`` (indices into the batch), ``q_returns`` / ``v_returns`` (``[s, c]`` continuation returns; with
    ``complement`` the V continuations took another action than ``a_t``), ``p_action`` (the policy's probability of
    ``a_t``), ``complement``; ``a_hat`` and ``se`` follow. ``meta``: what was measured (env, model, seed, checkpoint,
    gamma, counts, timings).
    """

    group: np.ndarray
    traj: np.ndarray
    t: np.ndarray
    obs: np.ndarray
    reward: np.ndarray
    embedding: np.ndarray | None
    won: np.ndarray
    steps: np.ndarray
    q_returns: np.ndarray
    v_returns: np.ndarray
    p_action: np.ndarray
    complement: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def _scale(self) -> np.ndarray:
        return np.where(self.complement, 1.0 - np.nan_to_num(self.p_action), 1.0)

    @property
    def a_hat(self) -> np.ndarray:
        return self._scale * (self.q_returns.mean(axis=1) - self.v_returns.mean(axis=1))

    @property
    def se(self) -> np.ndarray:
        return self._scale * np.sqrt(self.q_returns.var(axis=1, ddof=1) / self.q_returns.shape[1]
                                     + self.v_returns.var(axis=1, ddof=1) / self.v_returns.shape[1])

    @classmethod
    def measured(cls, steps: StepBatch, won_traj: dict[int, bool], chosen: np.ndarray, played: Continuations,
                 meta: dict[str, Any]) -> FidelityTruth:
        """The truth of a batch (``steps``, as the estimators see it) from ``measure_truth``'s continuations of its
        ``chosen`` steps; the steps whose replay diverged are left out (``meta["steps_dropped"]`` counts them)."""
        kept = played.kept
        return cls(
            group=steps.group.numpy(), traj=steps.traj.numpy(), t=steps.t.numpy(), obs=steps.obs.numpy(),
            reward=steps.reward.numpy(), embedding=steps.embedding.numpy() if steps.embedding is not None else None,
            won=np.array([won_traj[int(j)] for j in steps.traj], dtype=bool),
            steps=chosen[kept], q_returns=played.q_returns[kept], v_returns=played.v_returns[kept],
            p_action=played.p_action[kept], complement=played.complement[kept],
            meta={**meta, "steps_dropped": int((~kept).sum())},
        )

    def estimates(self, estimator: Any, batch: StepBatch | None = None) -> np.ndarray:
        """``estimator``'s advantages on the measured steps (it scores the whole batch, as in training); ``batch``:
        ``step_batch()`` built once by a caller that scores many estimators."""
        batch = batch if batch is not None else self.step_batch()
        return estimator(batch).advantage.double().cpu().numpy()[self.steps]

    def step_batch(self) -> StepBatch:
        """The estimators' view of the batch, as training built it."""
        return StepBatch(
            group=torch.from_numpy(self.group), traj=torch.from_numpy(self.traj), t=torch.from_numpy(self.t),
            obs=torch.from_numpy(self.obs), reward=torch.from_numpy(self.reward),
            embedding=torch.from_numpy(self.embedding) if self.embedding is not None else None,
        )

    def save(self, path: str | Path) -> Path:
        """A ``.npz`` file (no pickle), written atomically."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        arrays = {name: getattr(self, name) for name in ARRAYS}
        if self.embedding is not None:
            arrays["embedding"] = self.embedding
        meta = json.dumps({**self.meta, "format_version": FORMAT_VERSION})
        partial = path.with_name(path.name + ".partial")
        with open(partial, "wb") as handle:
            np.savez_compressed(handle, meta=np.array(meta), **arrays)
        partial.replace(path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> FidelityTruth:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no fidelity truth file at {path} (python -m progpo.fidelity writes one, "
                                    f"fidelity.save=...)")
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
            if meta.get("format_version") != FORMAT_VERSION:
                raise ValueError(f"{path}: fidelity truth format {meta.get('format_version')}, this progpo reads "
                                 f"{FORMAT_VERSION}; measure it again with python -m progpo.fidelity")
            return cls(**{name: data[name] for name in ARRAYS},
                       embedding=data["embedding"] if "embedding" in data else None, meta=meta)


def discounted_return(rewards: Sequence[float], start: int, gamma: float) -> float:
    """``sum_{u >= start} gamma^(u-start) r_u``."""
    tail = np.asarray(rewards[start:], dtype=np.float64)
    return float((tail * gamma ** np.arange(len(tail))).sum())


def continuation_starts(turns: list[Turn], episodes: list[Episode], step: int, continuations: int,
                        complement: bool) -> tuple[list[EpisodeStart], list[EpisodeStart]]:
    """The ``Q`` starts (replay ``a_0..a_t``) and ``V`` starts (replay ``a_0..a_{t-1}``; with ``complement`` their
    first sampled action leaves ``a_t`` out) of ``turns[step]``."""
    turn = turns[step]
    own = sorted((x for x in turns if x.traj == turn.traj), key=lambda x: x.t)
    task = next(e.task for e in episodes if e.traj == turn.traj)
    before = own[: turn.t]
    obs_through_t = tuple(x.obs_id for x in own[: turn.t + 1])
    v_start = EpisodeStart(task, tuple(x.action for x in before), obs_through_t, tuple(x.reward for x in before),
                           exclude_first=turn.action if complement else None)
    after = own[: turn.t + 1]
    next_obs = (own[turn.t + 1].obs_id,) if turn.t + 1 < len(own) else ()
    q_start = EpisodeStart(task, tuple(x.action for x in after), obs_through_t + next_obs,
                           tuple(x.reward for x in after))
    return [q_start] * continuations, [v_start] * continuations


def play_continuations(collector, starts: list[EpisodeStart], chunk: int, timing: PlayTiming
                       ) -> list[ContinuedEpisode]:
    """All ``starts`` through ``collector.continue_from``, ``chunk`` envs at a time, with a progress bar; the
    episodes come back in the order of ``starts``.

    Starts are played sorted by task, so that an env mostly resets to the game it already holds (an ALFWorld env
    keeps its loaded game between episodes), and in chunks of equal size, so the collector builds one env pool.
    """
    order = sorted(range(len(starts)), key=lambda i: (starts[i].task.task_id, len(starts[i].actions), i))
    n_chunks = -(-len(starts) // chunk)
    size = -(-len(starts) // n_chunks)
    played: list[ContinuedEpisode | None] = [None] * len(starts)
    with progress_bar(total=len(starts), desc="continuations", unit="ep", mininterval=5) as bar:
        for first in range(0, len(order), size):
            part = order[first : first + size]
            padded = part + [part[-1]] * (size - len(part))  # the last chunk reuses the pool (extra runs dropped)
            batch = collector.continue_from([starts[i] for i in padded])
            timing.add(replace(batch.timing, episodes=len(part)))  # a chunk's padding is timed, not counted
            for i, episode in zip(part, batch.episodes):
                played[i] = episode
            bar.update(len(part))
    return played  # type: ignore[return-value]


@dataclass
class Continuations:
    """``measure_truth``'s outcome for ``s`` steps: returns (``[s, c]``), the action probabilities, which steps
    used the complement estimator, which were kept (every replay matched), and the time split."""

    q_returns: np.ndarray
    v_returns: np.ndarray
    p_action: np.ndarray
    complement: np.ndarray
    kept: np.ndarray
    timing: PlayTiming


def action_probability(turn: Turn) -> float:
    """The sampling policy's probability of the turn's response (its action's, under constrained decoding)."""
    return float(np.exp(np.sum(turn.sample_logprobs, dtype=np.float64)))


def measure_truth(collector, turns: list[Turn], episodes: list[Episode], steps: np.ndarray, continuations: int,
                  gamma: float, chunk: int, complement: bool = False) -> Continuations:
    """Q and V continuation returns of ``turns[steps]``; ``complement``: V continuations leave ``a_t`` out (only
    exact where the engine decodes only admissible commands, so that a response's probability is its action's)."""
    q_starts: list[EpisodeStart] = []
    v_starts: list[EpisodeStart] = []
    for step in steps:
        q, v = continuation_starts(turns, episodes, int(step), continuations, complement)
        q_starts += q
        v_starts += v
    timing = PlayTiming()
    played = play_continuations(collector, q_starts + v_starts, chunk, timing)
    s = len(steps)
    q_played, v_played = played[: s * continuations], played[s * continuations :]
    q_returns = np.zeros((s, continuations))
    v_returns = np.zeros((s, continuations))
    kept = np.ones(s, dtype=bool)
    excluded = np.array([[v_played[k * continuations + c].excluded for c in range(continuations)] for k in range(s)])
    used_complement = excluded.all(axis=1)
    kept &= used_complement | ~excluded.any(axis=1)  # all or none of a step's V continuations left a_t out
    for k, step in enumerate(steps):
        t = turns[int(step)].t
        for c in range(continuations):
            for returns, episode in ((q_returns, q_played[k * continuations + c]),
                                     (v_returns, v_played[k * continuations + c])):
                if episode.diverged_at is not None or episode.error:
                    kept[k] = False
                else:
                    returns[k, c] = discounted_return(episode.rewards, t, gamma)
    if not kept.all():
        log.warning("%d of %d measured steps dropped: a replay of their prefix differed from the record",
                    int((~kept).sum()), s)
    p_action = np.array([action_probability(turns[int(step)]) for step in steps])
    return Continuations(q_returns, v_returns, p_action, used_complement, kept, timing)
