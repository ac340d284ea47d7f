"""--gpu-prefill / --gpu-decode: DeviceWeight keeps the Weight.matmul contract, and the mirrored
decoder gives the same greedy streams as the CPU path (on TEST_DEVICE: the CPU unless
PANTHEON_OCR_TEST_DEVICE names a GPU)."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest

# as the engine does before importing torch (backends.require_torch): its OpenMP spin
from pantheon_ocr.engine.backends.common import openmp_env  # noqa: E402

openmp_env()

torch = pytest.importorskip("torch")

from pantheon_ocr.engine import load_model, load_vlm  # noqa: E402
from pantheon_ocr.engine.backends import BackendUnavailable  # noqa: E402
from pantheon_ocr.engine.backends.device import DeviceWeight, GpuSwitches, mirror_decoder  # noqa: E402
from pantheon_ocr.engine.batch import batch_logits  # noqa: E402
from pantheon_ocr.engine.page_engine import OCREngine  # noqa: E402
from pantheon_ocr.engine.format.weights import Weight  # noqa: E402
from pantheon_ocr.engine.sampling import SamplingOptions  # noqa: E402

from .conftest import LIGHTONOCR_DIR, LIGHTONOCR_MMPROJ, LIGHTONOCR_TEXT, TEST_DEVICE, smollm2_or_skip  # noqa: E402


@lru_cache(maxsize=None)
def vlm(mode="f32"):
    return load_vlm(LIGHTONOCR_TEXT, LIGHTONOCR_MMPROJ, weights=mode)


@pytest.mark.parametrize("mode", ["f32", "quantized"])
def test_device_weight_matmul_contract(mode):
    dec = vlm(mode).decoder
    rng = np.random.default_rng(0)
    for w in (dec.layers[0].attn_q, dec.layers[1].ffn_down, dec.output):
        dw = DeviceWeight(w, TEST_DEVICE)
        for m in (1, 5):
            x = rng.standard_normal((m, w.shape[1]), dtype=np.float32)
            y = dw.matmul(x)
            assert y.dtype == np.float32 and y.shape == (m, w.shape[0])
            ref = w.matmul(x)
            assert np.max(np.abs(y - ref)) <= 1e-5 * np.max(np.abs(ref))
        assert (dw.name, dw.shape) == (w.name, w.shape)
        assert np.array_equal(dw.rows([3, 7]), w.rows([3, 7]))


def test_mirror_uploads_once_and_leaves_the_decoder_alone():
    dec = vlm().decoder
    uploads: dict = {}
    a = mirror_decoder(dec, TEST_DEVICE, output=False, uploads=uploads)
    b = mirror_decoder(dec, TEST_DEVICE, output=True, uploads=uploads)
    assert a.layers[0].attn_q is b.layers[0].attn_q and isinstance(a.layers[0].attn_q, DeviceWeight)
    assert isinstance(dec.layers[0].attn_q, Weight) and dec.output is dec.token_embd
    assert a.output is dec.output and isinstance(b.output, DeviceWeight)
    assert a.layers[0].attn_norm is dec.layers[0].attn_norm  # norms etc. stay shared numpy arrays


def test_unavailable_device_is_one_line():
    with pytest.raises(BackendUnavailable, match="device cuda:99"):  # no CUDA here, or not 100 GPUs
        GpuSwitches(vlm().decoder, decode=True, device="cuda:99")


def _page_tokens(engine, images, max_tokens=10):
    """Pages prefilled one by one and decoded together (the pipeline's CPU stage)."""
    sampling = SamplingOptions(max_tokens=max_tokens)
    seqs = [engine.prefill(engine.vision(LIGHTONOCR_DIR / "images" / f"{n}.png"), sampling) for n in images]
    while not all(s.finished for s in seqs):
        engine.decode_step(seqs)
    return [s.generated for s in seqs]


def test_switches_give_the_cpu_greedy_streams_lightonocr():
    images = ["a_rgb_150x110", "c_rgba_90x60", "d_text_300x120"]
    want = _page_tokens(OCREngine(vlm()), images)
    assert all(len(t) == 10 for t in want)
    for kw in ({"gpu_prefill": True}, {"gpu_decode": True}, {"gpu_prefill": True, "gpu_decode": True}):
        engine = OCREngine(vlm(), **kw, device=TEST_DEVICE)
        assert (engine.prefill_decoder is not engine.vlm.decoder) == kw.get("gpu_prefill", False)
        assert (engine.decode_decoder is not engine.vlm.decoder) == kw.get("gpu_decode", False)
        assert _page_tokens(engine, images) == want, kw


def _streams(prefill_dec, decode_dec, prompts, n):
    states, outs = [], []
    for p in prompts:
        st = prefill_dec.new_state(len(p) + n + 1)
        outs.append([int(prefill_dec.forward(st, p)[-1].argmax())])
        states.append(st)
    for _ in range(n):
        logits = batch_logits(decode_dec, states, [o[-1] for o in outs])
        for o, row in zip(outs, logits):
            o.append(int(row.argmax()))
    return outs


def test_switches_give_the_cpu_greedy_streams_smollm2():
    model = load_model(smollm2_or_skip(), weights="f32")  # DeviceWeight on quantized storage: see above
    dec = model.decoder
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, model.config.n_vocab, n).tolist() for n in (19, 11, 26)]
    want = _streams(dec, dec, prompts, 6)
    sw = GpuSwitches(dec, prefill=True, decode=True, device=TEST_DEVICE)
    assert _streams(sw.prefill_decoder, dec, prompts, 6) == want  # --gpu-prefill: decode back on the CPU
    assert _streams(dec, sw.decode_decoder, prompts, 6) == want  # --gpu-decode


def test_cli_torch_vision_and_both_switches_write_the_same_pages(tmp_path, capsys):
    from pantheon_ocr.cli import main

    pdf = str(LIGHTONOCR_DIR.parent.parent.parent / "samples" / "docs" / "text-1page.pdf")
    common = ["transcribe", pdf, "--model", str(LIGHTONOCR_DIR), "--max-tokens", "6", "--no-progress",
              "--render-workers", "1"]
    assert main(common + ["-o", str(tmp_path / "cpu")]) == 0
    assert main(common + ["-o", str(tmp_path / "dev"), "--vision-backend", "torch", "--device", TEST_DEVICE,
                          "--vision-dtype", "float32", "--gpu-prefill", "--gpu-decode"]) == 0
    a, b = (sorted((tmp_path / d).rglob("*.md")) for d in ("cpu", "dev"))
    assert len(a) == len(b) == 1 and a[0].read_text() == b[0].read_text()
