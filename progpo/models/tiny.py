"""``model=tiny``: a few-million-parameter Qwen2 with a tokenizer trained on the environment's own text.

Fast enough to run the whole RL loop on two CPU cores. Built from scratch in three steps: expert demos on
the training tasks, a byte-level BPE tokenizer trained on their prompts, and a supervised warm start on
the same demos (see ``warm_start.py``). The result is cached by content (parameters + env identity) and
loaded from the cache folder, which is also what vLLM starts from.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import tokenizers
import torch
import transformers
from tokenizers import AddedToken, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM, Qwen2Tokenizer

from envs.base import EnvSuite, tasks_fingerprint
from progpo.models.cache import cached_build
from progpo.models.policy import Policy
from progpo.models.warm_start import (
    WarmStartConfig,
    collect_demos,
    response_text,
    supervised_finetune,
)
from progpo.rollout.prompt import PROMPT_STYLES, PromptBuilder

log = logging.getLogger(__name__)

BUILD_VERSION = 4  # bump when the build procedure changes, so old cache entries are not re-used
PAD, EOS, IM_START = "<|endoftext|>", "<|im_end|>", "<|im_start|>"
FORMAT_TOKENS = ("<action>", "</action>", "<think>", "</think>")  # single tokens: short answers, clean stops
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
MIN_TOKENIZER_EPISODES = 16  # demos gathered for the tokenizer corpus even without a warm start


def train_tokenizer(corpus: Iterable[str], vocab_size: int, max_context: int) -> Qwen2Tokenizer:
    """Byte-level BPE trained on ``corpus``, as a ``Qwen2Tokenizer`` with ChatML markers and left padding.

    The model folder says ``qwen2``, so ``AutoTokenizer`` (and vLLM) reload the tokenizer as a
    ``Qwen2Tokenizer``, which imposes Qwen2's normaliser and pre-tokeniser (digits split one by one). The
    BPE is trained under exactly those and wrapped in that class, so the warm start tokenises text the way
    every later reload does.
    """
    reference = Qwen2Tokenizer()
    tok = tokenizers.Tokenizer(models.BPE())
    tok.normalizer = reference.backend_tokenizer.normalizer
    tok.pre_tokenizer = reference.backend_tokenizer.pre_tokenizer
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[PAD, IM_START, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    model = json.loads(tok.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    wrapped = Qwen2Tokenizer(
        vocab=model["vocab"],
        merges=merges,
        unk_token=PAD,
        eos_token=EOS,
        pad_token=PAD,
        padding_side="left",
        model_max_length=max_context,
        chat_template=CHAT_TEMPLATE,
    )
    wrapped.add_tokens([AddedToken(IM_START, special=True, normalized=False)])
    wrapped.add_tokens([AddedToken(t, normalized=False, special=False) for t in FORMAT_TOKENS])
    return wrapped


def check_reload(tokenizer, folder: Path, texts: Sequence[str]) -> None:
    """Fail the build if the saved tokenizer, reloaded like vLLM and RL reload it, tokenises differently."""
    reloaded = AutoTokenizer.from_pretrained(str(folder))
    for text in texts:
        a = tokenizer(text, add_special_tokens=False)["input_ids"]
        b = reloaded(text, add_special_tokens=False)["input_ids"]
        if a != b:
            raise RuntimeError(
                f"the tiny tokenizer changes on reload ({type(reloaded).__name__}): {text[:60]!r} -> {a[:12]} vs "
                f"{b[:12]}; the warm start would train on other token ids than rollouts use"
            )


def _corpus(demos, history: int, prompt_style: str = "compact") -> list[str]:
    render = PROMPT_STYLES[prompt_style]
    texts = []
    for d in demos:
        pairs = list(d.past[-history:]) if history > 0 else []
        texts.append(render(d.task_description, d.observation, d.admissible, pairs, len(d.past)))
        texts.append(response_text(d.expert_action))
    return texts


def count_parameters(model: torch.nn.Module) -> int:
    """Unique parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def build_tiny(
    suite: EnvSuite,
    device: str = "cpu",
    name: str = "tiny",
    vocab_size: int = 4096,
    hidden_size: int = 256,
    num_layers: int = 4,
    num_heads: int = 4,
    intermediate_size: int = 688,
    max_context: int = 2048,
    history: int = 2,
    max_new_tokens: int = 32,
    seed: int = 0,
    warm_start: Mapping[str, Any] | WarmStartConfig | None = None,
    prompt_style: str = "compact",
    constrain_to_admissible: bool = True,
) -> Policy:
    """Build (or load from the cache) the tiny policy for ``suite``.

    Args:
        suite: the environment suite; its ``train_tasks`` and expert provide the tokenizer corpus and demos.
        device: where the returned model lives (the warm start also runs there).
        vocab_size: BPE vocabulary target (fewer if the corpus has fewer merges).
        hidden_size, num_layers, num_heads, intermediate_size: Qwen2 shape (tied embeddings).
        max_context: longest prompt + response the policy is used with.
        history, max_new_tokens: must match the rollout (K pairs, response budget), so the warm start
            sees prompts exactly as RL builds them.
        seed: model initialisation seed.
        warm_start: ``WarmStartConfig`` fields (``n_episodes``, ``epochs``, ``lr``, ``batch_size``,
            ``max_steps``, ``max_episode_steps``, ``action_noise``, ``seed``).
        prompt_style: ``compact`` (default: no instruction boilerplate, ~half the tokens) or ``paper``;
            RL uses the style the model was warm-started with.
        constrain_to_admissible: the rollout engine decodes only admissible commands for this model
            (a 3M-parameter model trained from scratch learns which command to pick faster than how to spell
            every command of every room); ``rollout.engine.constrain_to_admissible`` overrides it.
    """
    if isinstance(warm_start, WarmStartConfig):
        ws = warm_start
    else:
        ws = WarmStartConfig(**dict(warm_start or {}))
    if max_new_tokens >= max_context:
        raise ValueError(f"max_new_tokens ({max_new_tokens}) must be < model.max_context ({max_context})")
    demo_episodes = max(ws.n_episodes, MIN_TOKENIZER_EPISODES)
    used_tasks = suite.train_tasks[: min(demo_episodes, len(suite.train_tasks))]
    shape = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        intermediate_size=intermediate_size,
        max_context=max_context,
    )
    params = {
        "build_version": BUILD_VERSION,
        "shape": shape,
        "history": history,
        "max_new_tokens": max_new_tokens,
        "prompt_style": prompt_style,
        "seed": seed,
        "warm_start": vars(ws),
        "env": {
            "name": suite.name,
            "train_tasks": tasks_fingerprint(used_tasks),
            "max_steps": suite.max_steps,
        },
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }

    def build(out: Path) -> dict[str, Any]:
        started = time.perf_counter()
        demos, stats = collect_demos(suite, WarmStartConfig(**{**vars(ws), "n_episodes": demo_episodes}))
        # Episodes beyond n_episodes only feed the tokenizer corpus.
        demos_for_sft = [d for d in demos if d.episode < ws.n_episodes]
        demo_seconds = time.perf_counter() - started
        corpus = _corpus(demos, history, prompt_style)
        tokenizer = train_tokenizer(corpus, vocab_size, max_context)
        config = Qwen2Config(
            vocab_size=len(tokenizer),
            hidden_size=hidden_size,
            intermediate_size=intermediate_size,
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=num_heads,
            max_position_embeddings=max_context,
            tie_word_embeddings=True,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            bos_token_id=None,
        )
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).to(device)
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        builder = PromptBuilder(
            tokenizer, history=history, max_prompt_tokens=max_context - max_new_tokens, style=prompt_style
        )
        config.save_pretrained(out)  # the model type decides which tokenizer class AutoTokenizer picks
        tokenizer.save_pretrained(out)
        sample = corpus[:: max(1, len(corpus) // 200)]
        if demos:
            d = demos[-1]
            sample.append(builder.build(d.task_description, d.observation, d.admissible, d.past).text)
        check_reload(tokenizer, out, sample)
        sft = supervised_finetune(model, tokenizer, builder, demos_for_sft, ws)
        model.to("cpu").save_pretrained(out)
        summary = {
            "parameters": count_parameters(model),
            "vocab_size": len(tokenizer),
            "demo_episodes": stats.episodes,
            "demo_steps": stats.steps,
            "sft_episodes": ws.n_episodes,
            "sft_demo_steps": len(demos_for_sft),
            "demo_noisy_steps": stats.noisy_steps,
            "demo_invalid_steps": stats.invalid_steps,
            "demo_won": stats.won,
            "demo_seconds": demo_seconds,
            "build_seconds": time.perf_counter() - started,
            **sft,
        }
        log.info("tiny model built: %s", summary)
        return summary

    folder = cached_build("tiny", params, build)
    policy = load_tiny(folder, device=device, name=name, max_context=max_context)
    policy.prompt_style = prompt_style
    policy.constrain_to_admissible = constrain_to_admissible
    return policy


def load_tiny(folder: str | Path, device: str = "cpu", name: str = "tiny", max_context: int = 2048) -> Policy:
    """Load a built tiny policy from its folder."""
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    tokenizer.padding_side = "left"
    model = Qwen2ForCausalLM.from_pretrained(str(folder), dtype=torch.float32).to(device)
    model.eval()
    return Policy(model=model, tokenizer=tokenizer, name=name, max_context=max_context, source=str(folder))
