"""Every format LightOnOCR GGUFs are published in loads and matches, on generated files:

- the golden fixture (tests/fixtures/lightonocr-tiny, hidden 64) re-quantized: mmproj F32, F16,
  Q8_0 and text F16, BF16, Q8_0, against the transformers float32 reference dumps;
- random-weight pairs from scripts/make_random_lightonocr.py at tiny shapes whose rows are
  multiples of 256 (K-quants need it), with a pruned 16k vocabulary: text F16, BF16, Q8_0, Q6_K,
  Q4_K_M and Q4_K_S (tensor types mixed as llama-quantize mixes them), against the same weights
  written as F32.

Two claims per format. Exact: the engine runs the quantized file exactly as it runs an F32 file
holding that file's dequantized weights (np.array_equal: quantization is only ever a way of
storing weights). Close: its image features and logits are within the stated tolerance of the
float32 reference. Measured (max |a-b| / max |b|, logits of the fixture: max |a-b|; the
tolerances below are these with about 1.5x headroom):

    fixture vs transformers     image_features  text_final_norm  logits_last (abs)
      original (BF16 pair)      1.2e-6          1.1e-6           1.7e-5
      mmproj F32 / F16          1.2e-6 / 1.3e-6                  1.7e-5 / 1.7e-5
      mmproj Q8_0               1.2e-2                           0.24
      text F16 / BF16                           1.1e-6 / 1.1e-6  1.7e-5 / 1.7e-5
      text Q8_0                                 1.5e-2           0.27 (argmax unchanged)
    random pair vs its F32 weights              text_final_norm  logits_last
      text F16 / BF16 / Q8_0                    5.9e-4 / 5.9e-3 / 2.0e-2   4.7e-4 / 3.9e-3 / 9.8e-3
      text Q6_K / Q4_K_M / Q4_K_S               5.6e-2 / 0.18 / 0.18       3.5e-2 / 0.12 / 0.12
      mmproj F16 / Q8_0         7.4e-4 / 1.4e-2
The BF16 fixture re-written as F16 or F32 is lossless (bfloat16 values fit in float16 at these
magnitudes), hence the same errors as the original.
"""

from __future__ import annotations

import importlib.util
import sys
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

from pantheon_ocr.cli import main
from pantheon_ocr.engine import load_vlm
from pantheon_ocr.engine.format.gguf import open_gguf
from pantheon_ocr.engine.page_engine import OCREngine
from pantheon_ocr.engine.sampling import SamplingOptions
from pantheon_ocr.errors import ModelError

from .stage_dump import stage_dump

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "lightonocr-tiny"
IMAGE = "d_text_300x120"
TINY_TEXT = dict(n_embd=256, n_ff=512, n_head=4, n_head_kv=2, head_dim=64, n_ctx=4096)
TINY_VISION = dict(n_embd=64, n_ff=128, n_head=4)
N_VOCAB = 16384


def _script(name: str):
    sys.path.insert(0, str(ROOT / "scripts"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


quantize_gguf = _script("quantize_gguf")
make_random = _script("make_random_lightonocr")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return tmp_path_factory.mktemp("formats")


@lru_cache(maxsize=None)
def ref() -> dict[str, np.ndarray]:
    with np.load(FIX / f"ref_{IMAGE}.npz", allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def dump(text: Path, mmproj: Path, weights: str = "f32") -> dict[str, np.ndarray]:
    return stage_dump(load_vlm(text, mmproj, weights=weights), FIX / "images" / f"{IMAGE}.png")


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a.astype(np.float64) - b)) / np.max(np.abs(b)))


def requantized(folder: Path, src: Path, ftype: str) -> Path:
    out = folder / f"{src.stem}-{ftype}.gguf"
    if not out.exists():
        quantize_gguf.requantize(src, out, ftype)
    return out


def assert_same_outputs(a: dict, b: dict) -> None:
    for key in ("image_features", "inputs_embeds", "text_final_norm", "logits_last"):
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


# -- the golden fixture, re-quantized --------------------------------------------------------------
@pytest.mark.parametrize("ftype,tol,logit_tol", [("F32", 2e-6, 1e-4), ("F16", 2e-6, 1e-4), ("Q8_0", 0.02, 0.4)])
def test_fixture_mmproj_formats_match_transformers(files, ftype, tol, logit_tol):
    mmproj = requantized(files, FIX / "mmproj.gguf", ftype)
    types = {info.qtype.name for name, info in open_gguf(mmproj).tensors.items() if name.startswith("v.blk.")}
    assert types == {"F32", ftype}  # norms F32, matrices ftype
    out = dump(FIX / "text.gguf", mmproj)
    assert rel(out["image_features"], ref()["image_features"]) <= tol
    assert np.max(np.abs(out["logits_last"] - ref()["logits_last"])) <= logit_tol
    assert_same_outputs(out, dump(FIX / "text.gguf", requantized(files, mmproj, "F32")))


