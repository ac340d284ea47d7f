"""bfloat16 where the CPU has it: "bf16" weight storage (torch matmuls) for the decoder, and the
`auto` vision backend (torch on the CPU, bfloat16 on CPUs with bfloat16 units). numpy float32 is
the reference; each lower-precision path states its measured error against it here."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

from pantheon_ocr.engine import backends as B  # noqa: E402
from pantheon_ocr.engine import load_model  # noqa: E402

from .conftest import LIGHTONOCR_TEXT, smollm2_or_skip  # noqa: E402
from .test_batch_exact import _joins, _prompts, assert_varied, run_exact  # noqa: E402
from .tiny_models import write_tiny  # noqa: E402


def rel_err(a, b) -> float:
    return float(np.max(np.abs(a.astype(np.float64) - b)) / np.max(np.abs(b)))


def _prefill_and_steps(model, prompt, steps=4):
    """Logits of the prompt's last position and of `steps` teacher-forced decode steps."""
    d = model.decoder
    st = d.new_state(len(prompt) + steps + 1)
    rows = [d.forward(st, prompt)[0]]
    for t in prompt[:steps]:
        rows.append(d.forward(st, [t])[0])
    return np.stack(rows)


# Measured on this repository's fixtures (relative to the largest |logit|): tiny LightOnOCR text
# 8.0e-3; SmolLM2-135M (Q4_1 weights, bf16 adds only the activation rounding and bf16 products)
# 1.5e-2. Bounds leave about 2x room.
@pytest.mark.parametrize("which,bound", [("lightonocr", 2e-2), ("smollm2", 3e-2)])
def test_bf16_weights_logits_error_against_f32(which, bound, record_property):
    path = LIGHTONOCR_TEXT if which == "lightonocr" else smollm2_or_skip()
    f32, bf16 = load_model(path, weights="f32"), load_model(path, weights="bf16")
    prompt = _prompts(f32.config.n_vocab, 1, seed=3)[0] + [1, 2, 3]
    ref, got = _prefill_and_steps(f32, prompt), _prefill_and_steps(bf16, prompt)
    err = rel_err(got, ref)
    record_property("bf16_rel_err", err)
    print(f"{which}: bf16 weights, max relative logits error vs f32 {err:.2e}")
    assert 1e-5 < err <= bound  # bf16 really ran (not float32 in disguise), and stays close


def test_bf16_weights_batch_rows_are_exact():
    """The exact-rows promise holds for bf16 storage too (blocks of 16 rows, one oneDNN call each)."""
    model = load_model(LIGHTONOCR_TEXT, weights="bf16")
    prompts = _prompts(model.config.n_vocab, 7, seed=11)
    assert_varied(run_exact(model.decoder, prompts, _joins(7, 11), steps=6, no_repeat=True))


@pytest.mark.parametrize("dtype,weights", [("BF16", "bf16"), ("F32", "int8")])  # int8: test_int8_weights.py
@pytest.mark.parametrize("arch", ["llama", "qwen3", "phi3"])
def test_bf16_weights_tiny_archs_batch_rows_are_exact(tmp_path, arch, dtype, weights):
    path = tmp_path / f"{arch}.gguf"
    write_tiny(path, arch, dtype=dtype)
    model = load_model(path, weights=weights)
    for b in (1, 3, 17):
        run_exact(model.decoder, _prompts(model.config.n_vocab, b, seed=b), _joins(b, b), steps=4)


def test_bf16_file_weights_are_the_memory_map(tmp_path):
    """A BF16 tensor in "bf16" storage is a view of the file's pages: no second copy in memory."""
    path = tmp_path / "llama.gguf"
    write_tiny(path, "llama", dtype="BF16")
    model = load_model(path, weights="bf16")
    w = model.decoder.layers[0].attn_q
    raw = model.decoder.layers[0].attn_q._data  # noqa: SLF001 - the storage itself is the point
    mm = np.frombuffer(model.gguf._map, dtype=np.uint8)  # noqa: SLF001
    start = mm.ctypes.data
    assert start <= raw.data_ptr() < start + mm.size
    x = np.random.default_rng(0).standard_normal((3, w.shape[1]), dtype=np.float32)
    np.testing.assert_allclose(w.matmul(x), x @ w.dense().T, rtol=2e-2, atol=2e-2)


