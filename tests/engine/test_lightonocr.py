"""LightOnOCR (Pixtral vision + projector + Qwen3) against the transformers reference dumps in
tests/fixtures/lightonocr-tiny (see its README), for every image and both weight storages."""

from __future__ import annotations

import io
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFWriter
from PIL import Image

from pantheon_ocr.engine import load_vlm
from pantheon_ocr.engine.page_engine import OCREngine
from pantheon_ocr.engine.sampling import SamplingOptions
from pantheon_ocr.engine.attention import TowerOptions, flash_attention, naive_attention
from pantheon_ocr.engine.format.gguf import open_gguf
from pantheon_ocr.engine.models.lightonocr import merge_patches
from pantheon_ocr.engine.models.pixtral import PixtralVision, vision_config
from pantheon_ocr.engine.ops import rope_angles_2d
from pantheon_ocr.engine.image.preprocess import preprocess, target_size
from pantheon_ocr.errors import InputError, ModelError

from .stage_dump import stage_dump

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "lightonocr-tiny"
TEXT, MMPROJ = FIX / "text.gguf", FIX / "mmproj.gguf"
IMAGES = ["a_rgb_150x110", "b_wide_2000x437", "c_rgba_90x60", "d_text_300x120"]
MODES = ["quantized", "f32"]
IMAGE_PAD, IM_END, ENDOFTEXT = 151655, 151645, 151643

STAGES = ["vision_patch_embeds", "vision_ln_pre", "vision_layer_0", "vision_layer_1", "vision_layer_2",
          "proj_norm", "merger_in", "merger_out", "proj_linear_1", "image_features", "inputs_embeds",
          "text_layer_0", "text_layer_1", "text_final_norm"]
REL = 1e-4  # stages: max|a-b| <= REL * max|b|
LOGIT_ABS = 1e-3
TIE = 1e-3  # an argmax may differ only if the two logits are this close


@lru_cache(maxsize=None)
def ref(name: str) -> dict[str, np.ndarray]:
    with np.load(FIX / f"ref_{name}.npz", allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


@lru_cache(maxsize=None)
def model(mode: str):
    return load_vlm(TEXT, MMPROJ, weights=mode)


@lru_cache(maxsize=None)
def dump(mode: str, name: str) -> dict[str, np.ndarray]:
    return stage_dump(model(mode), FIX / "images" / f"{name}.png")


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.max(np.abs(a.astype(np.float64) - b)) / np.max(np.abs(b)))


def logsumexp(x: np.ndarray) -> np.ndarray:
    m = x.max(axis=-1, keepdims=True)
    return (m + np.log(np.exp((x - m).astype(np.float64)).sum(axis=-1, keepdims=True)))[:, 0]


def check_argmax(ours_logits: np.ndarray, ref_ids: np.ndarray, where: str) -> None:
    """Argmax per row equals the reference, unless our logits of both ids are a near-tie."""
    ours = ours_logits.argmax(axis=-1)
    for r in np.flatnonzero(ours != ref_ids):
        gap = ours_logits[r, ours[r]] - ours_logits[r, ref_ids[r]]
        assert gap <= TIE, f"{where} row {r}: argmax {ours[r]} vs reference {ref_ids[r]} (gap {gap:.2e})"


# -- preprocessing -------------------------------------------------------------------------------
@pytest.mark.parametrize("name", IMAGES)
def test_pixel_values(name):
    r = ref(name)
    vc = vision_config(open_gguf(MMPROJ))
    px = preprocess(FIX / "images" / f"{name}.png", longest_edge=vc.longest_edge, patch_size=vc.patch_size,
                    mean=vc.image_mean, std=vc.image_std)
    assert px.dtype == np.float32 and px.shape == r["pixel_values"].shape[1:]
    assert np.max(np.abs(px - r["pixel_values"][0])) <= 1e-6
    assert tuple(px.shape[1:]) == tuple(r["image_sizes"][0])
    with Image.open(FIX / "images" / f"{name}.png") as im:
        assert target_size(im.height, im.width, 1540, 14) == tuple(r["image_sizes"][0])


def test_target_size_rule():
    assert target_size(110, 150, 1540, 14) == (112, 154)  # round up to 14, no upscale
    assert target_size(437, 2000, 1540, 14) == (336, 1540)  # floor(437 / 1.2987) = 336
    assert target_size(1, 1, 1540, 14) == (14, 14)
    assert target_size(10, 20000, 1540, 14) == (0, 1540)  # too thin: rejected by preprocess
    assert target_size(3080, 3080, 1540, 14) == (1540, 1540)


