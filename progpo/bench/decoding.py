"""``python -m progpo.bench decoding [hydra overrides...]``: the HF engine's decoding loop against ``generate``.

Plays one iteration's tasks with the configured run (default: the laptop default), recording every call the
collector makes to the engine (prompts, admissible lists, task texts). The recorded calls are then replayed,
alternately, through the engine's KV-cache loop (``progpo.rollout.engines.kv_decoding``: each distinct prompt
prefilled once, forced tokens appended without a model call) and through transformers ``generate`` with the
same grammar as a logits processor (the baseline: every row prefilled, every token a model call),
with the same sampling settings. It prints both times, the ratio, tokens/s and the decoder calls each made.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass, field

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList, StoppingCriteria

from progpo.bench.runs import add_run_arguments, configured_run
from progpo.rollout.engines.constrained import AnswerCursor, answer_space
from progpo.rollout.engines.hf_engine import HFEngine
from progpo.rollout.engines.kv_decoding import StopRule, left_pad


@dataclass
class RecordedCall:
    prompts: list[list[int]]
    admissible: list | None
    task_texts: list | None


class _Recorder:
    """Wraps an engine and keeps every ``generate`` call's arguments (the collector's calls, as made)."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.calls: list[RecordedCall] = []

    def generate(self, prompts, greedy=False, admissible=None, temperature=None, task_texts=None):
        self.calls.append(RecordedCall(list(prompts), admissible, task_texts))
        return self.engine.generate(prompts, greedy=greedy, admissible=admissible, temperature=temperature,
                                    task_texts=task_texts)

    def __getattr__(self, name):
        return getattr(self.engine, name)


class _GrammarProcessor(LogitsProcessor):
    """The baseline's grammar: one AnswerCursor per row, advanced by the token ``generate`` appended last."""

    def __init__(self, cursors: list[AnswerCursor | None], prompt_width: int) -> None:
        self.cursors = cursors
        self.width = prompt_width

    def __call__(self, input_ids, scores):
        if input_ids.shape[1] > self.width:
            for cursor, token in zip(self.cursors, input_ids[:, -1].tolist()):
                if cursor is not None:
                    cursor.advance(token)
        mask = torch.ones_like(scores, dtype=torch.bool)
        for row, cursor in enumerate(self.cursors):
            allowed = cursor.allowed() if cursor is not None else None
            if allowed is not None:
                mask[row] = False
                mask[row, allowed] = True
        return scores.masked_fill(~mask, float("-inf"))


class _Stops(StoppingCriteria):
    def __init__(self, rule: StopRule, prompt_width: int, rows: int) -> None:
        self.rule, self.width = rule, prompt_width
        self.done = torch.zeros(rows, dtype=torch.bool)

    def __call__(self, input_ids, scores, **kwargs):
        for row in (~self.done).nonzero().flatten().tolist():
            self.done[row] = self.rule.ends(input_ids[row, self.width :].tolist())
        return self.done.clone()


def generate_baseline(engine: HFEngine, call: RecordedCall) -> int:
    """The recorded call through transformers ``generate`` (same batches, grammar, stops); tokens generated."""
    model, tok = engine.policy.model, engine.policy.tokenizer
    order = sorted(range(len(call.prompts)), key=lambda i: len(call.prompts[i]))
    generated = 0
    batch_rows = engine.batch_rows(model)  # the engine's own batches, under the autocast in force
    for start in range(0, len(order), batch_rows):
        rows = order[start : start + batch_rows]
        prompts = [call.prompts[i] for i in rows]
        ids, mask = left_pad(prompts, engine.pad_id)
        width = ids.shape[1]
        cursors = [None] * len(rows)
        if engine.constrain_to_admissible and call.admissible is not None:
            spaces = [answer_space(tok, call.admissible[i], engine.eos_ids[0],
                                   call.task_texts[i] if call.task_texts else None, engine.max_new_tokens, engine.query)
                      for i in rows]
            cursors = [AnswerCursor(s) if s is not None else None for s in spaces]
        stops = _Stops(StopRule(tok, engine.stop, engine.eos_ids), width, len(rows))
        config = GenerationConfig(max_new_tokens=engine.max_new_tokens, pad_token_id=engine.pad_id,
                                  eos_token_id=engine.eos_ids, do_sample=True, temperature=engine.temperature,
                                  top_p=engine.top_p, top_k=engine.top_k, return_dict_in_generate=True,
                                  output_logits=True)
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config,
                             logits_processor=LogitsProcessorList([_GrammarProcessor(cursors, width)]),
                             stopping_criteria=[stops])
        generated += int((out.sequences[:, width:] != engine.pad_id).sum())
    return generated


