"""Text <-> token ids for a GGUF vocabulary, matching llama.cpp (`src/llama-vocab.cpp`).

The merge work runs in the Rust `tokenizers` library, built from the vocabulary stored in the GGUF:

- `tokenizer.ggml.model = gpt2`: byte-level BPE. The pre-tokenizer regexes come from llama.cpp's table
  for `tokenizer.ggml.pre` (a sequence of "isolated" splits, then the GPT-2 byte-to-unicode mapping).
- `tokenizer.ggml.model = llama`: SentencePiece vocabulary. llama.cpp's `llm_tokenizer_spm` repeatedly
  merges the adjacent pair whose concatenation is a vocabulary entry with the highest score. That is BPE
  with one merge per (left, right) split of every entry, ranked by the entry's score (the same
  derivation HF uses for Llama), plus `<0xNN>` byte fallback.

What we do ourselves, because `tokenizers` does it differently from llama.cpp:

- Special tokens (control, user-defined, unknown) are cut out of the text first, longest token first,
  exactly like `tokenizer_st_partition`; with parse_special=False only user-defined ones are. The
  remaining pieces are encoded one by one, so a SentencePiece piece after a special token gets its
  own space prefix, as in llama.cpp.
- Decoding uses a per-id byte table (the llama.cpp `token_to_piece` rules) so that a streamed token
  that ends inside a UTF-8 character can be held back (see `StreamDecoder`).

No Unicode normalization is applied to BPE input, as in llama.cpp (and in transformers' tokenizer built
from a GGUF). HF's own Qwen2 tokenizer applies NFC first; that differs only for non-NFC text such as a
decomposed "e\u0301", never for the ASCII-and-special-token prompts we build.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass
from typing import Iterable

import numpy as np
from tokenizers import Regex
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, normalizers, pre_tokenizers

from ..errors import ModelError
from .gguf import GGUFFile, meta

__all__ = ["Tokenizer", "StreamDecoder", "load_tokenizer"]

# gguf TokenType values (gguf-py constants.py)
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6

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


_PRE_TOKENIZERS = _pre_table()

# Tokens llama.cpp treats as end-of-generation by their text (llama-vocab.cpp, "special_eog_ids").
_EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[",
})
# FIM pad / repo / file-separator tokens: llama.cpp also stops on these (by text).
_FIM_EOG_TEXTS = frozenset({"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", "<|fim_repo|>",
                            "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", "<|file_sep|>"})
_ASCII_SPACE = " \t\n\v\f\r"  # C isspace(), used by the lstrip/rstrip of special tokens


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


class Tokenizer:
    """Encode/decode for one GGUF vocabulary; build it with `load_tokenizer`.

    encode(text, add_special=False, parse_special=True) -> ids; decode(ids, skip_special=False) -> str;
    piece(id) -> bytes; stream_decoder() -> StreamDecoder; chat_prompt(messages) -> str; token_id(text);
    n_vocab, bos_id, eos_id, eos_ids (every end-of-generation id), add_bos, add_eos.
    Immutable after loading, so one instance can serve several threads.
    """

    def __init__(self, *, path: str, kind: str, hf: HFTokenizer, tokens: list[str], attrs: np.ndarray,
                 token_to_id: dict[str, int], pieces: list[bytes], bos_id: int | None, eos_id: int | None,
                 eos_ids: frozenset[int], add_bos: bool, add_eos: bool, add_space_prefix: bool,
                 clean_spaces: bool, specials: list[tuple[str, int, bool, bool]], chat_template: str | None):
        self.path, self.kind = path, kind
        self._hf = hf
        self._tokens = tokens
        self._attrs = attrs  # gguf token type per id (after llama.cpp's EOG overrides)
        self._token_to_id = token_to_id
        self._pieces = pieces  # token_to_piece(id, special=True) as bytes
        self.bos_id, self.eos_id, self.eos_ids = bos_id, eos_id, eos_ids
        self.add_bos, self.add_eos, self.add_space_prefix = add_bos, add_eos, add_space_prefix
        self.clean_spaces = clean_spaces
        self._specials = specials  # (text, id, lstrip, rstrip), longest text first
        self.chat_template = chat_template
        # control/unknown tokens vanish from decoded text when skip_special (llama.cpp special=false)
        self._is_special = np.isin(attrs, (_CONTROL, _UNKNOWN))

    # -- properties --------------------------------------------------------------------------
    @property
    def n_vocab(self) -> int:
        return len(self._tokens)

    def token_id(self, text: str) -> int | None:
        """Id of the vocabulary entry spelled exactly `text` (e.g. "<|im_end|>"), else None."""
        return self._token_to_id.get(text)

    def token_text(self, token_id: int) -> str:
        return self._tokens[token_id]

    # -- encode ------------------------------------------------------------------------------
    def encode(self, text: str, add_special: bool = False, parse_special: bool = True) -> list[int]:
        """llama_tokenize: BOS (and EOS) only with add_special and when the file asks for them."""
        out: list[int] = []
        if add_special and self.add_bos:
            out.append(self.bos_id)
        # One encode per text piece (not encode_batch: its thread pool would make tokenizers warn in
        # forked workers); a SentencePiece piece after a special token gets its own space prefix.
        for frag in self._partition(text, parse_special) if text else ():
            if isinstance(frag, str):
                out.extend(self._hf.encode(frag, add_special_tokens=False).ids)
            else:
                out.append(frag)
        if add_special and self.add_eos:
            out.append(self.eos_id)
        return out

    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        """tokenizer_st_partition: cut special tokens out, longest first, text pieces stay str."""
        frags: list[str | int] = [text]
        for tok_text, tok_id, lstrip, rstrip in self._specials:
            if not parse_special and self._attrs[tok_id] != _USER_DEFINED:
                continue
            if tok_text not in text:  # cheap test on the whole input before touching fragments
                continue
            new: list[str | int] = []
            for frag in frags:
                if not isinstance(frag, str) or tok_text not in frag:
                    new.append(frag)
                    continue
                parts = frag.split(tok_text)
                for i, part in enumerate(parts):
                    if i > 0:
                        new.append(tok_id)
                        if rstrip:
                            part = part.lstrip(_ASCII_SPACE)
                    if lstrip and i < len(parts) - 1:
                        part = part.rstrip(_ASCII_SPACE)
                    if part:
                        new.append(part)
            frags = new
        return frags

    # -- decode ------------------------------------------------------------------------------
    def piece(self, token_id: int, special: bool = True) -> bytes:
        """The bytes of one token (llama_token_to_piece); control tokens give b"" unless special."""
        if not 0 <= token_id < len(self._pieces):
            raise ValueError(f"token id {token_id} out of range for a {len(self._pieces)}-token vocabulary")
        if not special and self._is_special[token_id]:
            return b""
        return self._pieces[token_id]

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """llama_detokenize: the bytes of all tokens, decoded once (invalid UTF-8 -> U+FFFD)."""
        pieces = [self.piece(int(i), not skip_special) for i in ids]
        if self.add_space_prefix and pieces and pieces[0].startswith(b" "):
            pieces[0] = pieces[0][1:]  # SentencePiece: the space the encoder put in front of the text
        data = b"".join(pieces)
        if self.clean_spaces:
            data = _clean_spaces(data)
        return data.decode("utf-8", errors="replace")

    def stream_decoder(self, skip_special: bool = False) -> "StreamDecoder":
        return StreamDecoder(self, skip_special)

    # -- chat --------------------------------------------------------------------------------
    def chat_prompt(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        return _render_chatml(self, messages, add_generation_prompt)

    def __repr__(self) -> str:
        return f"Tokenizer({self.kind}, {self.n_vocab} tokens, {self.path!r})"


class StreamDecoder:
    """Incremental detokenizer: `push` returns only complete UTF-8 text, holding back the bytes of a
    character split across tokens (byte-fallback `<0xNN>` or byte-level pieces); `flush` emits the
    rest (an incomplete tail becomes U+FFFD)."""

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False):
        self._tok = tokenizer
        self._special = not skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        return self._utf8.decode(self._tok.piece(token_id, self._special))

    def flush(self) -> str:
        out = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return out


def _clean_spaces(text: bytes) -> bytes:
    """llama.cpp detokenize clean_spaces: " ?"->"?" etc., " ' "->"'", " 's"->"'s" (three passes)."""
    if b" " not in text:
        return text
    text = re.sub(rb" ([?!.,])", rb"\1", text)
    text = re.sub(rb" ' ", b"'", text)
    return re.sub(rb" '(?=s|m|re|ve)", b"'", text)


# -- chat template ------------------------------------------------------------------------------
_JINJA_STRING = r"""(?:'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")"""


def _jinja_literals(template: str) -> list[str]:
    """All string literals of a jinja template, unescaped (\\n -> newline, \\' -> ')."""
    escapes = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "'": "'", '"': '"'}
    return [re.sub(r"\\(.)", lambda m: escapes.get(m.group(1), m.group(0)), lit[1:-1])
            for lit in re.findall(_JINJA_STRING, template, flags=re.S)]


