"""The torch vision backend against the numpy engine and the transformers reference (tiny
LightOnOCR fixture), including the padded-bucket path the Core ML programs are traced from."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest

# as the engine does before importing torch (backends.require_torch): its OpenMP spin
from pantheon_ocr.engine.backends.common import openmp_env  # noqa: E402

openmp_env()

torch = pytest.importorskip("torch")

from pantheon_ocr.engine import load_vlm  # noqa: E402
from pantheon_ocr.engine.backends import make_vision_backend  # noqa: E402
from pantheon_ocr.engine.backends.buckets import bucket_grid, merged_rows, pad_pixels, patch_mask  # noqa: E402
from pantheon_ocr.engine.backends.torch_vision import TorchVisionBackend, unpermute_qk  # noqa: E402
from pantheon_ocr.engine.ops import apply_rope, rope_angles_2d  # noqa: E402

from .conftest import LIGHTONOCR_DIR, LIGHTONOCR_MMPROJ, LIGHTONOCR_TEXT, TEST_DEVICE  # noqa: E402

IMAGES = ["a_rgb_150x110", "b_wide_2000x437", "c_rgba_90x60", "d_text_300x120"]
REL = 5e-6  # float32 torch vs numpy, and vs the reference: measured <= 1.3e-6 on the fixture
BF16_REL = 5e-2  # measured ~1e-2 on the fixture (8-bit mantissa through 3 layers + projector)


@lru_cache(maxsize=None)
def vlm(mode="f32"):
    return load_vlm(LIGHTONOCR_TEXT, LIGHTONOCR_MMPROJ, weights=mode)


@lru_cache(maxsize=None)
def backend(dtype="float32", mode="f32", device=TEST_DEVICE):
    return make_vision_backend("torch", vlm(mode), device=device, dtype=dtype)


def pixels(name):
    return vlm().preprocess(LIGHTONOCR_DIR / "images" / f"{name}.png")


def rel_err(a, b):
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.max(np.abs(a.astype(np.float64) - b)) / np.max(np.abs(b)))


def _rope_pair_matches(rope) -> bool:
    """`rope` on GGUF-order rows with adjacent pairs, and on the unpermuted (Hugging Face order)
    rows with split-half pairs, against the rotation written out as transformers does it
    (x * cos + rotate_half(x) * sin): equal vectors, index for index after undoing the permutation."""
    rng = np.random.default_rng(0)
    n, heads, d = 12, 3, 16
    w = rng.standard_normal((heads * d, 8)).astype(np.float32)
    x = rng.standard_normal((n, 8)).astype(np.float32)
    rows, cols = np.divmod(np.arange(n), 4)
    cos, sin = rope_angles_2d(rows, cols, d, 10000.0)  # [n, d/2]
    hf = (x @ unpermute_qk(w, heads).T).reshape(n, heads, d)
    c, s = np.concatenate([cos, cos], -1)[:, None], np.concatenate([sin, sin], -1)[:, None]  # [n, 1, d]
    want = hf * c + np.concatenate([-hf[..., d // 2 :], hf[..., : d // 2]], -1) * s
    a = rope((x @ w.T).reshape(n, heads, d), cos, sin, neox=False)  # GGUF order
    b = rope(hf, cos, sin, neox=True)  # HF order
    gguf_index = [j // 2 + (j % 2) * (d // 2) for j in range(d)]  # GGUF dim j holds HF dim gguf_index[j]
    return np.allclose(b, want, atol=1e-5) and np.allclose(a, want[..., gguf_index], atol=1e-5)


def test_unpermuted_split_half_rope_equals_adjacent_pairs():
    assert _rope_pair_matches(apply_rope)
    assert not _rope_pair_matches(lambda x, cos, sin, neox: x)  # a missing rotation is caught
    assert not _rope_pair_matches(lambda x, cos, sin, neox: apply_rope(x, cos, sin, not neox))  # and a wrong one


@pytest.mark.parametrize("name", IMAGES)
def test_float32_equals_numpy_and_reference(name):
    px = pixels(name)
    out = backend().encode(px)
    assert out.dtype == np.float32
    assert rel_err(out, vlm().encode_image(px)) <= REL
    with np.load(LIGHTONOCR_DIR / f"ref_{name}.npz") as r:
        assert rel_err(out, r["image_features"]) <= REL


def test_quantized_storage_gives_the_same_module():
    px = pixels("d_text_300x120")
    assert rel_err(backend("float32", "quantized").encode(px), backend().encode(px)) <= 1e-6


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_low_precision_error_is_bounded(dtype, record_property):
    images = IMAGES if dtype == "bfloat16" else IMAGES[2:]  # float16 on CPU is slow: small images only
    errs = {name: rel_err(backend(dtype).encode(pixels(name)), vlm().encode_image(pixels(name))) for name in images}
    record_property(f"{dtype}_rel_err", max(errs.values()))
    print(f"{dtype} max relative error vs numpy float32: " + ", ".join(f"{k} {v:.2e}" for k, v in errs.items()))
    assert max(errs.values()) <= BF16_REL


@pytest.mark.parametrize("name,bucket", [("a_rgb_150x110", None), ("c_rgba_90x60", None),
                                         ("d_text_300x120", None), ("c_rgba_90x60", (16, 24))])
def test_padded_bucket_with_key_mask_is_exact(name, bucket):
    """The form the Core ML programs are traced in: padded grid + key mask + row selection."""
    px = pixels(name)
    h, w = px.shape[1] // 14, px.shape[2] // 14
    hb, wb = bucket or bucket_grid(h, w, max_side=110)
    assert (hb, wb) != (h, w)
    mod = backend().module
    with torch.inference_mode():
        out = mod(torch.from_numpy(pad_pixels(px, hb, wb, 14))[None].to(TEST_DEVICE),
                  torch.from_numpy(patch_mask(h, w, hb, wb))[None].to(TEST_DEVICE))
    assert out.shape == ((hb // 2) * (wb // 2), 64)
    assert rel_err(out.cpu().numpy()[merged_rows(h, w, hb, wb)], vlm().encode_image(px)) <= REL


def test_bad_pixels_and_dtype():
    with pytest.raises(ValueError, match="multiples of 14"):
        backend().encode(np.zeros((3, 20, 28), np.float32))
    with pytest.raises(ValueError, match="dtype"):
        TorchVisionBackend(vlm(), dtype="int4")


def test_ocr_engine_with_torch_vision_gives_the_same_tokens():
    from pantheon_ocr.engine.page_engine import OCREngine
    from pantheon_ocr.engine.sampling import SamplingOptions

    image = LIGHTONOCR_DIR / "images" / "d_text_300x120.png"
    sampling = SamplingOptions(max_tokens=8)
    runs = [OCREngine(vlm(), be).run_page(image, sampling).generated for be in (None, backend())]
    assert runs[0] == runs[1] and len(runs[0]) == 8


def _attention_inputs(dtype, b=2, h=3, n=600, d=16):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, generator=g) for _ in range(3))
    mask = torch.zeros(b, 1, 1, n)
    mask[1, ..., 450:] = -30000.0  # the second image's last keys are padding
    return tuple(t.to(dtype) for t in (q * 2, k, v, mask))


def test_query_block_attention_equals_sdpa():
    """The CPU bfloat16 kernel (torch_pixtral.query_block_attention) computes SDPA: in float32 over
    several query blocks (one partial), two images, a key mask, to float32 rounding."""
    from pantheon_ocr.engine.backends.torch_pixtral import QUERY_BLOCK, query_block_attention

    q, k, v, mask = _attention_inputs(torch.float32)
    assert q.shape[2] > 2 * QUERY_BLOCK and q.shape[2] % QUERY_BLOCK
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    got = query_block_attention(q, k, v, attn_mask=mask)
    assert torch.allclose(got, want, atol=1e-5, rtol=0)  # measured 2.4e-6
    assert not torch.allclose(query_block_attention(q, k, v), want, atol=1e-3)  # the mask is applied
    # in bfloat16 (scores rounded to bfloat16): within 3x of SDPA-bfloat16's own error
    qb, kb, vb, mb = _attention_inputs(torch.bfloat16)
    err = (query_block_attention(qb, kb, vb, attn_mask=mb).float() - want).abs().max()
    sdpa_err = (torch.nn.functional.scaled_dot_product_attention(qb, kb, vb, attn_mask=mb).float() - want).abs().max()
    assert err <= 3 * sdpa_err, (float(err), float(sdpa_err))


@pytest.mark.parametrize("tiles", [True, False])
def test_bfloat16_cpu_backend_attends_by_query_blocks_without_amx_tiles(tiles, monkeypatch):
    """bfloat16 on the CPU: SDPA's fused kernel where the CPU has AMX tiles (it multiplies with them
    there), products by query blocks where it has none; float32 always SDPA. Both give the tower's
    features to bfloat16's error."""
    from pantheon_ocr.engine.backends import torch_vision
    from pantheon_ocr.engine.backends.torch_pixtral import query_block_attention

    monkeypatch.setattr(torch_vision, "cpu_has_amx", lambda: tiles)
    module = TorchVisionBackend(vlm(), device="cpu", dtype="bfloat16")
    sdpa = torch.nn.functional.scaled_dot_product_attention
    attends = [getattr(block.attend, "func", block.attend) for block in module.module.layers]  # a partial: its softmax
    assert all(a is (sdpa if tiles else query_block_attention) for a in attends)
    assert all(block.attend is sdpa for block in backend().module.layers)
    px = pixels("d_text_300x120")
    assert rel_err(module.encode(px), vlm().encode_image(px)) <= BF16_REL