@dataclass
class Timing:
    seconds: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    calls: list[int] = field(default_factory=list)


def _count_calls(model) -> tuple[list[int], object]:
    """Decoder passes, counted where each embeds its tokens (the response window does not call the decoder's
    forward)."""
    counter = [0]
    handle = model.get_decoder().embed_tokens.register_forward_hook(lambda *a: counter.__setitem__(0, counter[0] + 1))
    return counter, handle


def _timed(model, fn, call: RecordedCall) -> tuple[float, int, int]:
    """Seconds, generated tokens and decoder calls of ``fn(call)``."""
    counter, handle = _count_calls(model)
    try:
        started = time.perf_counter()
        with torch.no_grad():
            tokens = fn(call)
        return time.perf_counter() - started, tokens, counter[0]
    finally:
        handle.remove()


def bench_decoding(args: argparse.Namespace) -> None:
    with configured_run(args.overrides, args.threads) as (_, run):
        rl, engine = run.module.rl, run.engine
        if not isinstance(engine, HFEngine):
            raise SystemExit("bench decoding measures the HF engine (rollout=hf)")
        recorder = _Recorder(engine)
        rl.collector.engine = recorder
        torch.manual_seed(0)
        rl.collector.collect(run.datamodule.train_batch().tasks, rl.group_size)
        rl.collector.engine = engine
        model = engine.policy.model
        model.eval()
        loop, baseline = Timing(), Timing()
        for repeat in range(args.repeats):
            for timing, fn in ((loop, lambda c: engine.generate(c.prompts, admissible=c.admissible,
                                                                task_texts=c.task_texts).n_generated_tokens),
                               (baseline, lambda c: generate_baseline(engine, c))):
                torch.manual_seed(repeat)
                seconds, tokens, calls = 0.0, 0, 0
                for call in recorder.calls:
                    s, t, n = _timed(model, fn, call)
                    seconds, tokens, calls = seconds + s, tokens + t, calls + n
                timing.seconds.append(seconds)
                timing.tokens.append(tokens)
                timing.calls.append(calls)
    prompts = sum(len(c.prompts) for c in recorder.calls)
    distinct = sum(len({tuple(p) for p in c.prompts}) for c in recorder.calls)
    lines = [f"# progpo.bench decoding: {run.policy.name}, {len(recorder.calls)} engine calls, {prompts} prompts "
             f"({distinct} distinct within their call), {args.repeats} repeat(s), {torch.get_num_threads()} thread(s)",
             "", "| decoding | seconds (median) | generated tokens | tokens/s | decoder calls |", "|---|---:|---:|---:|---:|"]
    for name, timing in (("transformers generate (baseline)", baseline), ("KV-cache loop (engine)", loop)):
        seconds = statistics.median(timing.seconds)
        tokens = statistics.median(timing.tokens)
        lines.append(f"| {name} | {seconds:.2f} | {tokens:.0f} | {tokens / seconds:.0f} | "
                     f"{statistics.median(timing.calls):.0f} |")
    ratio = statistics.median(baseline.seconds) / statistics.median(loop.seconds)
    lines.append(f"\nKV-cache loop vs generate: {ratio:.2f}x faster")
    sys.stdout.write("\n".join(lines) + "\n")


def add_parser(sub) -> None:
    parser = sub.add_parser("decoding", help="the HF engine's decoding loop against transformers generate")
    add_run_arguments(parser, repeats_help="replays per decoding path (medians)")
    parser.set_defaults(run=bench_decoding)