def _render_chatml(tok: Tokenizer, messages: list[dict], add_generation_prompt: bool) -> str:
    """ChatML without a jinja engine, reading three facts off the file's template:

    - a complete literal "<|im_start|>system...<|im_end|>\\n" is the system turn the template emits
      when the first message is not a system message (Qwen2/2.5, SmolLM2, LightOnOCR's empty one);
    - an image part of a message renders as the literal holding "<|image_pad|>" (once; the caller
      expands it to one token per image embedding);
    - `c['text'] + '...'` gives the suffix of a text part (LightOnOCR adds "\\n").
    """
    template = tok.chat_template
    if template is None:
        raise ModelError(tok.path, "no tokenizer.chat_template in the file; cannot build a chat prompt")
    if "<|im_start|>" not in template:
        raise ModelError(tok.path, f"chat template is not ChatML (no <|im_start|>): {template[:80]!r}...; "
                                   "only ChatML templates are supported")
    literals = _jinja_literals(template)
    default_system = next((s for s in literals if s.startswith("<|im_start|>system")
                           and s.endswith("<|im_end|>\n")), None)
    image = next((s for s in literals if "<|image_pad|>" in s), None)
    suffix = re.search(r"""\[\s*['"]text['"]\s*\]\s*\+\s*(""" + _JINJA_STRING + ")", template)
    text_suffix = _jinja_literals(suffix.group(1))[0] if suffix else ""

    out = []
    if messages and messages[0].get("role") != "system" and default_system is not None:
        out.append(default_system)
    for i, msg in enumerate(messages):
        role, content = msg.get("role"), msg.get("content", "")
        if not isinstance(role, str):
            raise ValueError(f"message {i} has no 'role'")
        if isinstance(content, str):
            body = content
        else:
            body = ""
            for part in content:
                if part.get("type") == "image" or "image" in part or "image_url" in part:
                    if image is None:
                        raise ModelError(tok.path, "the chat template has no image placeholder")
                    body += image
                elif "text" in part:
                    body += part["text"] + text_suffix
        out.append(f"<|im_start|>{role}\n{body}<|im_end|>\n")
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
    return "".join(out)