@pytest.mark.parametrize("ftype,tol,logit_tol", [("F16", 2e-6, 1e-4), ("BF16", 2e-6, 1e-4), ("Q8_0", 0.025, 0.4)])
def test_fixture_text_formats_match_transformers(files, ftype, tol, logit_tol):
    text = requantized(files, FIX / "text.gguf", ftype)
    assert open_gguf(text).tensors["blk.0.attn_q.weight"].qtype.name == ftype
    out = dump(text, FIX / "mmproj.gguf")
    assert np.max(np.abs(out["logits_last"] - ref()["logits_last"])) <= logit_tol
    assert rel(out["text_final_norm"], ref()["text_final_norm"]) <= tol
    assert int(np.argmax(out["logits_last"])) == int(np.argmax(ref()["logits_last"]))
    assert_same_outputs(out, dump(requantized(files, text, "F32"), FIX / "mmproj.gguf"))


# -- random pairs at K-quant shapes ------------------------------------------------------------------
def random_pair(folder: Path, dtype: str, mmproj_dtype: str = "F32") -> tuple[Path, Path]:
    text = folder / f"lightonocr-1b-random-{dtype}-{mmproj_dtype}.gguf"
    if text.exists():
        return text, folder / f"mmproj-lightonocr-1b-random-{dtype}-{mmproj_dtype}.gguf"
    return make_random.make_pair(folder, 2, 2, dtype, seed=3, log=None, text=TINY_TEXT, vision=TINY_VISION,
                                 n_vocab=N_VOCAB, mmproj_dtype=mmproj_dtype, tag=f"{dtype}-{mmproj_dtype}")


@pytest.fixture(scope="module")
def reference(files):
    return dump(*random_pair(files, "F32"))


TEXT_TOL = {"F16": (1e-3, 8e-4), "BF16": (9e-3, 6e-3), "Q8_0": (0.03, 0.015),  # (text_final_norm, logits_last)
            "Q6_K": (0.085, 0.05), "Q4_K_M": (0.26, 0.18), "Q4_K_S": (0.27, 0.18)}


@pytest.mark.parametrize("dtype", list(TEXT_TOL))
def test_random_text_formats(files, reference, dtype):
    text, mmproj = random_pair(files, dtype)
    out = dump(text, mmproj)
    assert_same_outputs(out, dump(requantized(files, text, "F32"), mmproj))  # exact: only storage differs
    norm_tol, logit_tol = TEXT_TOL[dtype]
    np.testing.assert_array_equal(out["image_features"], reference["image_features"])  # same F32 mmproj
    assert rel(out["text_final_norm"], reference["text_final_norm"]) <= norm_tol
    assert rel(out["logits_last"], reference["logits_last"]) <= logit_tol
    quantized = dump(text, mmproj, weights="quantized")  # blocks decoded per matmul panel
    assert rel(quantized["logits_last"], out["logits_last"]) <= 1e-5


def test_k_quant_files_mix_types_as_llama_quantize_does(files):
    def types(dtype):
        gf = open_gguf(random_pair(files, dtype)[0])
        return gf.metadata["general.file_type"], {n: i.qtype.name for n, i in gf.tensors.items()}

    ft, t = types("Q4_K_M")
    assert ft == 15 and t["token_embd.weight"] == "Q6_K" and t["blk.0.attn_q.weight"] == "Q4_K"
    # use_more_bits(i, 2): layer 1 (the last eighth) gets more bits, layer 0 does not
    assert (t["blk.0.attn_v.weight"], t["blk.1.attn_v.weight"]) == ("Q4_K", "Q6_K")
    assert (t["blk.0.ffn_down.weight"], t["blk.1.ffn_down.weight"]) == ("Q4_K", "Q6_K")
    assert t["blk.0.attn_norm.weight"] == "F32"
    ft, t = types("Q4_K_S")
    assert ft == 14 and (t["blk.0.attn_v.weight"], t["blk.1.attn_v.weight"]) == ("Q5_K", "Q5_K")
    assert t["blk.1.ffn_down.weight"] == "Q4_K" and t["token_embd.weight"] == "Q6_K"
    ft, t = types("Q6_K")
    assert ft == 18 and {v for k, v in t.items() if not k.endswith("norm.weight")} == {"Q6_K"}


@pytest.mark.parametrize("mmproj_dtype", ["F16", "Q8_0"])
def test_random_mmproj_formats(files, reference, mmproj_dtype):
    text, mmproj = random_pair(files, "F32", mmproj_dtype)
    out = dump(text, mmproj)
    assert_same_outputs(out, dump(text, requantized(files, mmproj, "F32")))
    assert rel(out["image_features"], reference["image_features"]) <= {"F16": 1.2e-3, "Q8_0": 0.02}[mmproj_dtype]