def test_a_tower_with_heads_the_compiled_attention_takes_uses_it():
    """Without AMX tiles a bfloat16 tower attends with the compiled kernel (bf16_attention.FullAttention)
    where it builds and takes the heads (64 or more channels a head: LightOnOCR's 16 x 64), else by query
    blocks (the fixture's heads are too small for it)."""
    from pantheon_ocr.engine.backends import bf16_attention
    from pantheon_ocr.engine.backends.torch_pixtral import query_block_attention
    from pantheon_ocr.engine.backends.torch_vision import cpu_bf16_attention

    small, which = cpu_bf16_attention(4, 16)
    assert which == bf16_attention.BY_QUERY_BLOCKS
    assert small.func is query_block_attention and small.keywords["softmax"] is bf16_attention.compiled_softmax()
    full = bf16_attention.compiled_full_attention()
    if full is None:
        assert cpu_bf16_attention(16, 64)[0].func is query_block_attention
    else:
        assert cpu_bf16_attention(16, 64) == (full, full.why)


def test_a_block_attending_with_the_compiled_kernel_is_sdpas_block():
    """A Pixtral block in bfloat16 with the compiled attention in place of SDPA (its q, k, v are views
    of the projections' rows, its output goes back into them): the float32 block's output to
    bfloat16's error, as close as the block with SDPA in bfloat16."""
    from pantheon_ocr.engine.backends import bf16_attention
    from pantheon_ocr.engine.backends.torch_pixtral import PixtralBlock

    full = bf16_attention.compiled_full_attention()
    if full is None:
        pytest.skip("no compiled vision attention here (no compiler or no AVX-512 BF16)")
    torch.manual_seed(0)
    block = PixtralBlock(256, 4, 512, 1e-5)  # heads of 64, as LightOnOCR's
    x = torch.randn(2, 150, 256)
    cos, sin = (f(torch.rand(150, 64) * 6) for f in (torch.cos, torch.sin))
    with torch.inference_mode():
        want = block(x, cos, sin, None)
        block.to(torch.bfloat16)
        xb, cb, sb = (t.to(torch.bfloat16) for t in (x, cos, sin))
        sdpa = block(xb, cb, sb, None)
        block.attend = full
        got = block(xb, cb, sb, None)
    assert got.dtype == torch.bfloat16 and got.shape == want.shape

    def branch_err(out):  # the block's own term (out - x): mean error over its mean size
        return float(((out.float() - xb.float()) - (want - x)).abs().mean() / (want - x).abs().mean())

    err, err_sdpa = branch_err(got), branch_err(sdpa)
    assert err <= 1.1 * err_sdpa and err <= 0.03, (err, err_sdpa)  # measured 0.0193 both; no attention: 0.27


