"""``python -m progpo.bench iteration [hydra overrides...]``: where one training iteration's time goes.

Builds the configured run (default: the laptop default, ``model=tiny`` on ALFWorld), measures the new path
untimed first (``--warm-up``: a process's first model passes are slower, its first rollout by a third on one host, and
whichever path came first would carry that), warms the env workers up on
each repeat's tasks (untimed: the first path would otherwise pay the workers' start), then plays one iteration's
tasks on each path, in reverse order on every other repeat (so that no path is always measured first), and times
each phase: rollout, scoring (the recomputing path, actor + reference passes, against
the reusing one, reference only), credit and the PPO update (from the same weights each time). The update is timed
twice from the same weights: the iteration's own (identical turns share one forward) and each step with its own
forward (the update before that sharing). The paths: float32 and bf16 as they ran before the window, the
attention choice and the bf16 activations (SDPA, every layer at every position, autocast's own dtypes: "before"),
and the configured run ("new": the model's ``attn_implementation``, the response window of ``progpo.models.window``,
``progpo.models.bf16_activations``, the padded shapes of ``progpo.models.shapes``, the two-pass rotation of
``progpo.models.rotary`` and the batch sizes of ``progpo.hardware.auto_batch_rows`` where the config says ``auto``,
in bf16 where the CPU has it; the paths before run those at 32). Each
phase's FLOPs as its path computes them (no padding, causal attention, KV-cache decoding counted once) are set
against this machine's matmul peak measured in the same run, so the numbers mean something on a shared machine
too; the old path (float32, recompute, unshared update), the bf16 path before and the new one are printed as ratios.
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import io
import pstats
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace

import torch

from progpo.algo.ppo import minibatch_plan, ppo_update, updated_steps
from progpo.algo.scoring import reference_logprobs, score_turns
from progpo.bench.runs import add_run_arguments, configured_run
from progpo.hardware import BATCH_ROWS, cpu_has_fast_bf16
from progpo.models import attention as attention_module
from progpo.models import shapes as shapes_module
from progpo.models.attention import use_attention
from progpo.models.bf16_activations import autocast_activations
from progpo.models.rotary import transformers_rotary
from progpo.models.shapes import batches_as_they_come
from progpo.models.window import full_pass, supports_window
from progpo.types import RolloutBatch, Turn


@dataclass(frozen=True)
class ModelShape:
    """What the FLOP count of a decoder-only transformer depends on."""

    layers: int
    hidden: int
    vocab: int
    decoder_matmul_params: int  # weights of the linear layers inside the decoder blocks (no embeddings, no head)
    intermediate: int
    key_value_params: int = 0  # the k and v projections' weights of one layer (run at every position by the window)

    @classmethod
    def of(cls, model: torch.nn.Module) -> ModelShape:
        cfg = model.config
        decoder = model.get_decoder()
        linear = sum(m.weight.numel() for m in decoder.modules() if isinstance(m, torch.nn.Linear))
        attention = decoder.layers[-1].self_attn
        key_value = attention.k_proj.weight.numel() + attention.v_proj.weight.numel()
        return cls(cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size, linear, cfg.intermediate_size, key_value)

    def forward_flops(self, length: int, head_positions: int, window: int | None = None) -> float:
        """One causal forward over ``length`` tokens with the LM head at ``head_positions`` of them.

        Linear layers: 2 FLOPs per weight per token. Attention: position t attends to t+1 keys, QK^T and AV cost
        2*hidden*(t+1) each per layer, summed over t: 2*hidden*T*(T+1) per layer. Incremental decoding with a KV
        cache does the same useful work as this teacher-forced pass, so generation is counted the same way.
        With ``window`` (the last ``window`` positions, ``progpo.models.window``), the last layer runs its k and v
        projections at every position and the rest of it at the window only.
        """
        per_layer = self.decoder_matmul_params / self.layers
        attention = 2.0 * self.hidden * length * (length + 1)
        head = 2.0 * self.vocab * self.hidden * head_positions
        if window is None:
            return 2.0 * self.decoder_matmul_params * length + self.layers * attention + head
        last_linear = 2.0 * self.key_value_params * length + 2.0 * (per_layer - self.key_value_params) * window
        last_attention = 4.0 * self.hidden * sum(length - k for k in range(window))  # a query at t: t+1 keys
        return (2.0 * per_layer * (self.layers - 1) * length + (self.layers - 1) * attention + last_linear
                + last_attention + head)


def turn_flops(shape: ModelShape, turn: Turn, window: bool = False) -> float:
    """A turn's teacher-forced pass; with ``window``, as the response window computes it (the last prompt token
    and the response but its last token)."""
    response = len(turn.response_ids)
    return shape.forward_flops(len(turn.prompt_ids) + response, response, max(response, 1) if window else None)


@dataclass(frozen=True)
class BenchPath:
    """One way to run the iteration: precision, attention implementation, response window or every position,
    whether the norms' outputs and rotary tables are bf16 under autocast (``progpo.models.bf16_activations``),
    whether scoring and update batches are padded to a few shapes on an AMX-BF16 CPU (``progpo.models.shapes``), and
    whether a CPU's rotary embeddings take two passes (``progpo.models.rotary``) or transformers' five, and whether
    the batch sizes the config leaves at ``auto`` follow this machine's rule (``progpo.hardware.auto_batch_rows``) or
    stay at 32, the size before the rule."""

    name: str
    bf16: bool
    attention: str
    window: bool
    bf16_activations: bool
    padded_shapes: bool = False
    two_pass_rotary: bool = False
    auto_batch_rows: bool = False


def matmul_peak_gflops(shape: ModelShape, dtype: torch.dtype, seconds: float = 0.4, windows: int = 5) -> float:
    """GFLOP/s of a [4096, hidden] x [hidden, intermediate] matmul, the model's largest GEMM shape: the best of
    ``windows`` timings of ``seconds`` each (on a shared machine one window can be slowed by a neighbour)."""
    a = torch.randn(4096, shape.hidden).to(dtype)
    b = torch.randn(shape.hidden, shape.intermediate).to(dtype)
    for _ in range(3):
        a @ b
    best = 0.0
    for _ in range(windows):
        n, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            a @ b
            n += 1
        best = max(best, 2.0 * 4096 * shape.hidden * shape.intermediate * n / (time.perf_counter() - started) / 1e9)
    return best


@dataclass
class PhaseTimes:
    rollout_s: float
    score_recompute_s: float
    score_reuse_s: float
    credit_s: float
    update_s: float
    update_unshared_s: float  # the same update with every step its own forward (no sharing of identical turns)
    generated_tokens: int
    turns: int
    rollout_flops: float
    score_recompute_flops: float  # actor (+ reference) over the unique turns
    score_reuse_flops: float  # reference over the unique updated turns
    update_flops: float  # every trained step's forward and backward
    update_shared_flops: float  # the same with identical turns of a micro-batch counted once (what is computed)
    logprob_diff_mean: float  # |sampling - recomputed| old log-probs
    decode_rows: int = BATCH_ROWS  # prompts per decoding call
    update_rows: int = BATCH_ROWS  # steps per scoring and update pass (ppo.micro_batch_size)


def _autocast(device: torch.device, bf16: bool):
    """As Lightning's bf16-mixed: no cache of the weights' bf16 copies (an optimizer step inside one autocast region
    would leave later micro-batches on the stale copies)."""
    return torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=False) if bf16 else nullcontext()


def _use_path(rl, path: BenchPath) -> None:
    for model in (rl.actor, rl.reference):
        if model is not None:
            use_attention(model, path.attention)


@contextmanager
def _batch_rows(rl, path: BenchPath, auto_micro: bool) -> Iterator[None]:
    """Inside: 32 rows per call wherever the config says ``auto`` (``auto_micro``: ``ppo.micro_batch_size``, which the
    run resolved at start-up), unless ``path`` follows the machine's rule; the run's own sizes again on exit."""
    ppo, engine_rows = rl.ppo, getattr(rl.engine, "batch_size", None)
    if not path.auto_batch_rows:
        if engine_rows == "auto":
            rl.engine.batch_size = BATCH_ROWS
        if auto_micro:
            rl.ppo = replace(ppo, micro_batch_size=BATCH_ROWS)
    try:
        yield
    finally:
        rl.ppo = ppo
        if engine_rows is not None:
            rl.engine.batch_size = engine_rows


def measure(rl, tasks, optimizer_factory, shape: ModelShape, path: BenchPath, seed: int,
            auto_micro: bool = False) -> PhaseTimes:
    """One iteration's phases on one path; the actor's weights are restored afterwards. ``auto_micro``: the config
    left ``ppo.micro_batch_size`` at ``auto`` (paths before the rule then run 32)."""
    actor = rl.actor
    device = next(actor.parameters()).device
    weights = copy.deepcopy(actor.state_dict())
    _use_path(rl, path)
    window = path.window and supports_window(actor)
    torch.manual_seed(seed)
    with (_autocast(device, path.bf16), (nullcontext() if path.window else full_pass()),
          (nullcontext() if path.bf16_activations else autocast_activations()),
          (nullcontext() if path.padded_shapes else batches_as_they_come()),
          (nullcontext() if path.two_pass_rotary else transformers_rotary()), _batch_rows(rl, path, auto_micro)):
        decode_rows = rl.engine.batch_rows(actor) if hasattr(rl.engine, "batch_rows") else 0
        update_rows = rl.ppo.micro_batch_size
        started = time.perf_counter()
        batch: RolloutBatch = rl.collector.collect(tasks, rl.group_size)
        rollout_s = time.perf_counter() - started
        turns = batch.turns
        started = time.perf_counter()  # the old path: actor and reference passes over every turn
        recomputed = score_turns(actor, rl.reference, turns, rl.pad_token_id, rl.ppo.micro_batch_size,
                                 recompute_old=True)
        score_recompute_s = time.perf_counter() - started
        # the iteration's own path on the same rollout (the engine's log-probs, then the credit, the reference of
        # the trained steps and the update), phases timed by the iteration itself
        result = rl.learn(batch, 0, optimizer_factory(actor.parameters()), lambda loss: loss.backward())
        perf = result.metrics
        trained = updated_steps(turns, result.credit.advantage.to(torch.float32), rl.ppo.skip_zero_advantage)
        score_reuse_s = perf["perf/score_s"]
        credit_s, update_s = perf["perf/credit_s"], perf["perf/update_s"]
        update_unshared_s = _unshared_update_s(rl, turns, result.credit.advantage.to(torch.float32), trained, weights,
                                               optimizer_factory)
    actor.load_state_dict(weights)
    rl.engine.sync_weights(actor)  # an engine with its own copy (vLLM) must not keep the measured update
    representative = recomputed.representative
    unique = sorted(set(representative))
    unique_trained = sorted({representative[i] for i in trained})
    diffs = [(torch.tensor(t.sample_logprobs) - old).abs() for t, old in zip(turns, recomputed.old_logprobs)
             if t.response_ids]
    return PhaseTimes(
        rollout_s, score_recompute_s, score_reuse_s, credit_s, update_s, update_unshared_s, batch.generated_tokens,
        len(turns),
        rollout_flops=sum(turn_flops(shape, t) for t in turns),
        score_recompute_flops=((2 if rl.reference is not None else 1)
                               * sum(turn_flops(shape, turns[i], window) for i in unique)),
        score_reuse_flops=(sum(turn_flops(shape, turns[i], window) for i in unique_trained)
                           if rl.reference is not None else 0.0),
        update_flops=3.0 * rl.ppo.epochs * sum(turn_flops(shape, turns[i], window) for i in trained),
        update_shared_flops=3.0 * sum(turn_flops(shape, turns[i], window)
                                      for i in _shared_update_rows(rl, turns, trained, representative)),
        logprob_diff_mean=float(torch.cat(diffs).mean()) if diffs else 0.0,
        decode_rows=decode_rows,
        update_rows=update_rows,
    )


def _shared_update_rows(rl, turns: list[Turn], trained: list[int], representative: list[int]) -> list[int]:
    """The turns the shared update runs through the model, over all epochs: one per distinct turn per micro-batch."""
    return [turn for minibatch in minibatch_plan(turns, trained, rl.ppo, rl.seed, 0)
            for chunk in minibatch.chunks(rl.ppo.micro_batch_size)
            for turn in dict.fromkeys(representative[i] for i in chunk)]


def _unshared_update_s(rl, turns: list[Turn], advantages: torch.Tensor, trained: list[int], weights: dict,
                       optimizer_factory) -> float:
    """The iteration's update from the same start weights, every step with its own forward: the update before
    identical turns shared one (``ppo._micro_batch_loss``), timed for the ratio."""
    rl.actor.load_state_dict(weights)
    scored = score_turns(rl.actor, None, turns, rl.pad_token_id, rl.ppo.micro_batch_size)
    if rl.reference is not None:
        scored = replace(scored, ref_logprobs=reference_logprobs(rl.reference, turns, trained, rl.pad_token_id,
                                                                 rl.ppo.micro_batch_size, scored.representative))
    scored = replace(scored, representative=list(range(len(turns))))  # no turn known to equal another
    started = time.perf_counter()
    ppo_update(rl.actor, optimizer_factory(rl.actor.parameters()), lambda loss: loss.backward(), turns, scored,
               advantages, rl.ppo, rl.pad_token_id, seed=rl.seed)
    return time.perf_counter() - started


def _median(runs: list[PhaseTimes], name: str) -> float:
    return statistics.median(getattr(r, name) for r in runs)


def _report(label: str, runs: dict[BenchPath, list[PhaseTimes]], peaks: dict[str, float]) -> str:
    rows = [
        ("rollout", "rollout_s", "rollout_flops"),
        ("score, recompute (actor + ref, all steps)", "score_recompute_s", "score_recompute_flops"),
        ("score, reuse (ref, updated steps)", "score_reuse_s", "score_reuse_flops"),
        ("credit", "credit_s", None),
        ("update, each step its own forward (before)", "update_unshared_s", "update_flops"),
        ("update (identical turns share a forward)", "update_s", "update_shared_flops"),
    ]
    paths = list(runs)
    ratio_head = f" {paths[-2].name} / {paths[-1].name} |" if len(paths) >= 2 else ""
    lines = [f"## {label}", "",
             "| phase | " + " | ".join(f"{p.name} s | GFLOP/s (% peak)" for p in paths) + " |" + ratio_head,
             "|---|" + "---:|---:|" * len(paths) + ("---:|" if ratio_head else "")]
    for name, time_key, flop_key in rows:
        cells = []
        for path, measured in runs.items():
            seconds = _median(measured, time_key)
            if flop_key and seconds > 0 and _median(measured, flop_key) > 0:
                gflops = _median(measured, flop_key) / seconds / 1e9
                peak = peaks["bf16" if path.bf16 else "float32"]
                cells.append(f"{seconds:.2f} | {gflops:.1f} ({100 * gflops / peak:.0f}%)")
            else:
                cells.append(f"{seconds:.3f} | -")
        ratio = ""
        if ratio_head:
            before, after = (_median(runs[p], time_key) for p in paths[-2:])
            ratio = f" {before / after:.2f}x |" if after > 0 else " - |"
        lines.append(f"| {name} | " + " | ".join(cells) + " |" + ratio)
    for path, measured in runs.items():
        rollout = _median(measured, "rollout_s")
        tokens = statistics.median(r.generated_tokens for r in measured)
        turns = statistics.median(r.turns for r in measured)
        amx_sdpa = path.bf16 and path.attention == attention_module.NAME and attention_module.SDPA_WITHOUT_GRAD
        padded = path.bf16 and path.padded_shapes and shapes_module.PAD_SHAPES
        lines.append(f"\n{path.name} ({'bf16' if path.bf16 else 'float32'}, attention {path.attention}"
                     f"{' (SDPA without gradients, as on every AMX-BF16 CPU)' if amx_sdpa else ''}, "
                     f"{'response window' if path.window else 'every position'}"
                     f"{', bf16 norm outputs and rotary tables' if path.bf16 and path.bf16_activations else ''}"
                     f"{', batches padded to a few shapes (AMX-BF16)' if padded else ''}"
                     f"{', rotary embeddings in two passes on a CPU' if path.two_pass_rotary else ''}"
                     f"{_rows_label(measured[0])}): "
                     f"{turns:.0f} steps, {tokens:.0f} "
                     f"generated tokens, {tokens / rollout:.0f} tokens/s in the rollout; |sampling - recomputed old "
                     f"log-prob| mean {_median(measured, 'logprob_diff_mean'):.2e}")
    return "\n".join(lines)


def _rows_label(times: PhaseTimes) -> str:
    decoding = f"{times.decode_rows} prompts per decoding call, " if times.decode_rows else ""
    return f", {decoding}{times.update_rows} steps per scoring and update pass"


def _iteration_s(runs: list[PhaseTimes], new: bool) -> float:
    """The old path (recomputed old log-probs, unshared update) or the new one (the iteration as it runs)."""
    score, update = ("score_reuse_s", "update_s") if new else ("score_recompute_s", "update_unshared_s")
    return sum(_median(runs, k) for k in ("rollout_s", score, "credit_s", update))


def bench_paths(bf16: bool, attention: str) -> list[BenchPath]:
    """float32 before (which also times the old path); bf16 before where bf16 is measured; the new path last."""
    paths = [BenchPath("float32 before", bf16=False, attention="sdpa", window=False, bf16_activations=False)]
    if bf16:
        paths.append(BenchPath("bf16 before", bf16=True, attention="sdpa", window=False, bf16_activations=False))
    paths.append(BenchPath(f"{'bf16' if bf16 else 'float32'} new", bf16=bf16, attention=attention, window=True,
                           bf16_activations=True, padded_shapes=True, two_pass_rotary=True, auto_batch_rows=True))
    return paths


def bench_iteration(args: argparse.Namespace) -> None:
    from hydra.utils import instantiate

    with configured_run(args.overrides, args.threads) as (cfg, run):
        rl = run.module.rl
        shape = ModelShape.of(rl.actor)
        peaks = {"float32": matmul_peak_gflops(shape, torch.float32),
                 "bf16": matmul_peak_gflops(shape, torch.bfloat16)}
        optimizer_factory = instantiate(cfg.optim)
        bf16 = args.bf16 == "on" or (args.bf16 == "auto" and (rl.actor.device.type == "cuda"
                                                              or cpu_has_fast_bf16() is not False))
        configured = rl.actor.config._attn_implementation
        paths = bench_paths(bf16, configured)
        runs: dict[BenchPath, list[PhaseTimes]] = {p: [] for p in paths}
        repeat_tasks = [run.datamodule.train_batch().tasks for _ in range(args.repeats)]
        auto_micro = cfg.ppo.micro_batch_size == "auto"
        started = time.perf_counter()
        for k in range(args.warm_up):  # untimed, on the first repeat's tasks (with other sampling seeds)
            measure(rl, repeat_tasks[0], optimizer_factory, shape, paths[-1], seed=args.repeats + k,
                    auto_micro=auto_micro)
        warm_up_iterations_s = time.perf_counter() - started
        warm_up_s = []
        for repeat, tasks in enumerate(repeat_tasks):
            # untimed: the first path must not pay the workers' start (the first repeat) or the new games' loading
            warm_up_s.append(rl.collector.warm_up(tasks, rl.group_size))
            for path in paths if repeat % 2 == 0 else paths[::-1]:
                runs[path].append(measure(rl, tasks, optimizer_factory, shape, path, seed=repeat,
                                          auto_micro=auto_micro))
        _use_path(rl, paths[-1])
        if args.profile_rollout:
            profiler = cProfile.Profile()
            profiler.enable()
            rl.collector.collect(run.datamodule.train_batch().tasks, rl.group_size)
            profiler.disable()
    lines = [
        f"# progpo.bench iteration: {run.policy.name}, {shape.decoder_matmul_params / 1e6:.2f}M decoder matmul params, "
        f"{args.repeats} repeat(s), {torch.get_num_threads()} torch thread(s)",
        f"matmul peak [4096 x {shape.hidden} x {shape.intermediate}]: "
        + ", ".join(f"{p} {g:.0f} GFLOP/s" for p, g in peaks.items()),
        f"CPU bf16 support (AMX-BF16 or AVX512-BF16): {cpu_has_fast_bf16()}" if rl.actor.device.type == "cpu" else "",
        "",
        _report("medians per phase", runs, peaks),
        "",
        f"untimed warm-up iterations on {paths[-1].name} before the repeats: {args.warm_up} ({warm_up_iterations_s:.1f} s); "
        "paths in reverse order on every other repeat",
        "env workers warmed up before each repeat's paths, untimed (start and the repeat's games loaded by one reset): "
        + ", ".join(f"{s:.1f} s" for s in warm_up_s),
        "",
    ]
    old = _iteration_s(runs[paths[0]], new=False)
    lines.append(f"old path (float32, recompute old log-probs, every step its own update forward): {old:.1f} s per "
                 "iteration")
    for path in paths:
        seconds = _iteration_s(runs[path], new=True)
        lines.append(f"{path.name} (reuse the engine's log-probs, shared update forwards): {seconds:.1f} s per "
                     f"iteration, {old / seconds:.2f}x faster than the old path")
        useful = sum(_median(runs[path], k) for k in ("rollout_flops", "score_reuse_flops", "update_shared_flops"))
        peak = peaks["bf16" if path.bf16 else "float32"]
        lines.append(f"  its FLOPs at the {'bf16' if path.bf16 else 'float32'} matmul peak: {useful / peak / 1e9:.1f} s "
                     "per iteration (the floor for this work on this machine: below it only fewer FLOPs help)")
    before, new = _iteration_s(runs[paths[-2]], new=True), _iteration_s(runs[paths[-1]], new=True)
    lines.append(f"new path against {paths[-2].name}: {before:.1f} s -> {new:.1f} s per iteration, "
                 f"{before / new:.2f}x")
    if args.profile_rollout:
        stats = io.StringIO()
        pstats.Stats(profiler, stream=stats).sort_stats("cumulative").print_stats(args.profile_rollout)
        lines += ["", f"## rollout profile ({paths[-1].name}, cumulative)", stats.getvalue()]
    sys.stdout.write("\n".join(lines) + "\n")


def add_parser(sub) -> None:
    parser = sub.add_parser("iteration", help="time one training iteration's phases, float32 against bf16")
    add_run_arguments(parser, repeats_help="iterations measured per path (medians)")
    parser.add_argument("--warm-up", type=int, default=1, metavar="N",
                        help="untimed iterations on the new path first, so that no measured path pays the process's "
                             "one-off costs (0: none)")
    parser.add_argument("--bf16", choices=["auto", "on", "off"], default="auto",
                        help="also measure bf16 autocast (auto: unless the CPU lacks AMX-BF16/AVX512-BF16, where bf16 "
                             "matmuls are emulated; their peak is printed either way)")
    parser.add_argument("--profile-rollout", type=int, default=0, metavar="N",
                        help="also profile one rollout of the new path (outside autocast) and print its top N functions")
    parser.set_defaults(run=bench_iteration)
