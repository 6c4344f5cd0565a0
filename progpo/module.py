"""ProGPOModule: the actor, its frozen reference, a credit estimator and the clipped-surrogate update.

One Lightning epoch is one RL iteration: ``training_step`` receives the rollout batch that the DataModule just
collected with the current policy, computes old/ref log-probs and the semantic embeddings in one no-grad pass
each, turns the batch into step advantages with the configured estimator, and runs PPO epochs of minibatch
updates (manual optimisation). ``validation_step`` receives an evaluation rollout on the held-out tasks.
"""

from __future__ import annotations

import logging
import math
import random
import time
from dataclasses import dataclass

import lightning as L
import numpy as np
import torch

from progpo.config import TrainerConfig
from progpo.credit import StepBatch
from progpo.loss import ppo_loss
from progpo.models.logprobs import forward_logprobs, pad_prompt_response
from progpo.rollout.collector import RolloutBatch, Turn

log = logging.getLogger(__name__)


@dataclass
class ScoredTurns:
    """Per-turn tensors of one iteration, in the order of ``RolloutBatch.turns``."""

    old_logprobs: list[torch.Tensor]  # each [len(response)]
    ref_logprobs: list[torch.Tensor] | None
    embeddings: torch.Tensor  # [n, d]


class ProGPOModule(L.LightningModule):
    """Actor + reference + credit estimator + loss. The reference is not a registered submodule: it is rebuilt
    from the model config on resume, so checkpoints hold the actor and optimizer only."""

    def __init__(self, policy, reference: torch.nn.Module | None, credit, trainer_cfg: TrainerConfig) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.actor = policy.model
        self.pad_token_id = _pad_id(policy.tokenizer)
        self._reference = [reference]  # a list keeps it out of state_dict() and parameters()
        self.credit = credit
        self.cfg = trainer_cfg
        self.iterations_done = 0
        self.initial_eval: dict[str, float] | None = None
        self.last_eval: dict[str, float] | None = None
        self.last_val_iteration = -1
        self.history: list[dict[str, float]] = []
        self.logger_run_id: str | None = None
        self.last_batch: RolloutBatch | None = None
        self.last_credit = None  # CreditResult of the last iteration (for trajectory tables)
        self.tokenizer = policy.tokenizer

    @property
    def reference(self) -> torch.nn.Module | None:
        return self._reference[0]

    def on_fit_start(self) -> None:
        self.actor.train()

    def configure_optimizers(self):
        params = [p for p in self.actor.parameters() if p.requires_grad]
        return torch.optim.AdamW(params, lr=self.cfg.lr, weight_decay=self.cfg.weight_decay)

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        return batch  # python objects; tensors are built on the right device in the step

    # ------------------------------------------------------------------ scoring
    def _micro_batches(self, turns: list[Turn], indices: list[int]):
        size = self.cfg.micro_batch_size
        for start in range(0, len(indices), size):
            idx = indices[start : start + size]
            tokens = pad_prompt_response(
                [turns[i].prompt_ids for i in idx],
                [turns[i].response_ids for i in idx],
                self.pad_token_id,
                device=self.device,
            )
            yield idx, tokens

    @torch.no_grad()
    def score_turns(self, turns: list[Turn]) -> ScoredTurns:
        """Old and reference log-probs of every response token, and the last-prompt-token embedding.

        Identical turns (same prompt, response and allowed ids: the N rollouts' shared first step, or a policy
        going round a loop, which with a K-step history shows the same prompt again) are scored once and shared.
        """
        representative = _first_of_each(turns)
        order = sorted(set(representative), key=lambda i: _seq_len(turns[i]))
        old: list[torch.Tensor | None] = [None] * len(turns)
        ref: list[torch.Tensor | None] = [None] * len(turns)
        embeddings: list[torch.Tensor | None] = [None] * len(turns)
        need_ref = self.reference is not None and self.cfg.kl_coef > 0
        self.actor.eval()
        for idx, tokens in self._micro_batches(turns, order):
            allowed = _allowed(turns, idx)
            with self._autocast():
                out = forward_logprobs(
                    self.actor, tokens.input_ids, tokens.attention_mask, tokens.response_mask,
                    return_last_prompt_hidden=True, allowed=allowed,
                )
                ref_out = (
                    forward_logprobs(
                        self.reference, tokens.input_ids, tokens.attention_mask, tokens.response_mask,
                        allowed=allowed,
                    )
                    if need_ref
                    else None
                )
            mask = tokens.response_mask.bool()
            for row, i in enumerate(idx):
                old[i] = out.token_logprobs[row][mask[row]].float()
                if ref_out is not None:
                    ref[i] = ref_out.token_logprobs[row][mask[row]].float()
                embeddings[i] = out.last_prompt_hidden[row].float()
        for i, rep in enumerate(representative):
            old[i], ref[i], embeddings[i] = old[rep], ref[rep], embeddings[rep]
        self.actor.train()
        return ScoredTurns(
            old_logprobs=old,  # type: ignore[arg-type]
            ref_logprobs=ref if need_ref else None,  # type: ignore[arg-type]
            embeddings=torch.stack(embeddings),  # type: ignore[arg-type]
        )

    def step_batch(self, batch: RolloutBatch, embeddings: torch.Tensor | None) -> StepBatch:
        turns = batch.turns
        return StepBatch(
            group=torch.tensor([t.group for t in turns], dtype=torch.long),
            traj=torch.tensor([t.traj for t in turns], dtype=torch.long),
            t=torch.tensor([t.t for t in turns], dtype=torch.long),
            obs=torch.tensor([t.obs_id for t in turns], dtype=torch.long),
            reward=torch.tensor([t.reward for t in turns], dtype=torch.float64),
            embedding=embeddings.detach().to("cpu", torch.float32) if embeddings is not None else None,
        )

    # ------------------------------------------------------------------ training
    def training_step(self, batch: RolloutBatch, batch_idx: int):
        iteration = self.current_epoch
        turns = batch.turns
        t0 = time.perf_counter()
        scored = self.score_turns(turns)
        t_score = time.perf_counter() - t0

        t0 = time.perf_counter()
        result = self.credit(self.step_batch(batch, scored.embeddings))
        t_credit = time.perf_counter() - t0
        advantages = result.advantage.to(torch.float32)
        self.last_batch, self.last_credit = batch, result

        t0 = time.perf_counter()
        loss_metrics = self._ppo_update(turns, scored, advantages)
        t_update = time.perf_counter() - t0

        metrics = batch.metrics("train")
        metrics.update({f"credit/{k}": float(v) for k, v in result.stats.items()})
        metrics.update(loss_metrics)
        metrics.update(
            {
                "train/advantage_abs_mean": float(advantages.abs().mean()) if len(advantages) else 0.0,
                "train/steps": float(len(turns)),
                "perf/rollout_s": batch.rollout_seconds,
                "perf/score_s": t_score,
                "perf/credit_s": t_credit,
                "perf/update_s": t_update,
                "perf/env_steps_per_s": batch.env_steps / max(batch.rollout_seconds, 1e-9),
                "perf/tokens_per_s": batch.generated_tokens / max(batch.rollout_seconds, 1e-9),
                "perf/prompt_truncated": float(np.mean([t.prompt_truncated for t in turns])) if turns else 0.0,
            }
        )
        self.iterations_done = iteration + 1
        self._record(metrics, step=self.iterations_done)
        return None

    def _ppo_update(self, turns: list[Turn], scored: ScoredTurns, advantages: torch.Tensor) -> dict[str, float]:
        opt = self.optimizers()
        trainable = [i for i, t in enumerate(turns) if len(t.response_ids) > 0]
        if self.cfg.skip_zero_advantage:
            # A step whose advantage is exactly 0 (e.g. every rollout of its task failed) has no policy
            # gradient; leaving it out saves its forward/backward, and KL/entropy act on the updated steps.
            nonzero = (advantages != 0).tolist()
            trainable = [i for i in trainable if nonzero[i]]
        sums: dict[str, float] = {}
        n_minibatches = 0
        generator = torch.Generator().manual_seed(int(torch.initial_seed() % (2**31)) + self.current_epoch)
        for _ in range(self.cfg.ppo_epochs):
            perm = [trainable[i] for i in torch.randperm(len(trainable), generator=generator).tolist()]
            for start in range(0, len(perm), self.cfg.minibatch_size):
                minibatch = perm[start : start + self.cfg.minibatch_size]
                n_tokens = sum(len(turns[i].response_ids) for i in minibatch)
                opt.zero_grad(set_to_none=True)
                parts: dict[str, float] = {}
                for idx, tokens in self._micro_batches(turns, sorted(minibatch, key=lambda i: _seq_len(turns[i]))):
                    mask = tokens.response_mask.bool()
                    old = _scatter_rows(scored.old_logprobs, idx, mask)
                    ref = _scatter_rows(scored.ref_logprobs, idx, mask) if scored.ref_logprobs else None
                    adv = advantages[idx].to(self.device)
                    with self._autocast():
                        out = forward_logprobs(
                            self.actor, tokens.input_ids, tokens.attention_mask, tokens.response_mask,
                            return_entropy=True, allowed=_allowed(turns, idx),
                        )
                    loss_out = ppo_loss(
                        out.token_logprobs, old, ref, adv, tokens.response_mask,
                        clip_ratio=self.cfg.clip_ratio,
                        kl_coef=self.cfg.kl_coef if ref is not None else 0.0,
                        entropy=out.entropy,
                        entropy_coef=self.cfg.entropy_coef,
                        token_normalizer=float(n_tokens),
                    )
                    self.manual_backward(loss_out.loss)
                    for name in ("loss", "policy_loss", "kl", "clip_fraction", "approx_kl", "entropy"):
                        parts[name] = parts.get(name, 0.0) + float(getattr(loss_out, name).detach())
                grad_norm = torch.nn.utils.clip_grad_norm_(
                    [p for p in self.actor.parameters() if p.requires_grad], self.cfg.grad_clip
                )
                opt.step()
                parts["grad_norm"] = float(grad_norm)
                for name, value in parts.items():
                    sums[name] = sums.get(name, 0.0) + value
                n_minibatches += 1
        names = {"loss": "loss/total", "policy_loss": "loss/policy", "kl": "loss/kl",
                 "clip_fraction": "loss/clip_fraction", "approx_kl": "loss/approx_kl",
                 "entropy": "loss/entropy", "grad_norm": "loss/grad_norm"}
        # No minibatch (every step skipped): the loss terms of an empty update are 0, so every iteration logs
        # the same keys and curves have no holes.
        out = {names[k]: sums.get(k, 0.0) / max(n_minibatches, 1) for k in names}
        out["train/steps_updated"] = float(len(trainable))
        return out

    # ------------------------------------------------------------------ validation
    def validation_step(self, batch: RolloutBatch, batch_idx: int):
        metrics = batch.metrics("val")
        metrics["perf/val_rollout_s"] = batch.rollout_seconds
        if self.initial_eval is None:
            self.initial_eval = dict(metrics)
        self.last_eval = dict(metrics)
        self.last_val_iteration = self.iterations_done
        self._record(metrics, step=self.iterations_done)
        return None

    # ------------------------------------------------------------------ bookkeeping
    def _record(self, metrics: dict[str, float], step: int) -> None:
        clean = {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}
        self.history.append({"step": float(step), **clean})
        if self.logger is not None:
            self.logger.log_metrics(clean, step=step)
        for key in ("train/success", "val/success"):
            if key in clean:
                self.log(key, clean[key], logger=False, prog_bar=False, batch_size=1, on_epoch=True)

    def _autocast(self):
        if self.device.type == "cuda" and self.cfg.precision.startswith("bf16"):
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return torch.autocast("cpu", enabled=False)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["progpo"] = {
            "iterations_done": self.iterations_done,
            "initial_eval": self.initial_eval,
            "last_eval": self.last_eval,
            "last_val_iteration": self.last_val_iteration,
            "history": self.history,
            "logger_run_id": self.logger_run_id,
            "rng": {
                "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
                "numpy": np.random.get_state(),
                "python": random.getstate(),
            },
        }

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        state = checkpoint.get("progpo", {})
        self.iterations_done = state.get("iterations_done", 0)
        self.initial_eval = state.get("initial_eval")
        self.last_eval = state.get("last_eval")
        self.last_val_iteration = state.get("last_val_iteration", -1)
        self.history = list(state.get("history", []))
        self.logger_run_id = state.get("logger_run_id")
        rng = state.get("rng")
        if rng:
            torch.set_rng_state(rng["torch"])
            if rng.get("cuda") is not None and torch.cuda.is_available():
                torch.cuda.set_rng_state_all(rng["cuda"])
            np.random.set_state(rng["numpy"])
            random.setstate(rng["python"])