def test_vision_config():
    vc = vision_config(open_gguf(MMPROJ))
    assert (vc.n_embd, vc.n_layer, vc.n_head, vc.head_dim, vc.n_ff) == (64, 3, 4, 16, 128)
    assert (vc.patch_size, vc.longest_edge, vc.merge, vc.projection_dim) == (14, 1540, 2, 64)
    assert vc.projector_type == "lightonocr" and vc.rope_base == 10000.0
    assert abs(vc.eps - 1e-5) < 1e-12
    np.testing.assert_allclose(vc.image_mean, (0.48145466, 0.4578275, 0.40821073), rtol=1e-6)
    np.testing.assert_allclose(vc.image_std, (0.26862954, 0.26130258, 0.27577711), rtol=1e-6)
    assert model("quantized").longest_edge == 1540


# -- kernels of the vision path ------------------------------------------------------------------
@pytest.mark.parametrize("name", ["a_rgb_150x110", "c_rgba_90x60"])
def test_rope_2d_matches_hf_tables(name):
    r = ref(name)
    rows, cols = r["vision_position_ids"][:, 0], r["vision_position_ids"][:, 1]
    cos, sin = rope_angles_2d(rows, cols, 16, 10000.0)
    # HF's tables are rotate_half layout: the angle vector duplicated to head_dim.
    np.testing.assert_allclose(np.concatenate([cos, cos], 1), r["vision_rope_cos"], atol=1e-6)
    np.testing.assert_allclose(np.concatenate([sin, sin], 1), r["vision_rope_sin"], atol=1e-6)


def test_merge_patches_order():
    h, w, d = 3, 5, 2  # odd rows and columns: the last row and column are dropped
    x = np.arange(h * w * d, dtype=np.float32).reshape(h * w, d)  # value = (row*w + col)*d + c
    m = merge_patches(x, h, w, 2)
    assert m.shape == (1 * 2, d * 4)
    for mi, (my, mx) in enumerate([(0, 0), (0, 1)]):
        for c in range(d):
            for dy in range(2):
                for dx in range(2):
                    patch = (2 * my + dy) * w + (2 * mx + dx)
                    assert m[mi, c * 4 + dy * 2 + dx] == x[patch, c]


def test_blocked_vision_attention_equals_naive():
    rng = np.random.default_rng(0)
    n, heads, d = 600, 4, 16
    q, k, v = (rng.standard_normal((heads, n, d), dtype=np.float32) for _ in range(3))
    pos = np.arange(n)
    ref_out = naive_attention(q, k, v, pos, pos, scale=d ** -0.5, causal=False)
    for qb, kb in ((32, 256), (100, 128), (1024, 1024)):
        out = flash_attention(q, k, v, pos, pos, scale=d ** -0.5, causal=False, q_block=qb, kv_block=kb)
        assert np.max(np.abs(out - ref_out)) <= 1e-5


@pytest.mark.parametrize("name", ["a_rgb_150x110", "d_text_300x120"])
def test_vision_encoder_blocked_equals_naive(name):
    vlm = model("f32")
    px = vlm.preprocess(FIX / "images" / f"{name}.png")
    tiles = PixtralVision(vlm.mmproj, vlm.vision_config, "f32", TowerOptions(q_block=16, kv_block=32))  # many tiles
    blocked, grid = tiles.forward(px)
    naive, grid2 = PixtralVision(vlm.mmproj, vlm.vision_config, "f32", TowerOptions(attention="naive")).forward(px)
    assert grid == grid2
    assert rel_err(blocked, naive) <= 1e-5


