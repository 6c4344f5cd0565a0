"""``bracket_words``: a word inside ``[...]`` tokenises as in running text, and the tokenizer reloads as trained."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from toy_env import TEST_SHAPE, fake_room_suite
from transformers import Qwen2Config

from progpo.models.tiny import (
    GENERIC_TOKENIZER,
    check_reload,
    load_tokenizer,
    save_tokenizer,
    train_tokenizer,
)
from progpo.warmstart.tiny import build_tiny

INSTRUCTION = "i need a grey phone case, with color: grey, and price lower than 40.00 dollars"
PAGE = "You have clicked grey. [SEP] Back to Search [SEP] color [SEP] grey [SEP] navy [SEP] Buy Now"
COMMANDS = ["click[grey]", "click[navy]", "click[buy now]", "click[b0abcdefgh]", "search[grey phone case]"]
CORPUS = [f"Task: {INSTRUCTION}\nNow: {PAGE}\nActions: " + " | ".join(COMMANDS)] * 4 + [
    f"<action>{c}</action>" for c in COMMANDS
] * 4


def _ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("bracket_words", [False, True])
def test_a_bracketed_word_gets_the_token_of_running_text_only_with_bracket_words(bracket_words):
    tok = train_tokenizer(CORPUS, vocab_size=400, max_context=1024, bracket_words=bracket_words)
    in_text = _ids(tok, f"Task: {INSTRUCTION}\nNow: {PAGE}")
    for word in ("grey", "navy"):
        command = _ids(tok, f"<action>click[{word}]</action>")
        word_ids = _ids(tok, f" {word}")  # the word as the instruction and the page write it
        assert all(i in in_text for i in word_ids)
        # Qwen2's pre-tokeniser glues the word to "[": the command never holds the running-text token
        assert all(i in command for i in word_ids) == bracket_words, (word, tok.convert_ids_to_tokens(command))
    # decoding gives back the exact text, and re-encoding the decoded answer gives the same ids
    for text in [*CORPUS, "x [a] [[b]] [ c] [SEP]"]:
        ids = _ids(tok, text)
        assert tok.decode(ids) == text
        assert _ids(tok, tok.decode(ids)) == ids


def test_bracket_words_tokenizer_reloads_as_trained_with_its_chat_template_and_padding(tmp_path):
    tok = train_tokenizer(CORPUS, vocab_size=400, max_context=1024, bracket_words=True)
    # a qwen2 model folder: its config.json is what makes transformers 5's AutoTokenizer rebuild a Qwen2Tokenizer
    Qwen2Config(vocab_size=len(tok)).save_pretrained(tmp_path)
    save_tokenizer(tok, tmp_path)
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["tokenizer_class"] == GENERIC_TOKENIZER
    reloaded = load_tokenizer(tmp_path)
    check_reload(tok, tmp_path, [*CORPUS, "<|im_start|>user\nclick[grey]<|im_end|>"])
    assert reloaded.padding_side == "left" and reloaded.eos_token == "<|im_end|>" and reloaded.pad_token == tok.pad_token
    chat = [{"role": "user", "content": "click[grey]"}]
    assert reloaded.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == \
        tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    # a plain Qwen2 tokenizer keeps its class name, and AutoTokenizer still loads it
    plain = train_tokenizer(CORPUS, vocab_size=400, max_context=1024)
    other = Path(tmp_path / "plain")
    Qwen2Config(vocab_size=len(plain)).save_pretrained(other)
    save_tokenizer(plain, other)
    assert type(load_tokenizer(other)).__name__ == "Qwen2Tokenizer"
    check_reload(plain, other, CORPUS)


def test_build_tiny_is_plain_by_default_and_keys_the_cache_on_bracket_words():
    kwargs = dict(**{**TEST_SHAPE, "max_context": 512}, warm_start={"n_episodes": 0})
    room = fake_room_suite(n_train=20)
    plain = build_tiny(room, **kwargs)
    spaced = build_tiny(room, bracket_words=True, **kwargs)
    assert json.loads(Path(spaced.source, "tokenizer_config.json").read_text())["tokenizer_class"] == GENERIC_TOKENIZER
    assert json.loads(Path(plain.source, "tokenizer_config.json").read_text())["tokenizer_class"] != GENERIC_TOKENIZER
    assert plain.source != spaced.source  # two cache entries
    text = "click[go] [SEP] go"
    for policy, running_text_word in ((spaced, True), (plain, False)):
        ids = policy.tokenizer(text, add_special_tokens=False)["input_ids"]
        assert policy.tokenizer.decode(ids) == text
        upto_word = len(policy.tokenizer("click[go", add_special_tokens=False)["input_ids"])
        tokens = policy.tokenizer.convert_ids_to_tokens(ids)[:upto_word]
        assert any(t.startswith("\u0120") for t in tokens) == running_text_word, tokens  # Ġ: a running-text word
