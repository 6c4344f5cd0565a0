"""Expert demonstrations and the supervised warm start of a from-scratch policy.

RL on sparse success rewards needs a policy that already wins sometimes. The tiny model starts from
random weights, so it is first fine-tuned to imitate the environment's expert on prompts built exactly
as the rollout builds them. ``action_noise`` executes a random admissible action on some steps (the
label stays the expert's) so that the demos also visit off-expert states and show the way back.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from envs.base import EnvSuite
from progpo.models.logprobs import forward_logprobs, pad_prompt_response
from progpo.rollout.projection import normalize_action
from progpo.rollout.prompt import PromptBuilder

log = logging.getLogger(__name__)


@dataclass
class WarmStartConfig:
    """Supervised warm start on expert demos (``model.warm_start.*``).

    n_episodes: expert episodes on training tasks (cycling through ``suite.train_tasks``); 0 = no warm start.
    epochs: passes over the demo steps.
    lr: AdamW peak learning rate (linear warm-up over 5% of the steps, cosine decay to 10%).
    batch_size: demo steps per optimizer step.
    max_steps: cap on optimizer steps (None = ``epochs`` decides).
    max_episode_steps: cap on steps per demo episode (None = ``suite.max_steps``).
    action_noise: fraction of demo steps that execute a random admissible action instead of the expert's.
    invalid_noise: fraction of demo steps that execute a stale command (admissible earlier in the episode,
        not now, e.g. ``go to X`` while at X): the demos then show the env's answer to an invalid command and
        the expert's way on from there, the state a sampling policy most often gets itself into.
    seed: seeds the demo noise, the data order and the model initialisation.
    """

    n_episodes: int = 200
    epochs: int = 3
    lr: float = 1e-3
    batch_size: int = 32
    max_steps: int | None = None
    max_episode_steps: int | None = None
    action_noise: float = 0.2
    invalid_noise: float = 0.1
    seed: int = 0

    def __post_init__(self) -> None:
        if self.n_episodes < 0:
            raise ValueError(f"model.warm_start.n_episodes must be >= 0, got {self.n_episodes}")
        if self.epochs < 0 or self.batch_size <= 0:
            raise ValueError("model.warm_start.epochs must be >= 0 and batch_size > 0")
        if not self.lr > 0:
            raise ValueError(f"model.warm_start.lr must be > 0, got {self.lr}")
        if not 0.0 <= self.action_noise < 1.0:
            raise ValueError(f"model.warm_start.action_noise must be in [0, 1), got {self.action_noise}")
        if not 0.0 <= self.invalid_noise < 1.0 or self.action_noise + self.invalid_noise >= 1.0:
            raise ValueError(
                "model.warm_start.invalid_noise must be in [0, 1) with action_noise + invalid_noise < 1, "
                f"got {self.invalid_noise}"
            )


@dataclass(frozen=True)
class DemoStep:
    """One labelled state: what the policy saw, and the expert's action there."""

    task_description: str
    observation: str
    admissible: tuple[str, ...]
    past: tuple[tuple[str, str], ...]  # (observation, executed action) pairs of the episode so far
    expert_action: str
    episode: int = 0


@dataclass
class DemoStats:
    episodes: int = 0
    steps: int = 0  # labelled steps kept
    noisy_steps: int = 0
    invalid_steps: int = 0
    won: int = 0
    skipped_inadmissible: int = 0  # expert actions not in the admissible list (not used as labels)


def _canonical(action: str, admissible: Sequence[str]) -> str | None:
    """The admissible command equal to ``action`` up to case/whitespace; ``action`` itself if none is listed."""
    if not admissible:
        return action
    key = normalize_action(action)
    for command in admissible:
        if normalize_action(command) == key:
            return command
    return None


def collect_demos(suite: EnvSuite, cfg: WarmStartConfig) -> tuple[list[DemoStep], DemoStats]:
    """Run the env's expert (``ExpertEnv.expert_action``) on training tasks, with action noise."""
    if not suite.train_tasks:
        raise ValueError(f"suite {suite.name!r} has no train_tasks to collect expert demos from")
    rng = random.Random(cfg.seed)
    max_steps = cfg.max_episode_steps or suite.max_steps
    demos: list[DemoStep] = []
    stats = DemoStats()
    env = suite.env_factory()
    try:
        if not callable(getattr(env, "expert_action", None)):
            raise TypeError(f"{type(env).__name__} has no expert_action(): the warm start needs an ExpertEnv")
        for episode in tqdm(range(cfg.n_episodes), desc="expert demos", leave=False, mininterval=5):
            task = suite.train_tasks[episode % len(suite.train_tasks)]
            obs = env.reset(task)
            past: list[tuple[str, str]] = []
            seen: dict[str, None] = {}  # commands admissible earlier in the episode (ordered, no duplicates)
            for _ in range(max_steps):
                expert = env.expert_action()
                if expert is None:
                    break
                label = _canonical(expert, obs.admissible_actions)
                if label is None:
                    stats.skipped_inadmissible += 1
                    label = expert
                else:
                    demos.append(
                        DemoStep(
                            obs.task_description,
                            obs.text,
                            tuple(obs.admissible_actions),
                            tuple(past),
                            label,
                            episode,
                        )
                    )
                action = label
                admissible = set(obs.admissible_actions)
                stale = [a for a in seen if a not in admissible]
                others = [a for a in obs.admissible_actions if a != label]
                draw = rng.random()
                if stale and draw < cfg.invalid_noise:
                    action = rng.choice(stale)
                    stats.invalid_steps += 1
                elif others and draw < cfg.invalid_noise + cfg.action_noise:
                    action = rng.choice(others)
                    stats.noisy_steps += 1
                seen.update(dict.fromkeys(obs.admissible_actions))
                past.append((obs.text, action))
                obs, _reward, done, info = env.step(action)
                if done:
                    stats.won += int(info.won)
                    break
            stats.episodes += 1
    finally:
        env.close()
    stats.steps = len(demos)
    if stats.skipped_inadmissible:
        log.warning(
            "%d expert actions were not in the admissible list; not used as labels",
            stats.skipped_inadmissible,
        )
    return demos, stats


