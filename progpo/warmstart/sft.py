"""Supervised warm start: teacher-forced NLL of the expert's answer given the prompt RL will show.

RL on sparse success rewards needs a policy that already wins sometimes; a from-scratch policy is first
fine-tuned to imitate the environment's expert on prompts built exactly as the rollout builds them.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from contextlib import nullcontext

import torch

from progpo.config.groups import WarmStartConfig
from progpo.hardware import resolve_precision
from progpo.models.logprobs import forward_logprobs, pad_prompt_response
from progpo.progress import progress_bar
from progpo.rollout.prompt import PromptBuilder
from progpo.warmstart.demos import DemoStep, response_text

log = logging.getLogger(__name__)


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
    # bf16 autocast for the forward (the weights, AdamW's state and the loss stay float32)
    precision = resolve_precision(cfg.precision, uses_cuda=device.type == "cuda")
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16-mixed" else nullcontext()
    model.train()
    step, started, first_loss, last_loss = 0, time.perf_counter(), float("nan"), float("nan")
    bar = progress_bar(total=total, desc="warm start SFT", leave=False, mininterval=5)
    lengths = [len(p) + len(t) for p, t in zip(prompts, targets)]
    while step < total:
        for rows in length_bucketed_batches(lengths, cfg.batch_size, generator):
            tb = pad_prompt_response([prompts[i] for i in rows], [targets[i] for i in rows], pad, device)
            with autocast:
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
            if step >= total:
                break
    bar.close()
    model.eval()
    elapsed = time.perf_counter() - started
    log.info("warm start SFT (%s): %d steps in %.0fs, loss %.4f -> %.4f", precision, step, elapsed, first_loss,
             last_loss)
    n_tokens = sum(len(p) + len(t) for p, t in zip(prompts, targets)) * step / max(1, n_batches)
    return {
        "sft_steps": step,
        "sft_first_loss": first_loss,
        "sft_final_loss": last_loss,
        "sft_seconds": elapsed,
        "sft_tokens": n_tokens,
    }
