"""Building the `tokenizers` objects and per-id byte pieces from a GGUF vocabulary: llama.cpp's
pre-tokenizer table (regexes copied verbatim from llama-vocab.cpp), byte-level BPE, and
SentencePiece as score-ranked BPE merges."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
from tokenizers import Regex
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, normalizers, pre_tokenizers

from ...errors import ModelError

# gguf TokenType values (gguf-py constants.py)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# -- pre-tokenizers (llama.cpp llm_tokenizer_bpe, regexes copied verbatim) ----------------------
_CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_QWEN2 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN35 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+"
           r"|\s+(?!\S)|\s+")
_LLAMA3 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"


@dataclass(frozen=True)
class _Pre:
    regexes: tuple[str, ...]
    clean_spaces: bool = True  # llama.cpp's clean_up_tokenization_spaces on detokenize
    ignore_merges: bool = False  # a pre-token that is itself a vocab entry is emitted directly
    add_bos: bool = False  # default when the GGUF has no tokenizer.ggml.add_bos_token


def _pre_table() -> dict[str, _Pre]:
    qwen2, qwen2_clean = _Pre((_QWEN2,), clean_spaces=False), _Pre((_QWEN2,))
    llama3 = _Pre((_LLAMA3,), ignore_merges=True, add_bos=True)
    starcoder, smollm = _Pre((r"\p{N}", _GPT2)), _Pre((r"\p{N}", _GPT2), clean_spaces=False)
    gpt2 = _Pre((_GPT2,))
    table = {
        "default": _Pre((r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]")),
        "falcon": _Pre((r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, "[0-9][0-9][0-9]")),
        "qwen35": _Pre((_QWEN35,), clean_spaces=False),
        "dbrx": _Pre((_LLAMA3,)), "smaug-bpe": _Pre((_LLAMA3,)),
        "command-r": smollm, "smollm": smollm, "trillion": _Pre((_GPT2,), clean_spaces=False),
        "granite-docling": _Pre((_GPT2,), clean_spaces=False),
    }
    for name in ("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2"):
        table[name] = qwen2
    for name in ("stablelm2", "megrez"):
        table[name] = qwen2_clean
    for name in ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"):
        table[name] = llama3
    for name in ("starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2"):
        table[name] = starcoder
    for name in ("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0",
                 "mellum", "modern-bert", "mpt", "olmo", "exaone4"):
        table[name] = gpt2
    return table


PRE_TOKENIZERS = _pre_table()


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE vocabularies."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def build_bpe(path, vocab: dict[str, int], merges: list[str], pre: _Pre) -> HFTokenizer:
    # Merge "left right" splits at the first space after position 0 (llama.cpp); rank = index.
    pairs = []
    for m in merges:
        cut = m.find(" ", 1)
        if cut > 0:
            pairs.append((m[:cut], m[cut + 1:]))
    try:
        bpe = models.BPE(vocab=vocab, merges=pairs, ignore_merges=pre.ignore_merges)
    except Exception:
        # tokenizers refuses merges of unknown tokens (llama.cpp just never uses them); drop those,
        # and keep the first of duplicate merges as llama.cpp does.
        seen: set[tuple[str, str]] = set()
        pairs = [p for p in pairs if p[0] in vocab and p[1] in vocab and p[0] + p[1] in vocab
                 and not (p in seen or seen.add(p))]
        try:
            bpe = models.BPE(vocab=vocab, merges=pairs, ignore_merges=pre.ignore_merges)
        except Exception as exc:
            raise ModelError(path, f"cannot build the BPE tokenizer from tokenizer.ggml.merges: {exc}") from None
    hf = HFTokenizer(bpe)
    hf.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in pre.regexes]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    return hf


def build_spm(tokens: list[str], vocab: dict[str, int], scores: np.ndarray, add_space_prefix: bool,
               unk_id: int | None) -> HFTokenizer:
    # llm_tokenizer_spm merges the adjacent pair whose concatenation is the best-scoring vocab entry.
    # As BPE: every (left, right) split of every entry whose halves are entries, ranked by score.
    order = np.argsort(-scores, kind="stable")
    pairs = []
    for i in order.tolist():
        text = tokens[i]
        for cut in range(1, len(text)):
            left, right = text[:cut], text[cut:]
            if left in vocab and right in vocab:
                pairs.append((left, right))
    unk = tokens[unk_id] if unk_id is not None else None
    hf = HFTokenizer(models.BPE(vocab=vocab, merges=pairs, unk_token=unk, byte_fallback=True))
    steps = [normalizers.Prepend("▁")] if add_space_prefix else []
    hf.normalizer = normalizers.Sequence(steps + [normalizers.Replace(" ", "▁")])
    return hf


_BYTE_CHARS = _byte_to_unicode()
_UNICODE_TO_LATIN1 = {ord(c): chr(b) for b, c in _BYTE_CHARS.items() if ord(c) != b}


def bpe_pieces(tokens: list[str], attrs: np.ndarray) -> list[bytes]:
    """token_to_piece(special=True) for a byte-level vocabulary."""
    pieces = []
    for text, attr in zip(tokens, attrs.tolist()):
        if attr == NORMAL:
            try:
                pieces.append(text.translate(_UNICODE_TO_LATIN1).encode("latin-1"))
            except UnicodeEncodeError:  # a character outside the byte alphabet: keep its UTF-8
                pieces.append(b"".join(_byte_piece(c) for c in text))
        elif attr == BYTE:
            pieces.append(_byte_of(text))
        elif attr in (CONTROL, UNKNOWN, USER_DEFINED):
            pieces.append(text.encode())
        else:  # unused / undefined entries print nothing (llama.cpp)
            pieces.append(b"")
    return pieces


def _byte_of(text: str) -> bytes:
    """A byte token `<0xNN>` -> that byte; a byte-typed entry spelled otherwise (a damaged
    vocabulary) keeps its own UTF-8 rather than failing the whole load."""
    m = re.fullmatch(r"<0x([0-9A-Fa-f]{2})>", text)
    return bytes([int(m.group(1), 16)]) if m else text.encode("utf-8", "replace")


def _byte_piece(c: str) -> bytes:
    mapped = c.translate(_UNICODE_TO_LATIN1)
    return mapped.encode("latin-1") if ord(mapped) < 256 else c.encode()


def spm_pieces(tokens: list[str], attrs: np.ndarray) -> list[bytes]:
    """token_to_piece(special=True) for a SentencePiece vocabulary."""
    pieces = []
    for text, attr in zip(tokens, attrs.tolist()):
        if attr == NORMAL:
            pieces.append(text.replace("▁", " ").encode())
        elif attr == BYTE:
            pieces.append(_byte_of(text))
        elif attr in (CONTROL, UNKNOWN, USER_DEFINED):
            pieces.append(text.encode())
        else:
            pieces.append(b"")
    return pieces
