"""The tiny policy's parts: a byte-level BPE tokenizer trained on the environment's text, a small Qwen2.

``model=tiny`` is built by :func:`progpo.warmstart.tiny.build_tiny` (demos -> tokenizer -> model -> warm start,
cached by content); this module holds the pieces that need no environment or rollout code, and the loader.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path

import tokenizers
import torch
from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM, Qwen2Tokenizer

from progpo.types import Policy

log = logging.getLogger(__name__)

PAD, EOS, IM_START = "<|endoftext|>", "<|im_end|>", "<|im_start|>"
FORMAT_TOKENS = ("<action>", "</action>", "<think>", "</think>")  # single tokens: short answers, clean stops
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def train_tokenizer(corpus: Iterable[str], vocab_size: int, max_context: int,
                    bracket_words: bool = False) -> PreTrainedTokenizerFast:
    """Byte-level BPE trained on ``corpus``, with ChatML markers and left padding.

    ``bracket_words=False``: wrapped in a ``Qwen2Tokenizer``. The model folder says ``qwen2``, so
    ``AutoTokenizer`` (and vLLM) reload it as a ``Qwen2Tokenizer``, which imposes Qwen2's normaliser and
    pre-tokeniser (digits split one by one); the BPE is trained under exactly those, so the warm start
    tokenises text the way every later reload does.

    ``bracket_words=True``: the same, plus a space after every ``[`` (a normaliser) that the decoder takes
    out again, saved as a plain ``PreTrainedTokenizerFast`` so that a reload keeps both. Qwen2's
    pre-tokeniser glues a word to the ``[`` before it, so in ``click[grey]`` the word is the token ``[grey``
    while the instruction and the page say ``Ġgrey``: the model cannot copy a word into a command, it must
    learn every pairing. With the space, ``click[grey]`` is ``click`` ``[`` ``Ġgrey`` ``]`` and the word is the
    token of running text (WebShop's option clicks and search queries; docs/guide/webshop.md).
    Decoding is exact for any text without a ``[`` followed by a space of its own, and for all text
    the ids of a command are those of its decoded text re-encoded.
    """
    reference = Qwen2Tokenizer()
    tok = tokenizers.Tokenizer(models.BPE())
    tok.normalizer = reference.backend_tokenizer.normalizer
    tok.pre_tokenizer = reference.backend_tokenizer.pre_tokenizer
    if bracket_words:
        tok.normalizer = normalizers.Sequence([reference.backend_tokenizer.normalizer,
                                               normalizers.Replace("[", "[ ")])
        tok.decoder = decoders.Sequence([decoders.ByteLevel(), decoders.Replace("[ ", "[")])
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[PAD, IM_START, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    common = dict(unk_token=PAD, eos_token=EOS, pad_token=PAD, padding_side="left", model_max_length=max_context,
                  chat_template=CHAT_TEMPLATE)
    if bracket_words:
        wrapped = PreTrainedTokenizerFast(tokenizer_object=tok, clean_up_tokenization_spaces=False, **common)
    else:
        model = json.loads(tok.to_str())["model"]
        merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
        wrapped = Qwen2Tokenizer(vocab=model["vocab"], merges=merges, **common)
    wrapped.add_tokens([AddedToken(IM_START, special=True, normalized=False)])
    wrapped.add_tokens([AddedToken(t, normalized=False, special=False) for t in FORMAT_TOKENS])
    return wrapped


GENERIC_TOKENIZER = "PreTrainedTokenizerFast"


def save_tokenizer(tokenizer, folder: Path) -> None:
    """``save_pretrained``, naming a generic tokenizer ``PreTrainedTokenizerFast`` in its config: the class that
    loads ``tokenizer.json`` as it is in transformers 4 (5 writes ``TokenizersBackend``, which 4 does not know) and
    that :func:`load_tokenizer` looks for. A ``Qwen2Tokenizer`` is saved as it is. vLLM loads the folder with
    ``AutoTokenizer`` (a ``Qwen2Tokenizer`` under transformers 5, without the normaliser): it is given token ids and
    its texts are re-decoded with the policy's tokenizer (``VLLMEngine.generate``)."""
    tokenizer.save_pretrained(folder)
    if isinstance(tokenizer, Qwen2Tokenizer):
        return
    config_file = Path(folder) / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["tokenizer_class"] = GENERIC_TOKENIZER
    config_file.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def load_tokenizer(folder: str | Path):
    """The tokenizer saved in ``folder``, as it was trained. transformers 5's ``AutoTokenizer`` gives every
    ``qwen2`` folder a ``Qwen2Tokenizer`` (rebuilt from vocab and merges, whatever ``tokenizer_config.json`` names),
    which would drop a ``bracket_words`` normaliser; a folder whose config names the generic class is loaded with
    it."""
    config_file = Path(folder) / "tokenizer_config.json"
    config = json.loads(config_file.read_text()) if config_file.exists() else {}
    if config.get("tokenizer_class") == GENERIC_TOKENIZER:
        return PreTrainedTokenizerFast.from_pretrained(str(folder))
    return AutoTokenizer.from_pretrained(str(folder))


def check_reload(tokenizer, folder: Path, texts: Sequence[str]) -> None:
    """Fail the build if the saved tokenizer, reloaded like vLLM and RL reload it, tokenises differently."""
    reloaded = load_tokenizer(folder)
    for text in texts:
        a = tokenizer(text, add_special_tokens=False)["input_ids"]
        b = reloaded(text, add_special_tokens=False)["input_ids"]
        if a != b:
            raise RuntimeError(
                f"the tiny tokenizer changes on reload ({type(reloaded).__name__}): {text[:60]!r} -> {a[:12]} vs "
                f"{b[:12]}; the warm start would train on other token ids than rollouts use"
            )


def count_parameters(model: torch.nn.Module) -> int:
    """Unique parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def tiny_qwen2(tokenizer, hidden_size: int, num_layers: int, num_heads: int, intermediate_size: int,
               max_context: int, seed: int, device: str = "cpu") -> Qwen2ForCausalLM:
    """A randomly initialised Qwen2 (tied embeddings) sized for ``tokenizer``; ``seed`` fixes the weights."""
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
    return model


def load_tiny(folder: str | Path, device: str = "cpu", name: str = "tiny", max_context: int = 2048) -> Policy:
    """Load a built tiny policy from its folder."""
    tokenizer = load_tokenizer(folder)
    tokenizer.padding_side = "left"
    model = Qwen2ForCausalLM.from_pretrained(str(folder), dtype=torch.float32).to(device)
    model.eval()
    return Policy(model=model, tokenizer=tokenizer, name=name, max_context=max_context, source=str(folder))