# -- every stage against transformers ------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", IMAGES)
def test_stages(mode, name):
    r, out = ref(name), dump(mode, name)
    assert np.max(np.abs(out["pixel_values"] - r["pixel_values"][0])) <= 1e-6
    np.testing.assert_array_equal(out["input_ids"], r["input_ids"])
    np.testing.assert_array_equal(out["input_ids"] == IMAGE_PAD, r["image_token_mask"])
    errors = {key: rel_err(out[key], r[key]) for key in STAGES}
    bad = {k: e for k, e in errors.items() if e > REL}
    assert not bad, f"stages over {REL} relative error: {bad}"
    assert np.max(np.abs(out["logits_last"] - r["logits_last"])) <= LOGIT_ABS


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", IMAGES)
def test_prompt_logits(mode, name):
    """The real prefill path (KV cache, blocked attention, embedding-row overrides): logits at
    every prompt position against the reference subset, logsumexp and argmax."""
    r, vlm = ref(name), model(mode)
    features = vlm.encode_image(FIX / "images" / f"{name}.png")
    ids = vlm.prompt_ids(features.shape[0])
    np.testing.assert_array_equal(ids, r["input_ids"])
    dec = vlm.decoder
    state = dec.new_state()
    hidden = dec.hidden(state, ids, (np.flatnonzero(np.asarray(ids) == IMAGE_PAD), features))
    sub = r["logits_subset_ids"]
    for s in range(0, len(ids), 128):
        lg = dec.logits_of(hidden[s:s + 128])  # [<=128, n_vocab]
        assert np.max(np.abs(lg[:, sub] - r["logits_subset"][s:s + 128])) <= LOGIT_ABS
        lse = logsumexp(lg)
        assert np.max(np.abs(lse - r["logits_logsumexp"][s:s + 128])) <= LOGIT_ABS
        check_argmax(lg, r["logits_argmax"][s:s + 128], f"{name} prompt")
    # forward() gives the same last row
    last = dec.forward(dec.new_state(), *vlm.prompt_and_rows(features))
    assert last.shape == (1, r["logits_last"].shape[0])
    assert np.max(np.abs(last[0] - r["logits_last"])) <= LOGIT_ABS


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", IMAGES)
def test_greedy_generation(mode, name):
    r, vlm = ref(name), model(mode)
    features = vlm.encode_image(FIX / "images" / f"{name}.png")
    state = vlm.decoder.new_state()
    logits = vlm.decoder.forward(state, *vlm.prompt_and_rows(features))
    sub, n = r["gen_logits_subset_ids"], len(r["gen_ids"])
    rows = []
    for step in range(n):
        rows.append(logits[-1])
        logits = vlm.decoder.forward(state, [int(r["gen_ids"][step])])  # follow the reference tokens
    rows = np.stack(rows)  # [n, n_vocab]
    assert np.max(np.abs(rows[:, sub] - r["gen_logits_subset"])) <= LOGIT_ABS
    lse = logsumexp(rows)
    assert np.max(np.abs(lse - r["gen_logits_logsumexp"])) <= LOGIT_ABS
    check_argmax(rows, r["gen_logits_argmax"], f"{name} generation")
    # free-running greedy generation (own tokens, no EOS stop) gives exactly the reference ids
    seq = OCREngine(vlm, ignore_eos=True).run_page(features=features, sampling=SamplingOptions(max_tokens=n))
    assert seq.generated == r["gen_ids"].tolist()


def test_transcribe_and_prompt_template():
    vlm, name = model("quantized"), "c_rgba_90x60"
    r = ref(name)
    image = FIX / "images" / f"{name}.png"
    gen = r["gen_ids"].tolist()
    assert IM_END not in gen and ENDOFTEXT not in gen
    assert {IM_END, ENDOFTEXT} <= vlm.stop_ids
    text = OCREngine(vlm).transcribe(image, SamplingOptions(max_tokens=5))
    assert isinstance(text, str) and text == vlm.tokenizer.decode(gen[:5])
    # stage input ids equal what the file's own chat template renders (image part expanded)
    tok = vlm.tokenizer
    chat = tok.chat_prompt([{"role": "user", "content": [{"type": "image"}]}])
    assert chat == "<|im_start|>system<|im_end|>\n<|im_start|>user\n<|image_pad|><|im_end|>\n<|im_start|>assistant\n"
    templ = tok.encode(chat)
    m = int(r["image_token_mask"].sum())
    i = templ.index(IMAGE_PAD)
    assert templ[:i] + [IMAGE_PAD] * m + templ[i + 1:] == vlm.prompt_ids(m) == r["input_ids"].tolist()


def test_sampling_is_seeded():
    vlm = model("f32")
    features = vlm.encode_image(FIX / "images" / "c_rgba_90x60.png")
    engine, sampling = OCREngine(vlm, ignore_eos=True), SamplingOptions(max_tokens=6, temperature=1.5, top_p=0.95, seed=11)
    a, b = (engine.run_page(features=features, sampling=sampling).generated for _ in range(2))
    assert a == b and len(a) == 6