# -- loading ------------------------------------------------------------------------------------
def load_tokenizer(gf: GGUFFile) -> Tokenizer:
    """Build the tokenizer described by a GGUF's tokenizer.* metadata (see module docstring)."""
    path = gf.path
    model = meta(gf, "tokenizer.ggml.model", str)
    tokens = list(meta(gf, "tokenizer.ggml.tokens", list))
    n = len(tokens)
    if n == 0:
        raise ModelError(path, "tokenizer.ggml.tokens is empty")
    if "" in tokens:  # llama.cpp renames empty entries so they stay unique
        tokens = [t or f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
    token_to_id = {t: i for i, t in enumerate(tokens)}
    if len(token_to_id) != n:
        seen: set[str] = set()
        dup = next(t for t in tokens if t in seen or seen.add(t))
        raise ModelError(path, f"duplicate token {dup!r} in tokenizer.ggml.tokens")
    types = meta(gf, "tokenizer.ggml.token_type", list, None)
    if types is None:
        attrs = np.full(n, _NORMAL, dtype=np.int32)
    elif len(types) < n:
        raise ModelError(path, f"tokenizer.ggml.token_type has {len(types)} entries for {n} tokens")
    else:
        attrs = np.asarray(types, dtype=np.int32)[:n].copy()

    def token_key(key: str, default: int | None) -> int | None:
        value = meta(gf, f"tokenizer.ggml.{key}", int, default)
        return value if value is not None and 0 <= value < n else default

    if model == "gpt2":
        pre_name = meta(gf, "tokenizer.ggml.pre", str, "default")
        pre = _PRE_TOKENIZERS.get(pre_name)
        if pre is None:
            raise ModelError(path, f"unknown pre-tokenizer {pre_name!r} (tokenizer.ggml.pre); supported: "
                                   + ", ".join(sorted(_PRE_TOKENIZERS)))
        hf = _build_bpe(path, token_to_id, meta(gf, "tokenizer.ggml.merges", list), pre)
        # llama.cpp defaults bos/eos to 11 for gpt2 vocabularies; an absent id is more honest.
        bos_id, eos_id = token_key("bos_token_id", None), token_key("eos_token_id", None)
        add_bos, add_space_prefix, clean_spaces = pre.add_bos, False, pre.clean_spaces
        pieces = _bpe_pieces(tokens, attrs)
    elif model == "llama":
        scores = meta(gf, "tokenizer.ggml.scores", list, None)
        scores = np.zeros(n, np.float32) if scores is None else np.asarray(scores, np.float32)[:n]
        if len(scores) < n:
            raise ModelError(path, f"tokenizer.ggml.scores has {len(scores)} entries for {n} tokens")
        add_space_prefix = meta(gf, "tokenizer.ggml.add_space_prefix", bool, True)
        hf = _build_spm(tokens, token_to_id, scores, add_space_prefix, token_key("unknown_token_id", 0))
        bos_id, eos_id = token_key("bos_token_id", 1), token_key("eos_token_id", 2)
        add_bos, clean_spaces = True, False
        pieces = _spm_pieces(tokens, attrs)
    else:
        raise ModelError(path, f"unsupported tokenizer model {model!r} (tokenizer.ggml.model); "
                               "supported: gpt2 (byte-level BPE), llama (SentencePiece)")
    if model == "gpt2":
        add_space_prefix = meta(gf, "tokenizer.ggml.add_space_prefix", bool, add_space_prefix)
    add_bos = meta(gf, "tokenizer.ggml.add_bos_token", bool, add_bos)
    add_eos = meta(gf, "tokenizer.ggml.add_eos_token", bool, False)
    if add_bos and bos_id is None:
        raise ModelError(path, "tokenizer.ggml.add_bos_token is true but tokenizer.ggml.bos_token_id is not set")
    if add_eos and eos_id is None:
        raise ModelError(path, "tokenizer.ggml.add_eos_token is true but tokenizer.ggml.eos_token_id is not set")

    # End of generation, as llama.cpp decides it: the file's eos/eot/eom ids plus tokens recognised by
    # their text, which become control tokens (so decode(skip_special=True) drops them). Unlike
    # llama.cpp we skip normal entries: Qwen's vocabulary has "</s>" as a plain BPE piece (id 128247),
    # and stopping on it would cut an OCR transcript at a literal "</s>".
    eog = {i for i in (eos_id, token_key("eot_token_id", None), token_key("eom_token_id", None)) if i is not None}
    for text in _EOG_TEXTS | _FIM_EOG_TEXTS:
        i = token_to_id.get(text)
        if i is not None and attrs[i] != _NORMAL:
            eog.add(i)
            if attrs[i] not in (_CONTROL, _UNKNOWN):
                attrs[i] = _CONTROL
                pieces[i] = tokens[i].encode()

    # Special tokens matched in raw text: control, user-defined and unknown entries, longest first.
    special_ids = np.flatnonzero(np.isin(attrs, (_CONTROL, _USER_DEFINED, _UNKNOWN))).tolist()
    rstrip = set()
    name = meta(gf, "general.name", str, "").lower()
    if "phi-3" in name or "phi3" in name:  # llama.cpp: Phi-3 special tokens eat the whitespace after them
        rstrip = set(special_ids) | {token_to_id.get("</s>")}
        rstrip -= {token_to_id.get(t) for t in ("<unk>", "<s>", "<|endoftext|>")}
    specials = sorted(((tokens[i], i, False, i in rstrip) for i in special_ids),
                      key=lambda s: -len(s[0].encode()))
    return Tokenizer(path=str(path), kind=model, hf=hf, tokens=tokens, attrs=attrs, token_to_id=token_to_id,
                     pieces=pieces, bos_id=bos_id, eos_id=eos_id, eos_ids=frozenset(eog), add_bos=add_bos,
                     add_eos=add_eos, add_space_prefix=add_space_prefix, clean_spaces=clean_spaces,
                     specials=specials, chat_template=meta(gf, "tokenizer.chat_template", str, None))


def _build_bpe(path, vocab: dict[str, int], merges: list[str], pre: _Pre) -> HFTokenizer:
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


def _build_spm(tokens: list[str], vocab: dict[str, int], scores: np.ndarray, add_space_prefix: bool,
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


def _bpe_pieces(tokens: list[str], attrs: np.ndarray) -> list[bytes]:
    """token_to_piece(special=True) for a byte-level vocabulary."""
    pieces = []
    for text, attr in zip(tokens, attrs.tolist()):
        if attr == _NORMAL:
            try:
                pieces.append(text.translate(_UNICODE_TO_LATIN1).encode("latin-1"))
            except UnicodeEncodeError:  # a character outside the byte alphabet: keep its UTF-8
                pieces.append(b"".join(_byte_piece(c) for c in text))
        elif attr == _BYTE:
            pieces.append(bytes([int(text[3:5], 16)]))
        elif attr in (_CONTROL, _UNKNOWN, _USER_DEFINED):
            pieces.append(text.encode())
        else:  # unused / undefined entries print nothing (llama.cpp)
            pieces.append(b"")
    return pieces


def _byte_piece(c: str) -> bytes:
    mapped = c.translate(_UNICODE_TO_LATIN1)
    return mapped.encode("latin-1") if ord(mapped) < 256 else c.encode()


def _spm_pieces(tokens: list[str], attrs: np.ndarray) -> list[bytes]:
    """token_to_piece(special=True) for a SentencePiece vocabulary."""
    pieces = []
    for text, attr in zip(tokens, attrs.tolist()):
        if attr == _NORMAL:
            pieces.append(text.replace("▁", " ").encode())
        elif attr == _BYTE:
            pieces.append(bytes([int(text[3:5], 16)]))
        elif attr in (_CONTROL, _UNKNOWN, _USER_DEFINED):
            pieces.append(text.encode())
        else:
            pieces.append(b"")
    return pieces
