"""int8 weight storage ("int8": 8-bit tiles where the compiled products build, else each row int8
with a bfloat16 scale): exact rows whatever the batch, the quantization itself, and the error
against float32 stated on the LightOnOCR fixture and the real PyPI models (greedy streams, logits)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from pantheon_ocr.engine import load_model  # noqa: E402
from pantheon_ocr.engine.format.torch_groups import int8_rows  # noqa: E402
from pantheon_ocr.engine.format.torch_weights import rows_exact_for_any_m  # noqa: E402

from .conftest import LIGHTONOCR_TEXT, qwen05b_or_skip, smollm2_or_skip  # noqa: E402
from .test_batch_exact import _joins, _prompts, assert_varied, run_exact  # noqa: E402
from .test_kv_int8 import greedy  # noqa: E402
from .test_torch_blocks import rel_err  # noqa: E402


def test_int8_rows_quantize_each_row_to_its_own_scale():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 96)).astype(np.float32) * rng.uniform(0.01, 10, size=(64, 1)).astype(np.float32)
    w[5] = 0  # a zero row
    q, scale = int8_rows(w)
    assert q.dtype == torch.int8 and scale.dtype == torch.bfloat16 and q.shape == w.shape
    back = q.float().numpy() * scale.float().numpy()[:, None]
    step = np.abs(w).max(axis=1) / 127
    assert (np.abs(back - w) <= 0.51 * step[:, None] * 1.01 + 1e-30).all()  # half a step (+ the scale's bf16 rounding)
    assert (q.numpy()[5] == 0).all() and np.abs(q.numpy()).max() == 127


def test_a_matrix_quantized_block_by_block_has_the_bits_of_the_whole(monkeypatch):
    """At load a matrix is decoded and quantized QUANTIZE_ROWS rows at a time (a few MB of float32,
    not the whole embedding): the same int8 values and scales as quantizing it whole."""
    from pantheon_ocr.engine.format import torch_groups as G

    monkeypatch.setattr(G, "QUANTIZE_ROWS", 7)
    w = np.random.default_rng(1).standard_normal((50, 32)).astype(np.float32)
    raw = w.view(np.uint8)  # [rows, row bytes], as a file's F32 tensor
    calls = []
    q, scale = G.int8_rows_of(raw, lambda rows: calls.append(len(rows)) or rows.view(np.float32))
    assert calls == [7] * 7 + [1]
    whole = int8_rows(w)
    assert torch.equal(q, whole[0]) and torch.equal(scale, whole[1])


def test_a_prompts_int8_product_is_the_widened_matrix_rounded_once():
    """Past ROW_BLOCK rows (a prompt) the int8 matrix is widened to bfloat16 for oneDNN's GEMM and its
    row scales go on the bfloat16 product's columns: the bits of rounding (x @ q.T) to bfloat16, then
    its float32 product with the scale to bfloat16 again."""
    from pantheon_ocr.engine.format.torch_weights import ROW_BLOCK, linear

    rng = np.random.default_rng(3)
    for out, inp in ((96, 64), (256, 192)):
        q, scale = int8_rows(rng.standard_normal((out, inp)).astype(np.float32))
        x = torch.from_numpy(rng.standard_normal((ROW_BLOCK + 9, inp)).astype(np.float32))
        with torch.inference_mode():
            want = (torch.nn.functional.linear(x.to(torch.bfloat16), q.to(torch.bfloat16)).float()
                    * scale.float()).to(torch.bfloat16).float()
            assert torch.equal(linear((q, scale), x), want)


def test_int8_weights_batch_rows_are_exact():
    model = load_model(LIGHTONOCR_TEXT, weights="int8")
    assert model.decoder.torch_blocks is not None
    rows_exact_for_any_m("int8")  # either way (one call or row blocks) the rows must be exact
    prompts = _prompts(model.config.n_vocab, 9, seed=17)
    for kind in ("bfloat16", "int8"):
        assert_varied(run_exact(model.decoder, prompts, _joins(9, 17), steps=5, no_repeat=True,
                                pool=model.decoder.new_pool(kind)))


def tiles_or_skip():
    """torch_weights, where a matrix under int8 storage becomes 8-bit tiles (the compiled products build)."""
    from pantheon_ocr.engine.format import torch_groups as G
    from pantheon_ocr.engine.format import torch_weights as TW

    if not G.tiles_fit((G.TILE, G.INT4_GROUP)):
        pytest.skip("the compiled products do not build here")
    return TW


def prompt_then_steps(decoder, prompt: list[int], steps: int = 4) -> np.ndarray:
    """The logits of a prompt's first position, then of `steps` decode steps fed its first tokens."""
    st = decoder.new_state(len(prompt) + steps + 1)
    return np.stack([decoder.forward(st, prompt)[0]] + [decoder.forward(st, [t])[0] for t in prompt[:steps]])