def _pad_id(tokenizer) -> int:
    pad = tokenizer.pad_token_id
    if pad is None:
        pad = tokenizer.eos_token_id
    if pad is None:
        raise ValueError("the tokenizer has neither a pad nor an eos token; set one in the model builder")
    return int(pad)


def _allowed(turns: list[Turn], idx: list[int]) -> list[list[list[int]] | None] | None:
    """Per-position allowed ids of constrained turns (log-probs of the policy that acted); None if all free."""
    rows = [turns[i].allowed_token_ids for i in idx]
    return rows if any(r is not None for r in rows) else None


def _seq_len(turn: Turn) -> int:
    return len(turn.prompt_ids) + len(turn.response_ids)


def _first_of_each(turns: list[Turn]) -> list[int]:
    """For every turn, the index of the first turn with the same prompt, response and allowed ids."""
    first: dict[tuple, int] = {}
    out = []
    for i, t in enumerate(turns):
        allowed = tuple(map(tuple, t.allowed_token_ids)) if t.allowed_token_ids is not None else None
        out.append(first.setdefault((tuple(t.prompt_ids), tuple(t.response_ids), allowed), i))
    return out


def _scatter_rows(values: list[torch.Tensor], idx: list[int], mask: torch.Tensor) -> torch.Tensor:
    """Place each turn's per-response-token values at its response positions of the padded batch."""
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    flat = torch.cat([values[i] for i in idx]).to(mask.device)
    return out.masked_scatter(mask, flat)
