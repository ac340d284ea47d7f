"""The reader's vocabulary: byte-level BPE trained with `tokenizers` on the training text, with the
pre-tokenizer the GGUF names (`qwen2`, as LightOnOCR's) and Qwen's chat control tokens at the end.

The engine builds its tokenizer from the GGUF's `tokenizer.ggml.*` keys, so what is exported is the
token list, the token types and the merges, exactly as llama.cpp's converter writes them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from pantheon_ocr.engine.text.vocab import PRE_TOKENIZERS

from .texts import SUP, corpus, sample_text

PRE = "qwen2"
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|image_pad|>")
# The chat prompt spells these as single tokens (the engine looks them up by name).
PROMPT_WORDS = ("system", "user", "assistant")


@dataclass(frozen=True)
class Vocab:
    tokens: list[str]  # byte-level spelling, id order
    merges: list[str]  # "left right", rank order
    hf: Tokenizer

    @property
    def ids(self) -> dict[str, int]:
        return {t: i for i, t in enumerate(self.tokens)}

    def token_types(self) -> list[int]:
        return [3 if t in SPECIALS else 1 for t in self.tokens]  # CONTROL / NORMAL

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False).ids

    def decode(self, ids) -> str:
        return self.hf.decode([int(i) for i in ids], skip_special_tokens=True)

    def id(self, token: str) -> int:
        return self.tokens.index(token)


def _pre_tokenizer():
    splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in PRE_TOKENIZERS[PRE].regexes]
    return pre_tokenizers.Sequence(splits + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def train_vocab(size: int, seed: int = 0, n_synthetic: int = 60_000) -> Vocab:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = _pre_tokenizer()
    tok.decoder = decoders.ByteLevel()
    rng = np.random.default_rng(seed)

    def texts():
        yield from corpus("prose-train")
        yield from corpus("code-train")
        for _ in range(n_synthetic):
            yield sample_text(rng).replace(SUP, "")
        for _ in range(5000):  # enough that BPE learns each prompt word whole, without a space
            yield from PROMPT_WORDS

    trainer = trainers.BpeTrainer(vocab_size=size - len(SPECIALS), min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts(), trainer)
    tok.add_special_tokens(list(SPECIALS))
    return _vocab(tok)


def _vocab(tok: Tokenizer) -> Vocab:
    model = json.loads(tok.to_str())["model"]
    vocab = dict(model["vocab"])
    for added in json.loads(tok.to_str())["added_tokens"]:
        vocab[added["content"]] = added["id"]
    tokens = [None] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    if None in tokens:
        raise ValueError("token ids are not contiguous")
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    missing = [w for w in PROMPT_WORDS + SPECIALS if w not in vocab]
    if missing:
        raise ValueError(f"the vocabulary lacks {missing}: the chat prompt needs them as single tokens")
    return Vocab(tokens, merges, tok)


def save(vocab: Vocab, path: Path) -> None:
    vocab.hf.save(str(path))


def load(path: Path) -> Vocab:
    return _vocab(Tokenizer.from_file(str(path)))