@pytest.mark.parametrize("tiles", [True, False])
def test_int8_weights_are_about_a_quarter_of_f32(tiles, monkeypatch):
    """int8 storage of a BF16 matrix: 8-bit tiles where the compiled products build (Q8_0's 34 bytes
    per 32 weights), else int8 rows (a byte per weight and a bfloat16 scale per row)."""
    from pantheon_ocr.engine.format import torch_groups as G
    from pantheon_ocr.engine.format import torch_weights as TW

    if tiles:
        tiles_or_skip()
    else:
        monkeypatch.setattr(G, "tiles_fit", lambda shape: False)
    f32, int8 = load_model(LIGHTONOCR_TEXT, weights="f32"), load_model(LIGHTONOCR_TEXT, weights="int8")
    w32, w8 = f32.decoder.layers[0].ffn_up, int8.decoder.layers[0].ffn_up
    assert TW.kind_of(w8.torch_data()) == ("groups" if tiles else "int8")
    want = w32.nbytes() // 4 * 34 // 32 if tiles else w32.nbytes() // 4 + 2 * w32.shape[0]
    assert w8.nbytes() == want
    assert rel_err(w8.dense(), w32.dense()) <= 1 / 127


def test_a_bf16_file_under_int8_storage_decodes_as_its_q8_0_file(tmp_path):
    """Where the compiled products build, a BF16 file's matrices are quantized to Q8_0 at load, as
    scripts/quantize_gguf.py (gguf's quantizer) writes a Q8_0 file: the same tiles, so the same logits
    to the bit, prompt and decode steps."""
    from .test_published_formats import quantize_gguf

    tiles_or_skip()
    q8 = tmp_path / "text-q8_0.gguf"
    quantize_gguf.requantize(LIGHTONOCR_TEXT, q8, "Q8_0")
    a, b = load_model(LIGHTONOCR_TEXT, weights="int8"), load_model(str(q8), weights="int8")
    for la, lb in zip(a.decoder.layers, b.decoder.layers):
        assert la.ffn_down.qtype.name == "BF16" and lb.ffn_down.qtype.name == "Q8_0"
        assert torch.equal(la.ffn_down.torch_data().tiles, lb.ffn_down.torch_data().tiles)
    prompt = _prompts(a.config.n_vocab, 1, seed=3)[0]
    assert np.array_equal(prompt_then_steps(a.decoder, prompt), prompt_then_steps(b.decoder, prompt))


# Measured (max |logit error| / max |logit| over 24 greedy steps against float32 weights and keys,
# bfloat16 keys here): SmolLM2-135M (Q4_1: its 4-bit groups) 2.8e-2, Qwen2.5-0.5B 1.4e-2 (2.1e-2 as
# int8 rows), the greedy streams equal; the tiny LightOnOCR text (prefill + 4 steps, below) 2.3e-2
# (2.1e-2 as int8 rows: its prompt's activations are now int8 too). bf16 weights measure 1.3e-2 and
# 0.8e-2 there (test_bf16.py). Bounds leave ~1.5x room.
@pytest.mark.parametrize("which", ["smollm2", pytest.param("qwen05b", marks=pytest.mark.slow)])
def test_int8_weights_greedy_stream_equals_float32(which, record_property):
    path = smollm2_or_skip() if which == "smollm2" else qwen05b_or_skip()
    f32, int8 = load_model(path, weights="f32"), load_model(path, weights="int8")
    prompt = f32.tokenizer.encode("The quick brown fox jumps over the lazy dog. Once upon a time")
    ref_toks, ref = greedy(f32.decoder, prompt, "float32")
    toks, got = greedy(int8.decoder, prompt, "bfloat16")
    err = rel_err(got, ref)
    record_property("int8_rel_err", err)
    print(f"{which}: int8 weights, bfloat16 KV: max relative logits error vs f32 {err:.2e}")
    assert toks == ref_toks
    assert 1e-4 < err <= 6e-2


