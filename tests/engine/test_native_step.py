"""The compiled decode step (engine/backends/native_step.py, csrc/decode_step.cpp): the torch decode
step's layer chain in one call. A sequence's rows are the same alone and in any batch, in both weight
storages and both pool kinds it takes, for every architecture of the chain; its logits are the Python
chain's up to rounding; a slot's first write sets its channel scales as the pool's store does; and
where it cannot be built it says why and the Python chain decodes."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from pantheon_ocr.engine import load_model  # noqa: E402
from pantheon_ocr.engine.attention import TowerOptions  # noqa: E402
from pantheon_ocr.engine.backends import native_step  # noqa: E402
from pantheon_ocr.engine.batch import forward_batch  # noqa: E402

from .conftest import LIGHTONOCR_TEXT, smollm2_or_skip  # noqa: E402
from .test_batch_exact import _joins, _prompts, assert_varied, run_exact  # noqa: E402
from .test_native import can_build_here  # noqa: E402
from .tiny_models import write_tiny  # noqa: E402


def can_build_step_here() -> bool:
    return can_build_here() and shutil.which(os.environ.get("CXX") or "c++") is not None


def stepped(path, weights: str, **tower):
    """The decoder of `path` with the compiled step, skipping where it cannot build here."""
    d = load_model(path, weights=weights, tower=TowerOptions(**tower)).decoder
    if d.torch_blocks.step is None:
        assert not can_build_step_here(), f"the step should build on this machine: {d.torch_blocks.step_why}"
        pytest.skip(d.torch_blocks.step_why)
    return d


@pytest.mark.parametrize("weights", ["int8", "bf16"])
@pytest.mark.parametrize("kind", ["int8", "bfloat16"])
def test_compiled_decode_rows_are_exact(weights, kind):
    d = stepped(LIGHTONOCR_TEXT, weights)
    for b in (1, 3, 17):
        prompts = _prompts(d.cfg.n_vocab, b, seed=60 + b)
        leaves = [3 if i % 3 == 2 else 6 for i in range(b)]
        assert_varied(run_exact(d, prompts, _joins(b, 60 + b), steps=6, leaves=leaves, no_repeat=True,
                                pool=d.new_pool(kind)))


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])  # adjacent pairs; biases; q/k norms
@pytest.mark.parametrize("weights", ["int8", "bf16"])
def test_compiled_decode_tiny_archs_rows_are_exact(tmp_path, arch, weights):
    path = tmp_path / f"{arch}.gguf"
    write_tiny(path, arch, dtype="BF16")
    d = stepped(path, weights)
    for b in (1, 3, 17):
        run_exact(d, _prompts(d.cfg.n_vocab, b, seed=b), _joins(b, b), steps=4, no_repeat=True,
                  pool=d.new_pool("int8"))


@pytest.mark.parametrize("weights", ["int8", "bf16"])
def test_compiled_decode_rows_are_exact_with_torchs_products(weights, monkeypatch):
    """Where the compiled products do not build, the step multiplies with torch's kernels, and rows
    stay exact: bf16 in fixed blocks of 16 rows. oneDNN's bfloat16 GEMM in one call of any M (what
    a measurement on random matrices had allowed) gave sequence 9 here other bits in a batch of 14
    than alone, on an AVX-512 BF16 EPYC."""
    from pantheon_ocr.engine.format import torch_groups as G

    monkeypatch.setattr(G, "compiled_products", lambda: None)
    d = stepped(LIGHTONOCR_TEXT, weights)
    assert d.torch_blocks.step._products is None
    prompts = _prompts(d.cfg.n_vocab, 17, seed=77)
    leaves = [3 if i % 3 == 2 else 6 for i in range(17)]
    assert_varied(run_exact(d, prompts, _joins(17, 77), steps=6, leaves=leaves, no_repeat=True,
                            pool=d.new_pool("bfloat16")))


def test_compiled_decode_rows_are_exact_over_4_bit_groups():
    """SmolLM2's Q4_1 matrices stay 4-bit (the compiled products' tiles, else torch's int4 kernel),
    its tied head int8 rows."""
    d = stepped(smollm2_or_skip(), "int8")
    prompts = _prompts(d.cfg.n_vocab, 5, seed=7)
    assert_varied(run_exact(d, prompts, [0, 0, 1, 2, 2], steps=4, check={0, 3}, pool=d.new_pool("int8")))


def decode(d, prompts, kind, steps):
    """Greedy decode of every prompt together: the logits of each step [steps, B, n_vocab]."""
    pool = d.new_pool(kind)
    states = [d.new_state(len(p) + steps + 1, pool) for p in prompts]
    tokens = [int(np.argmax(d.forward(s, p)[-1])) for s, p in zip(states, prompts)]
    out = []
    for _ in range(steps):
        logits = forward_batch(d, states, tokens)
        out.append(logits)
        tokens = [int(t) for t in logits.argmax(-1)]
    return np.stack(out)


@pytest.mark.parametrize("weights", ["int8", "bf16"])
@pytest.mark.parametrize("kind", ["int8", "bfloat16"])
def test_compiled_step_is_the_python_chain_up_to_rounding(weights, kind):
    """The same products; the norms, RoPE and SwiGLU in plain loops sum and round in their own order."""
    d = stepped(LIGHTONOCR_TEXT, weights)
    py = load_model(LIGHTONOCR_TEXT, weights=weights, tower=TowerOptions(decode_step=False)).decoder
    assert py.torch_blocks.step is None and "ask for it" in py.torch_blocks.step_why
    prompts = _prompts(d.cfg.n_vocab, 3, seed=3)
    got, want = decode(d, prompts, kind, 6), decode(py, prompts, kind, 6)
    assert np.array_equal(got.argmax(-1), want.argmax(-1))
    assert np.abs(got - want).max() <= 2e-2 * np.abs(want).max()


def test_a_first_write_by_a_decode_step_sets_the_channel_scales():
    """A one-token prompt is a decode step: the slot's int8 channel scales come from that key, as
    KVPool.store sets them from a prompt, and the pool says so (kc_set)."""
    d = stepped(LIGHTONOCR_TEXT, "int8")
    py = load_model(LIGHTONOCR_TEXT, weights="int8", tower=TowerOptions(decode_step=False)).decoder
    pools = []
    for dec in (d, py):
        pool = dec.new_pool("int8")
        dec.forward(dec.new_state(8, pool), [17])
        pools.append(pool)
    a, b = pools
    assert a.kc_set == b.kc_set == {(i, 0) for i in range(len(d.layers))}
    for i in range(len(d.layers)):
        np.testing.assert_allclose(a.kc[i][0], b.kc[i][0], rtol=2e-2)
        assert np.abs(a.k[i][0, :, 0].astype(int) - b.k[i][0, :, 0]).max() <= 2


def test_a_steps_int8_store_is_the_numpy_stores_bits():
    """store_row (the step's KV store) against cache._int8_of, row by row: keys divided by their channel
    scales, values as they are; a zero row, a row past float32's normals and halves among them."""
    from pantheon_ocr.engine.cache import _int8_of

    built = native_step.decode_step()
    if built.lib is None:
        assert not can_build_step_here(), f"the step should build on this machine: {built.why}"
        pytest.skip(built.why)
    rng = np.random.default_rng(9)
    x = (rng.standard_normal((64, 128)) * rng.uniform(1e-3, 30, (64, 1))).astype(np.float32)
    x[3], x[5], x[6, :64] = 0, 1e-40, np.arange(64) - 31.5
    kc = np.abs(x).max(axis=0) + np.float32(0.5)  # [128] channel scales
    for channels in (None, kc):
        want_q, want_bits = _int8_of(x if channels is None else x / channels)
        q, bits = np.empty((64, 128), np.int8), np.empty(64, np.uint16)
        for r in range(64):
            built.lib.step_store_row(x[r].ctypes.data, 128, native_step.POOLS["int8"], q[r].ctypes.data,
                                     bits[r:].ctypes.data, None if channels is None else channels.ctypes.data)
        assert np.array_equal(q, want_q.astype(np.int8)) and np.array_equal(bits, want_bits[:, 0])


def test_hooked_or_refused_steps_say_why_and_the_python_chain_decodes(monkeypatch, tmp_path):
    hooked = load_model(LIGHTONOCR_TEXT, weights="int8", tower=TowerOptions(on_layer=lambda i, s: None)).decoder
    assert hooked.torch_blocks.step is None and "timing hook" in hooked.torch_blocks.step_why
    no_kernel = load_model(LIGHTONOCR_TEXT, weights="int8", tower=TowerOptions(decode_kernel=False)).decoder
    assert no_kernel.torch_blocks.step is None and "decode attention" in no_kernel.torch_blocks.step_why
    built = native_step.build(tmp_path, cxx="no-such-compiler")
    assert built.lib is None and "'no-such-compiler' not found" in built.why and "CXX" in built.why
    monkeypatch.setattr(native_step, "decode_step", lambda: built)
    d = load_model(LIGHTONOCR_TEXT, weights="int8").decoder
    assert d.torch_blocks.step is None and d.torch_blocks.step_why == built.why
    assert decode(d, [[1, 2, 3]], "int8", 2).shape == (2, 1, d.cfg.n_vocab)


def test_a_build_that_fails_says_why(tmp_path, monkeypatch):
    if not can_build_step_here():
        pytest.skip("needs a C++ compiler")
    bad = tmp_path / "bad.cpp"
    bad.write_text("this is not C++\n")
    monkeypatch.setattr(native_step, "SOURCE", bad)
    built = native_step.build(tmp_path)
    assert built.lib is None and "could not build bad.cpp" in built.why
    assert not list(tmp_path.glob("*.so")) and not list(tmp_path.glob("tmp*"))  # nothing half-built left


def test_compiled_decode_rows_are_exact_while_the_pool_grows():
    """Sequences decode past a slot's first capacity (256 positions) and new ones join: the pool's
    buffers are replaced mid-run, and the step takes the new ones."""
    d = stepped(LIGHTONOCR_TEXT, "int8")
    rng = np.random.default_rng(9)
    prompts = [rng.integers(0, d.cfg.n_vocab, size=n).tolist() for n in (250, 3, 252, 40)]
    pool = d.new_pool("int8")
    assert_varied(run_exact(d, prompts, [0, 0, 1, 3], steps=9, no_repeat=True, pool=pool))
    assert pool.k[0].shape[2] > 256