def response_text(action: str) -> str:
    """The reasoning-free answer the warm start teaches: ``<action>...</action>``."""
    return f"<action>{action}</action>"


def _warmup_cosine(step: int, warmup: int, total: int) -> float:
    """Linear warm-up, then cosine decay to 10% of the peak learning rate."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def length_bucketed_batches(
    lengths: Sequence[int], batch_size: int, generator: torch.Generator, bucket_batches: int = 16
) -> list[list[int]]:
    """One epoch of batches, each of rows of similar length, in random order.

    Rows are shuffled, cut into buckets of ``bucket_batches`` batches, sorted by length inside a bucket and
    split into batches; the batch order is shuffled again. Padding to the longest row of a random batch
    roughly doubles the cost of an SFT step on these prompts (100-320 tokens); this keeps the randomness
    of the data order while sorting locally.
    """
    order = torch.randperm(len(lengths), generator=generator).tolist()
    bucket = batch_size * bucket_batches
    batches: list[list[int]] = []
    for start in range(0, len(order), bucket):
        chunk = sorted(order[start : start + bucket], key=lambda i: lengths[i])
        batches.extend(chunk[k : k + batch_size] for k in range(0, len(chunk), batch_size))
    return [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]


def supervised_finetune(
    model: torch.nn.Module,
    tokenizer,
    builder: PromptBuilder,
    demos: Sequence[DemoStep],
    cfg: WarmStartConfig,
) -> dict[str, float]:
    """Teacher-forced NLL of ``<action>expert</action><eos>`` given the RL prompt, token-mean per batch."""
    if not demos or cfg.epochs == 0:
        return {"sft_steps": 0}
    prompts = [builder.build(d.task_description, d.observation, d.admissible, d.past).ids for d in demos]
    eos = [tokenizer.eos_token_id]
    targets = [
        tokenizer(response_text(d.expert_action), add_special_tokens=False)["input_ids"] + eos for d in demos
    ]
    n_batches = math.ceil(len(demos) / cfg.batch_size)
    total = n_batches * cfg.epochs if cfg.max_steps is None else min(cfg.max_steps, n_batches * cfg.epochs)
    warmup = max(1, total // 20)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _warmup_cosine(s, warmup, total))
    generator = torch.Generator().manual_seed(cfg.seed)
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id
    model.train()
    step, started, first_loss, last_loss = 0, time.perf_counter(), float("nan"), float("nan")
    bar = tqdm(total=total, desc="warm start SFT", leave=False, mininterval=5)
    lengths = [len(p) + len(t) for p, t in zip(prompts, targets)]
    while step < total:
        for rows in length_bucketed_batches(lengths, cfg.batch_size, generator):
            tb = pad_prompt_response([prompts[i] for i in rows], [targets[i] for i in rows], pad, device)
            out = forward_logprobs(model, tb.input_ids, tb.attention_mask, tb.response_mask)
            mask = tb.response_mask.float()
            loss = -(out.token_logprobs * mask).sum() / mask.sum()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            step += 1
            last_loss = loss.item()
            if step == 1:
                first_loss = last_loss
            bar.update(1)
            bar.set_postfix(loss=f"{last_loss:.3f}")
            if step % max(1, total // 10) == 0:
                log.info("warm start SFT step %d/%d loss %.4f", step, total, last_loss)
            if step >= total:
                break
    bar.close()
    model.eval()
    elapsed = time.perf_counter() - started
    n_tokens = sum(len(p) + len(t) for p, t in zip(prompts, targets)) * step / max(1, n_batches)
    return {
        "sft_steps": step,
        "sft_first_loss": first_loss,
        "sft_final_loss": last_loss,
        "sft_seconds": elapsed,
        "sft_tokens": n_tokens,
    }