def test_auto_vision_backend_is_torch_on_the_cpu(monkeypatch):
    """With torch installed and no GPU, auto runs the torch encoder on the CPU, in bfloat16 when
    the CPU has bfloat16 units."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(B, "mps_available", lambda _torch: False)
    monkeypatch.setattr(B.platform, "system", lambda: "Linux")
    name, device, reason = B.plan_vision_backend("auto")
    assert (name, device) == ("torch", "cpu") and "CPU" in reason
    for has in (True, False):
        monkeypatch.setattr(B, "cpu_has_bf16", lambda has=has: has)
        assert B.resolve_dtype("torch", "cpu", "auto") == ("bfloat16" if has else "float32")
        assert B.resolve_dtype("numpy", "cpu", "auto") == "float32"
        assert B.resolve_dtype("torch", "cpu", "float16") == "float16"  # an explicit choice stands


def test_auto_vision_dtype_is_bfloat16_on_a_cuda_gpu_with_bfloat16_tensor_cores(monkeypatch):
    """On a CUDA GPU of compute capability 8.0 or later (an H100: 0.06 s a full page against 0.46 in
    float32), auto computes the vision in bfloat16; on older ones, and on MPS, in float32."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for major, want in ((9, "bfloat16"), (8, "bfloat16"), (7, "float32")):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, major=major: (major, 0))
        assert B.resolve_dtype("torch", "cuda", "auto") == want
        assert B.resolve_dtype("torch", "cuda:1", "auto") == want
        assert B.resolve_dtype("torch", "cuda", "float32") == "float32"
    assert B.resolve_dtype("torch", "mps", "auto") == "float32"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # asked with no CUDA: float32, no error
    assert B.resolve_dtype("torch", "cuda", "auto") == "float32"


def test_any_cpu_device_is_spelled_cpu():
    """"cpu:0" is the CPU: the thread plan (PageEngine.vision_device == "cpu") and the dtype see it so."""
    assert B.resolve_device("cpu:0") == B.resolve_device("cpu") == "cpu"
    assert B.plan_vision_backend("torch", "cpu:0", "auto")[1] == "cpu"


def test_bf16_decoders_prefill_with_torch_attention_as_numpys():
    """bf16 decoders prefill with torch's causal attention kernel; a prompt prefilled in chunks
    after a cached prefix gives the logits of the numpy blocked kernel up to summation order."""
    from dataclasses import replace

    from pantheon_ocr.engine.backends.torch_attention import causal_chunk_attention

    assert load_model(LIGHTONOCR_TEXT, weights="f32").decoder.tower.causal_chunk is None
    torch_model, numpy_model = load_model(LIGHTONOCR_TEXT, weights="bf16"), load_model(LIGHTONOCR_TEXT, weights="bf16")
    assert torch_model.decoder.tower.causal_chunk is causal_chunk_attention
    numpy_model.decoder.tower = replace(numpy_model.decoder.tower, causal_chunk=None)
    prompt = _prompts(torch_model.config.n_vocab, 1, seed=7)[0] * 3  # chunks of 17 over a growing cache

    def chunked(model):
        d = model.decoder
        st = d.new_state(len(prompt) + 1)
        return np.stack([d.forward(st, prompt[i:i + 17])[-1] for i in range(0, len(prompt), 17)])

    got, ref = chunked(torch_model), chunked(numpy_model)
    assert rel_err(got, ref) <= 1e-5
    assert (got.argmax(-1) == ref.argmax(-1)).all()


def test_auto_weights_are_int8_rows_on_either_cpu(monkeypatch, tmp_path):
    """`--weights auto` for a large text model with torch installed: int8 rows, where the CPU has
    bfloat16 units (a decode step reads half bf16's bytes: twice its speed at one sequence) and where
    it has none (emulated bfloat16 products are slower still, docs/benchmarks.md); the note says
    how prompts multiply."""
    from pantheon_ocr.engine import loader
    from pantheon_ocr.options import EngineOptions

    monkeypatch.setattr(loader, "_params", lambda path: 600_000_000)
    for has in (True, False):
        monkeypatch.setattr(B, "cpu_has_bf16", lambda has=has: has)
        o, why = loader.plan_auto(EngineOptions(tmp_path / "m.gguf", tmp_path / "p.gguf"))
        assert o.weights == "int8" and why[0].startswith("weights: int8 (")
        assert ("without bfloat16 units" in why[0]) is not has
        assert ("prompts multiply in bfloat16" in why[0]) is has


def test_prompts_multiply_in_float32_without_bfloat16_units(monkeypatch):
    """On a CPU without bfloat16 units a prompt's product (more than ROW_BLOCK rows) is the float32
    GEMM of the widened matrix; decode rows (exact_rows) and CPUs with the units keep bfloat16."""
    import torch

    from pantheon_ocr.engine.format import torch_weights as TW

    rng = np.random.default_rng(3)
    dense = rng.standard_normal((48, 64)).astype(np.float32)
    x = torch.from_numpy(rng.standard_normal((40, 64)).astype(np.float32))
    for data in (TW.from_f32(dense), TW.int8_rows(dense)):
        q, s = data if isinstance(data, tuple) else (data, None)
        wide = torch.nn.functional.linear(x, q.float())  # the widened matrix's product, then the rows' scales
        wide = wide if s is None else wide * s.float()
        assert torch.allclose(wide, x @ torch.from_numpy(dense).T, rtol=2e-2, atol=0.2)
        bf16 = TW.product(data, 40)(x.to(torch.bfloat16)).float()
        monkeypatch.setattr(TW, "cpu_has_bf16", lambda: False)
        assert torch.equal(TW.linear(data, x), wide)
        assert not torch.equal(TW.linear(data, x), bf16)
        exact = TW.linear(data, x, exact_rows=True)
        monkeypatch.setattr(TW, "cpu_has_bf16", lambda: True)
        assert torch.equal(TW.linear(data, x), bf16)
        assert torch.equal(TW.linear(data, x, exact_rows=True), exact)  # decode rows: the same either way