def test_a_truncated_tower_runs_its_own_layers():
    """`--vision-layers N` (benchmarks): the torch module has the numpy tower's first N layers
    and gives its output (it once kept the model's full count, the missing ones unloaded)."""
    from pantheon_ocr.engine.attention import TowerOptions

    short = load_vlm(LIGHTONOCR_TEXT, LIGHTONOCR_MMPROJ, weights="f32", vision_tower=TowerOptions(n_layers=1))
    assert len(short.vision.layers) == 1 < short.vision.cfg.n_layer
    module = make_vision_backend("torch", short, device=TEST_DEVICE, dtype="float32")
    px = pixels("d_text_300x120")
    out = module.encode(px)
    assert rel_err(out, short.encode_image(px)) <= REL and rel_err(out, vlm().encode_image(px)) > 1e-3


def test_a_bfloat16_cpu_tower_runs_its_rows_compiled_as_close_to_float32_as_torchs():
    """In bfloat16 on the CPU every block's norms, rotary embedding and SwiGLU (and ln_pre) are the
    compiled row operations where they build (rows.compiled_rows), with float32 rope tables; a block
    that way is as close to the float32 block as with torch's bfloat16 operations, and so is the tower's
    output to numpy's float32 features."""
    from pantheon_ocr.engine.backends.rows import compiled_rows
    from pantheon_ocr.engine.backends.torch_pixtral import PixtralBlock

    rows = compiled_rows()
    module = backend("bfloat16", device="cpu").module
    if rows is None:
        assert all(block.ffn_norm.rows is None for block in module.layers)
        pytest.skip("no compiled row operations here")
    assert all(b.attention_norm.rows is b.ffn_norm.rows is b.feed_forward.rows is rows for b in module.layers)
    assert module.ln_pre.rows is rows and all(b.rotate == rows.rope_bf16_ for b in module.layers)
    assert module.rope(4, 5, "cpu")[0].dtype == torch.float32  # the tables' precision, not bfloat16's
    assert all(b.ffn_norm.rows is None for b in backend(device="cpu").module.layers)  # float32: torch's

    torch.manual_seed(0)
    block = PixtralBlock(256, 4, 512, 1e-5)
    x = torch.randn(1, 150, 256) * 0.01  # a small residual: the term's own error shows, not the sum's rounding
    ang = torch.rand(150, 32) * 6
    cos, sin = (torch.cat([f(ang), f(ang)], -1) for f in (torch.cos, torch.sin))
    with torch.inference_mode():
        want = block(x, cos, sin, None)
        block.to(torch.bfloat16)
        xb = x.bfloat16()
        by_torch = block(xb, cos.bfloat16(), sin.bfloat16(), None)
        for norm in (block.attention_norm, block.ffn_norm):
            norm.rows = rows
        block.feed_forward.rows, block.rotate = rows, rows.rope_bf16_
        got = block(xb, cos, sin, None)

    def branch_err(out):  # the block's own term (out - x): mean error over its mean size
        return float(((out.float() - xb.float()) - (want - x)).abs().mean() / (want - x).abs().mean())

    print(f"block term error: compiled rows {branch_err(got):.4f}, torch's {branch_err(by_torch):.4f}")
    # measured 0.0087 against 0.0091 (the bfloat16 weights and products are most of either)
    assert got.dtype == torch.bfloat16 and branch_err(got) <= branch_err(by_torch), (branch_err(got),
                                                                                     branch_err(by_torch))
    px = pixels("d_text_300x120")
    assert rel_err(backend("bfloat16", device="cpu").encode(px), vlm().encode_image(px)) <= BF16_REL