def test_int8_weights_logits_error_against_f32_on_lightonocr():
    f32, int8 = load_model(LIGHTONOCR_TEXT, weights="f32"), load_model(LIGHTONOCR_TEXT, weights="int8")
    prompt = _prompts(f32.config.n_vocab, 1, seed=3)[0] + [1, 2, 3]
    err = rel_err(prompt_then_steps(int8.decoder, prompt), prompt_then_steps(f32.decoder, prompt))
    print(f"lightonocr: int8 weights, max relative logits error vs f32 {err:.2e}")
    assert 1e-4 < err <= 3.5e-2


def test_copied_weights_leave_the_map_and_read_the_same(monkeypatch):
    """int8 rows are copies: their tensors' pages of the map are released (madvise), and the map
    still reads the same bytes afterwards (faulted back in from the file)."""
    from pantheon_ocr.engine.format.gguf import GGUFFile

    released = []
    monkeypatch.setattr(GGUFFile, "release", lambda self, name, real=GGUFFile.release: released.append(name) or real(self, name))
    model = load_model(LIGHTONOCR_TEXT, weights="int8")
    assert "blk.0.ffn_down.weight" in released and "token_embd.weight" in released
    gf = GGUFFile(LIGHTONOCR_TEXT)
    n = len(released)
    bf16 = load_model(LIGHTONOCR_TEXT, weights="bf16")  # a BF16 tensor is a view of the map: kept
    views = {name for name, t in gf.tensors.items() if t.qtype.name == "BF16"}
    assert views and not views & set(released[n:])
    n = len(released)
    load_model(LIGHTONOCR_TEXT, weights="f32")  # float32 decoded from BF16: copies, released
    assert "blk.0.ffn_down.weight" in released[n:]
    name = max(gf.tensors, key=lambda n: gf.tensors[n].n_bytes)
    before = gf.raw(name).copy()
    gf.release(name)
    assert np.array_equal(gf.raw(name), before)
    assert model.decoder.torch_blocks is not None and bf16.decoder.torch_blocks is not None


def test_a_matrix_past_q8_0s_scales_stays_int8_rows():
    """A weight beyond 127 x float16's largest (a Q8_0 group's scale would be infinite) keeps the matrix
    as int8 rows under int8 storage; an ordinary one of the same shape becomes 8-bit tiles."""
    from gguf import GGMLQuantizationType as Q

    from pantheon_ocr.engine.format.weights import Weight

    TW = tiles_or_skip()
    w = np.random.default_rng(2).standard_normal((32, 64)).astype(np.float32)
    assert TW.kind_of(Weight("w", Q.F32, w.shape, w.view(np.uint8), "int8").torch_data()) == "groups"
    w[3, 5] = 1e8
    big = Weight("w", Q.F32, w.shape, w.view(np.uint8), "int8")
    assert TW.kind_of(big.torch_data()) == "int8"
    x = np.random.default_rng(3).standard_normal((2, 64)).astype(np.float32)
    got = big.matmul(x)
    assert np.isfinite(got).all() and rel_err(got, x @ w.T) <= 2e-2


def test_rows_of_no_whole_groups_stay_bfloat16_and_multiply_few_rows():
    """The vision tower's patch embedding ([1,024, 588] at the LightOnOCR shapes) under int8 storage:
    torch's int8 kernel crashed the process on rows of 588 at 16 rows or fewer (a small image's
    patches, the benchmark's warm-up), so such a matrix stays bfloat16; the product is right for any M."""
    from gguf import GGMLQuantizationType as Q

    from pantheon_ocr.engine.format import torch_weights as TW
    from pantheon_ocr.engine.format.weights import Weight

    rng = np.random.default_rng(4)
    w = rng.standard_normal((64, 588)).astype(np.float32)
    weight = Weight("v.patch_embd.weight", Q.F32, w.shape, w.view(np.uint8), "int8")
    assert TW.kind_of(weight.torch_data()) == "bf16"
    for m in (1, 4, 16, 17):
        x = rng.standard_normal((m, 588)).astype(np.float32)
        assert rel_err(weight.matmul(x), x @ w.T) <= 2e-2
    whole = Weight("w", Q.F32, (64, 576), w[:, :576].copy().view(np.uint8), "int8")
    assert TW.kind_of(whole.torch_data()) in ("int8", "groups")  # whole groups of 32: quantized as before