def test_encode_image_accepts_pil_array_and_pixels():
    vlm = model("f32")
    path = FIX / "images" / "a_rgb_150x110.png"
    want = vlm.encode_image(path)
    with Image.open(path) as im:
        assert np.array_equal(vlm.encode_image(im), want)
        assert np.array_equal(vlm.encode_image(np.asarray(im.convert("RGB"))), want)
    assert np.array_equal(vlm.encode_image(vlm.preprocess(path)), want)
    assert np.array_equal(vlm.encode_image(path.read_bytes()), want)
    assert want.shape == (20, 64) and want.dtype == np.float32


# -- bad images ----------------------------------------------------------------------------------
def _encode(image: Image.Image, fmt: str = "PNG", **kw) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format=fmt, **kw)
    return buf.getvalue()


def _noise(w: int, h: int) -> Image.Image:
    return Image.fromarray(np.random.default_rng(w * h).integers(0, 256, (h, w, 3), dtype=np.uint8))


@pytest.mark.parametrize("case,problem", [
    ("truncated", "cannot decode image"),
    ("1x1", "too small or too thin"),
    ("14x14", "too small or too thin"),
    ("200x14", "too small or too thin"),
    ("20000x10", "too small or too thin"),
    ("not_an_image", "not an image file"),
    ("empty", "not an image file"),
])
def test_bad_images_raise_input_error(tmp_path, case, problem):
    png = _encode(_noise(150, 110))
    data = {
        "truncated": png[: len(png) // 2],
        "1x1": _encode(Image.new("RGB", (1, 1), (9, 9, 9))),
        "14x14": _encode(Image.new("RGB", (14, 14))),  # one patch: no 2x2 group, no image token
        "200x14": _encode(Image.new("RGB", (200, 14))),  # one patch row
        "20000x10": _encode(Image.new("RGB", (20000, 10), (200, 200, 200))),  # 0 px tall at 1540 wide
        "not_an_image": b"%PDF-1.7 not really",
        "empty": b"",
    }[case]
    path = tmp_path / f"{case}.png"
    path.write_bytes(data)
    with pytest.raises(InputError) as exc:
        model("quantized").encode_image(path)
    assert exc.value.path == str(path)
    assert problem in exc.value.problem
    assert exc.value.exit_code == 4


def test_missing_image(tmp_path):
    with pytest.raises(InputError, match="not found"):
        model("quantized").preprocess(tmp_path / "nope.png")
    with pytest.raises(InputError, match="directory"):
        model("quantized").preprocess(tmp_path)


@pytest.mark.parametrize("case", ["cmyk_jpeg", "gray16", "palette_transparent", "la", "bilevel", "grey_float"])
def test_odd_modes_are_handled(tmp_path, case):
    rgb = _noise(90, 60)
    grad16 = (np.linspace(0, 65535, 60 * 90).reshape(60, 90)).astype(np.uint16)
    if case == "cmyk_jpeg":
        data = _encode(rgb.convert("CMYK"), "JPEG", quality=95)
    elif case == "gray16":
        data = _encode(Image.fromarray(grad16))
    elif case == "palette_transparent":
        p = rgb.convert("P")
        data = _encode(p, transparency=0)
    elif case == "la":
        data = _encode(rgb.convert("LA"))
    elif case == "bilevel":
        data = _encode(rgb.convert("1"))
    else:
        data = _encode(Image.fromarray((grad16 / 65535.0).astype(np.float32), mode="F"), "TIFF")
    path = tmp_path / f"{case}.img"
    path.write_bytes(data)
    vlm = model("quantized")
    px = vlm.preprocess(path)
    assert px.shape == (3, 70, 98) and px.dtype == np.float32 and np.all(np.isfinite(px))
    if case in ("gray16", "grey_float"):
        # the full 16-bit range maps onto 0..255 (PIL's own convert would clip to white)
        vc = vlm.vision_config
        lo = (0 - vc.image_mean[0]) / vc.image_std[0]
        hi = (1 - vc.image_mean[0]) / vc.image_std[0]
        assert px[0].min() < lo + 0.1 and px[0].max() > hi - 0.1
        assert np.mean(px[0]) < (lo + hi) / 2 + 0.2  # not saturated
    assert vlm.encode_image(px).shape == (6, 64)


def test_wide_but_valid_image():
    """20000x60: scaled to 1540x4 -> 1540x14 px (one patch row): rejected; 20000x400 works."""
    vlm = model("quantized")
    with pytest.raises(InputError, match="too small or too thin"):
        vlm.preprocess(_encode(Image.new("RGB", (20000, 60))))
    px = vlm.preprocess(_encode(Image.new("RGB", (20000, 400), (255, 255, 255))))
    assert px.shape == (3, 42, 1540)  # floor(400 / 12.987) = 30 -> 42


# -- model files ---------------------------------------------------------------------------------
def _write_mmproj(path: Path, drop: tuple[str, ...] = (), **overrides) -> Path:
    """A tiny all-F32 mmproj (vision 8 wide, 1 layer) written like llama.cpp's converter."""
    d, ff, heads, proj = 8, 16, 2, overrides.pop("projection_dim", 64)
    kv = {
        "general.type": "mmproj", "clip.has_vision_encoder": True, "clip.projector_type": "lightonocr",
        "clip.vision.projection_dim": proj, "clip.vision.image_size": 1540, "clip.vision.patch_size": 14,
        "clip.vision.embedding_length": d, "clip.vision.feed_forward_length": ff, "clip.vision.block_count": 1,
        "clip.vision.attention.head_count": heads, "clip.vision.attention.layer_norm_epsilon": 1e-5,
        "clip.use_silu": True, "clip.vision.spatial_merge_size": 2,
        "clip.vision.image_mean": [0.48145466, 0.4578275, 0.40821073],
        "clip.vision.image_std": [0.26862954, 0.26130258, 0.27577711],
    }
    kv.update(overrides)
    w = GGUFWriter(str(path), "clip")
    for key, value in kv.items():
        if key in drop:
            continue
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, [float(x) for x in value])
    rng = np.random.default_rng(0)
    shapes = {"v.patch_embd.weight": (d, 3, 14, 14), "v.pre_ln.weight": (d,), "mm.input_norm.weight": (d,),
              "mm.patch_merger.weight": (d, 4 * d), "mm.1.weight": (proj, d), "mm.2.weight": (proj, proj)}
    for n, shape in (("ln1", (d,)), ("ln2", (d,)), ("attn_q", (d, d)), ("attn_k", (d, d)), ("attn_v", (d, d)),
                     ("attn_out", (d, d)), ("ffn_gate", (ff, d)), ("ffn_up", (ff, d)), ("ffn_down", (d, ff))):
        shapes[f"v.blk.0.{n}.weight"] = shape
    for name, shape in shapes.items():
        w.add_tensor(name, (rng.standard_normal(shape) * 0.1).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_synthetic_f32_mmproj_runs(tmp_path):
    vlm = load_vlm(TEXT, _write_mmproj(tmp_path / "m.gguf"), weights="f32")
    feats = vlm.encode_image(FIX / "images" / "c_rgba_90x60.png")
    assert feats.shape == (6, 64) and np.all(np.isfinite(feats))


@pytest.mark.parametrize("kw,match", [
    ({"projection_dim": 32}, "projection_dim"),
    ({"clip.projector_type": "pixtral"}, "clip.projector_type"),
    ({"drop": ("clip.vision.block_count",)}, "clip.vision.block_count"),
    ({"drop": ("clip.vision.image_mean",)}, "clip.vision.image_mean"),
    ({"clip.vision.image_std": [0.2, 0.3]}, "clip.vision.image_std"),
    ({"clip.vision.attention.head_count": 3}, "head_count"),
    ({"clip.use_silu": False}, "use_silu"),
])
def test_bad_mmproj(tmp_path, kw, match):
    path = _write_mmproj(tmp_path / "bad.gguf", **kw)
    with pytest.raises(ModelError, match=match) as exc:
        load_vlm(TEXT, path)
    assert exc.value.path in (str(path), str(TEXT))
    assert exc.value.exit_code == 3


def test_swapped_or_wrong_files():
    with pytest.raises(ModelError, match="swapped"):
        load_vlm(MMPROJ, MMPROJ)
    with pytest.raises(ModelError, match="not a vision projector"):
        load_vlm(TEXT, TEXT)