def test_the_feed_forward_by_rows_runs_its_rows_in_parts(monkeypatch):
    """Under use_rows the feed-forward runs FFN_ROWS rows at a time (the [rows, ff] products stay in the
    cache): the same output as all rows at once, a partial last part included."""
    from pantheon_ocr.engine.backends import torch_pixtral
    from pantheon_ocr.engine.backends.rows import compiled_rows

    rows = compiled_rows()
    if rows is None:
        pytest.skip("no compiled row operations here")
    torch.manual_seed(1)
    ffn = torch_pixtral.SwiGLU(128, 256).to(torch.bfloat16)
    ffn.rows = rows
    x = torch.randn(2, 75, 128).bfloat16()
    with torch.inference_mode():
        whole = ffn(x)
        monkeypatch.setattr(torch_pixtral, "FFN_ROWS", 64)  # 150 rows: 64 + 64 + 22
        parts = ffn(x)
        ffn.rows = None
        by_torch = ffn(x)
    assert parts.shape == x.shape and torch.equal(parts, whole)  # a row's products do not depend on the others here
    assert torch.allclose(parts.float(), by_torch.float(), rtol=0.05, atol=0.05)


INT8_REL = 8e-2  # the int8 products: measured ~3e-2 on the fixture; bfloat16's bound is 5e-2


def test_int8_products_stay_within_a_bound_of_float32_and_bfloat16s_neighbourhood(record_property):
    """--vision-dtype int8 (CPU only): the blocks' products in int8, the rest as bfloat16."""
    int8, bf16 = backend("int8", device="cpu"), backend("bfloat16", device="cpu")
    assert "products: int8" in int8.kernels and int8.dtype == "int8"
    errs, bf16_errs = {}, {}
    for name in IMAGES:
        want = vlm().encode_image(pixels(name))
        errs[name] = rel_err(int8.encode(pixels(name)), want)
        bf16_errs[name] = rel_err(bf16.encode(pixels(name)), want)
    record_property("int8_rel_err", max(errs.values()))
    print("int8 max relative error vs numpy float32: " + ", ".join(f"{k} {v:.2e}" for k, v in errs.items()))
    assert max(errs.values()) <= INT8_REL
    assert max(errs.values()) > max(bf16_errs.values())  # int8 really ran: its error is its own


def test_cli_reads_with_int8_products_and_refuses_them_where_they_cannot_run(tmp_path, capsys):
    from pantheon_ocr.cli import main

    pdf = str(LIGHTONOCR_DIR.parent.parent.parent / "samples" / "docs" / "text-1page.pdf")
    common = ["transcribe", pdf, "--model", str(LIGHTONOCR_DIR), "--max-tokens", "4", "--no-progress",
              "--render-workers", "1", "-o", str(tmp_path)]
    assert main(common + ["--vision-backend", "torch", "--device", "cpu", "--vision-dtype", "int8"]) == 0
    assert len(list(tmp_path.rglob("*.md"))) == 1
    capsys.readouterr()
    assert main(common + ["--vision-backend", "numpy", "--vision-dtype", "int8"]) == 2
    err = capsys.readouterr().err
    assert "--vision-dtype int8" in err and "float32 only" in err and len(err.strip().splitlines()) == 1