def test_pruned_vocabulary_reads_pages(files):
    """16k rows: the tokens, types, merges and special ids agree; the prompt's pieces are found
    by name; a page decodes to text and stops at <|im_end|>."""
    text, mmproj = random_pair(files, "Q8_0")
    gf = open_gguf(text)
    tokens = gf.metadata["tokenizer.ggml.tokens"]
    assert len(tokens) == len(gf.metadata["tokenizer.ggml.token_type"]) == N_VOCAB
    assert gf.tensors["token_embd.weight"].shape == (N_VOCAB, 256)
    assert tokens[gf.metadata["tokenizer.ggml.eos_token_id"]] == "<|im_end|>"
    assert tokens[gf.metadata["tokenizer.ggml.padding_token_id"]] == "<|endoftext|>"
    vocab = set(tokens)
    assert all(a in vocab and b in vocab and a + b in vocab for a, b in (m.split(" ") for m in gf.metadata["tokenizer.ggml.merges"]))
    vlm = load_vlm(text, mmproj)
    assert vlm.image_token_id == tokens.index("<|image_pad|>") and vlm.image_token_id < N_VOCAB
    assert {tokens[i] for i in vlm.stop_ids} >= {"<|im_end|>", "<|endoftext|>"}
    ids = vlm.prompt_ids(2)
    assert [tokens[i] for i in ids] == ["<|im_start|>", "system", "<|im_end|>", "Ċ", "<|im_start|>", "user", "Ċ",
                                        "<|image_pad|>", "<|image_pad|>", "<|im_end|>", "Ċ", "<|im_start|>", "assistant", "Ċ"]
    seq = OCREngine(vlm, ignore_eos=True).run_page(FIX / "images" / f"{IMAGE}.png", SamplingOptions(max_tokens=4))
    assert seq.n_tokens == 4 and all(0 <= t < N_VOCAB for t in seq.generated) and isinstance(seq.text(), str)
    assert vlm.tokenizer.encode("the cat", add_special=False)  # the pruned BPE still tokenizes


# -- pairs that are not one model --------------------------------------------------------------------
def _rewrite(src: Path, dst: Path, arch: str | None = None, **overrides) -> Path:
    """`src` with its architecture renamed (keys too) and metadata overridden, tensors as they are."""
    gf = open_gguf(src)
    old = gf.metadata["general.architecture"]
    arch = arch or old
    meta = {(arch + k[len(old):] if k.startswith(old + ".") else k): v for k, v in gf.metadata.items()}
    meta.update(overrides)
    tensors = [(name, np.asarray(gf.raw(name)) if info.qtype.name not in ("F32", "F16") else
                gf.raw(name).view(np.float32 if info.qtype.name == "F32" else np.float16).reshape(info.shape), info.qtype)
               for name, info in gf.tensors.items()]
    quantize_gguf.write_gguf(dst, arch, meta, tensors)
    return dst


@pytest.fixture(scope="module")
def odd_files(files):
    return {
        "pixtral_mmproj": _rewrite(FIX / "mmproj.gguf", files / "mmproj-pixtral.gguf", **{"clip.projector_type": "pixtral"}),
        "llama_text": _rewrite(FIX / "text.gguf", files / "text-llama.gguf", arch="llama"),
    }


def _cases(files, odd):
    wide_text = random_pair(files, "Q8_0")[0]  # n_embd 256 against the fixture's 64-wide projection
    return {
        "projection width": (wide_text, FIX / "mmproj.gguf", "'clip.vision.projection_dim' is 64 but the text model's "
                                                            "'qwen3.embedding_length' is 256"),
        "another projector": (FIX / "text.gguf", odd["pixtral_mmproj"], "'clip.projector_type' is 'pixtral'"),
        "another text architecture": (odd["llama_text"], FIX / "mmproj.gguf", "'general.architecture' is 'llama'"),
        "two text files": (FIX / "text.gguf", wide_text, "two text files"),
        "two mmprojs": (FIX / "mmproj.gguf", FIX / "mmproj.gguf", "and so is"),
    }


@pytest.mark.parametrize("case", ["projection width", "another projector", "another text architecture",
                                  "two text files", "two mmprojs"])
def test_a_mismatched_pair_is_one_line_naming_both_files(files, odd_files, case, capsys, tmp_path):
    text, mmproj, problem = _cases(files, odd_files)[case]
    with pytest.raises(ModelError, match=problem) as exc:
        load_vlm(text, mmproj)
    msg = str(exc.value)
    assert exc.value.exit_code == 3 and "\n" not in msg and str(text) in msg and str(mmproj) in msg
    code = main(["transcribe", str(FIX / "images" / f"{IMAGE}.png"), "--model", str(text), "--mmproj", str(mmproj),
                 "-o", str(tmp_path / "out"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 3 and err.count("\n") == 1 and str(text) in err and str(mmproj) in err
