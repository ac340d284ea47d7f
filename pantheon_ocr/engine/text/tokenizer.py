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
from typing import Iterable

import numpy as np
from tokenizers import Tokenizer as HFTokenizer

from ...errors import ModelError
from .chat import render_chatml
from ..format.gguf import GGUFFile, meta, meta_array
from .vocab import (
    CONTROL, NORMAL, PRE_TOKENIZERS, UNKNOWN, USER_DEFINED, bpe_pieces, build_bpe, build_spm, spm_pieces,
)

__all__ = ["Tokenizer", "StreamDecoder", "load_tokenizer"]



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
        self._is_special = np.isin(attrs, (CONTROL, UNKNOWN))

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
            if not parse_special and self._attrs[tok_id] != USER_DEFINED:
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

    def decode(self, ids: Iterable[int], skip_special: bool = False, cut: bool = False) -> str:
        """llama_detokenize: the bytes of all tokens, decoded once (invalid UTF-8 -> U+FFFD).
        cut: the tokens stopped before the text's end (a page at max_tokens): a character whose
        bytes the last tokens only began is left out, not shown as U+FFFD."""
        pieces = [self.piece(int(i), not skip_special) for i in ids]
        if self.add_space_prefix and pieces and pieces[0].startswith(b" "):
            pieces[0] = pieces[0][1:]  # SentencePiece: the space the encoder put in front of the text
        data = b"".join(pieces)
        if self.clean_spaces:
            data = _clean_spaces(data)
        if cut:  # not final: the incremental decoder keeps an unfinished character back, and drops it here
            return codecs.getincrementaldecoder("utf-8")(errors="replace").decode(data, final=False)
        return data.decode("utf-8", errors="replace")

    def stream_decoder(self, skip_special: bool = False) -> "StreamDecoder":
        return StreamDecoder(self, skip_special)

    # -- chat --------------------------------------------------------------------------------
    def chat_prompt(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        return render_chatml(self.chat_template, self.path, messages, add_generation_prompt)

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


# -- loading ------------------------------------------------------------------------------------
def load_tokenizer(gf: GGUFFile) -> Tokenizer:
    """Build the tokenizer described by a GGUF's tokenizer.* metadata (see module docstring)."""
    path = gf.path
    model = meta(gf, "tokenizer.ggml.model", str)
    tokens = meta_array(gf, "tokenizer.ggml.tokens", str)
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
    types = meta_array(gf, "tokenizer.ggml.token_type", int, None)
    if types is None:
        attrs = np.full(n, NORMAL, dtype=np.int32)
    elif len(types) < n:
        raise ModelError(path, f"tokenizer.ggml.token_type has {len(types)} entries for {n} tokens")
    else:
        attrs = np.asarray(types, dtype=np.int32)[:n].copy()

    def token_key(key: str, default: int | None) -> int | None:
        value = meta(gf, f"tokenizer.ggml.{key}", int, default)
        return value if value is not None and 0 <= value < n else default

    if model == "gpt2":
        pre_name = meta(gf, "tokenizer.ggml.pre", str, "default")
        pre = PRE_TOKENIZERS.get(pre_name)
        if pre is None:
            raise ModelError(path, f"unknown pre-tokenizer {pre_name!r} (tokenizer.ggml.pre); supported: "
                                   + ", ".join(sorted(PRE_TOKENIZERS)))
        hf = build_bpe(path, token_to_id, meta_array(gf, "tokenizer.ggml.merges", str), pre)
        # llama.cpp defaults bos/eos to 11 for gpt2 vocabularies; an absent id is more honest.
        bos_id, eos_id = token_key("bos_token_id", None), token_key("eos_token_id", None)
        add_bos, add_space_prefix, clean_spaces = pre.add_bos, False, pre.clean_spaces
        pieces = bpe_pieces(tokens, attrs)
    elif model == "llama":
        scores = meta_array(gf, "tokenizer.ggml.scores", float, None)
        scores = np.zeros(n, np.float32) if scores is None else np.asarray(scores, np.float32)[:n]
        if len(scores) < n:
            raise ModelError(path, f"tokenizer.ggml.scores has {len(scores)} entries for {n} tokens")
        add_space_prefix = meta(gf, "tokenizer.ggml.add_space_prefix", bool, True)
        hf = build_spm(tokens, token_to_id, scores, add_space_prefix, token_key("unknown_token_id", 0))
        bos_id, eos_id = token_key("bos_token_id", 1), token_key("eos_token_id", 2)
        add_bos, clean_spaces = True, False
        pieces = spm_pieces(tokens, attrs)
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
        if i is not None and attrs[i] != NORMAL:
            eog.add(i)
            if attrs[i] not in (CONTROL, UNKNOWN):
                attrs[i] = CONTROL
                pieces[i] = tokens[i].encode()

    # Special tokens matched in raw text: control, user-defined and unknown entries, longest first.
    special_ids = np.flatnonzero(np.isin(attrs, (CONTROL, USER_DEFINED, UNKNOWN))).tolist()
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
