"""The compiled decode attention (engine/backends/native.py, csrc/decode_attention.c): attention
over the widened bfloat16 keys to float32 rounding, a sequence's bits the same alone and in any
batch, slot order or thread count, the shapes and inputs it refuses, and builds that cannot happen
saying why (the engine then keeps torch's products)."""

from __future__ import annotations

import ctypes
import os
import platform
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from pantheon_ocr.engine import load_model  # noqa: E402
from pantheon_ocr.engine.attention import TowerOptions  # noqa: E402
from pantheon_ocr.engine.backends import native  # noqa: E402
from pantheon_ocr.engine.backends.common import cpu_flags  # noqa: E402
from pantheon_ocr.engine.ops import from_bf16_bits, to_bf16_bits  # noqa: E402

from .conftest import LIGHTONOCR_TEXT  # noqa: E402


def can_build_here() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64") and {"avx2", "fma", "f16c"} <= cpu_flags() \
        and shutil.which(os.environ.get("CC") or "cc") is not None


def compiled_or_skip(library: native.Library, needs: frozenset[str] = frozenset({"avx512f"})):
    """This process's kernel of `library`; where there is none a skip, unless this machine (a C compiler,
    an x86-64 CPU with AVX2 and the CPU flags `needs`) should have built it."""
    kernel = library.compiled()
    if kernel is None:
        assert not (can_build_here() and needs <= cpu_flags()), \
            f"the {library.what} should build on this machine: {library.why()}"
        pytest.skip(library.why())
    return kernel


def kernel_or_skip() -> native.DecodeAttention:
    built = native.decode_attention()
    if built.kernel is None:
        assert not can_build_here(), f"the kernel should build on this machine: {built.why}"
        pytest.skip(built.why)
    return built.kernel


@pytest.fixture(scope="module")
def kernels(tmp_path_factory) -> list[native.DecodeAttention]:
    """The kernel built for every instruction set this CPU has (native.ISAS: AVX-512 and AVX2 on an
    AVX-512 machine): each build's sums run in their own order, and each must hold what the tests say."""
    kernel_or_skip()
    root = tmp_path_factory.mktemp("kernels")
    built = [native.build(root, isa=isa) for isa in native.isas_here()]
    assert all(b.kernel is not None for b in built), [b.why for b in built]
    return [b.kernel for b in built]


def test_the_best_instruction_set_of_the_cpu_is_built(tmp_path, monkeypatch):
    """AVX-512 where the CPU has it (16 stored values widened at a time), else AVX2; -v names it."""
    if not can_build_here():
        pytest.skip("needs an x86-64 CPU with AVX2 and FMA and a C compiler")
    assert native.decode_attention().why.startswith(f"the compiled {native.isas_here()[0]} kernel")
    monkeypatch.setattr(native, "cpu_flags", lambda: cpu_flags() - {"avx512f"})
    assert native.isas_here() == ["AVX2"] and native.build(tmp_path).why.startswith("the compiled AVX2 kernel")
    assert "no AVX-512" in native.build(tmp_path, isa="AVX-512").why


def pool_layer(slots: int, hkv: int, cap: int, d: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return tuple(to_bf16_bits(rng.standard_normal((slots, hkv, cap, d), dtype=np.float32) * 2) for _ in "kv")


def reference(k, v, slot: int, n: int, q: np.ndarray, scale: float) -> np.ndarray:
    """float64 softmax attention of q [Hq, D] over the widened keys of one slot."""
    kk, vv = (from_bf16_bits(a[slot, :, :n]).astype(np.float64) for a in (k, v))  # [Hkv, n, D]
    g = q.shape[0] // kk.shape[0]
    kk, vv = np.repeat(kk, g, axis=0), np.repeat(vv, g, axis=0)  # query head h reads KV head h // g
    s = np.einsum("hd,hnd->hn", q.astype(np.float64) * scale, kk)
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("hn,hnd->hd", p / p.sum(-1, keepdims=True), vv)


@pytest.mark.parametrize("d", [8, 16, 64, 128, 136])  # 136: by 64 (AVX-512) or 32 columns, then by 8
@pytest.mark.parametrize("g", [1, 2, 3, 7])
@pytest.mark.parametrize("n", [1, 5, 8, 9, 300])
def test_kernel_is_attention_over_the_widened_keys(d, g, n, kernels):
    hkv, cap = 2, 304
    k, v = pool_layer(3, hkv, cap, d, seed=d + g + n)
    q = np.random.default_rng(n).standard_normal((2, hkv * g, d), dtype=np.float32)
    for kernel in kernels:
        got = kernel(k, v, [2, 0], [n, max(1, n - 1)], q, scale=d ** -0.5, threads=2)
        for b, (slot, length) in enumerate([(2, n), (0, max(1, n - 1))]):
            ref = reference(k, v, slot, length, q[b], d ** -0.5)
            np.testing.assert_allclose(got[b], ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def test_a_peaked_softmax_with_small_values_is_still_attention(kernels):
    """Scores spread far beyond e^-87 and values near 1e-3: the far-off weights times the values are
    subnormal, which the kernel flushes to zero (FTZ/DAZ while it runs) rather than pay a microcode
    assist for each; what they drop is below float32's rounding of the result."""
    hkv, g, d, cap, n = 2, 2, 64, 304, 300
    k, v = pool_layer(2, hkv, cap, d, seed=3)
    v = to_bf16_bits(from_bf16_bits(v) * 1e-3)
    q = np.random.default_rng(4).standard_normal((1, hkv * g, d), dtype=np.float32)
    scale = 4.0  # scores ~ N(0, 64): spreads of a few hundred
    ref = reference(k, v, 1, n, q[0], scale)
    spread = np.ptp(np.einsum("hd,hnd->hn", q[0, ::g] * scale, from_bf16_bits(k[1, :, :n])), axis=-1)
    assert (spread > 200).all(), spread
    for kernel in kernels:
        got = kernel(k, v, [1], [n], q, scale=scale, threads=2)[0]
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def int8_pool_layer(slots: int, hkv: int, cap: int, d: int, seed: int):
    """An int8 layer as cache.KVPool keeps it: values, per-position scales (bfloat16 bits), per-channel
    key scales."""
    rng = np.random.default_rng(seed)
    k, v = (rng.integers(-127, 128, (slots, hkv, cap, d), dtype=np.int8) for _ in "kv")
    ks, vs = (to_bf16_bits(rng.uniform(0.001, 0.05, (slots, hkv, cap, 1)).astype(np.float32)) for _ in "kv")
    kc = rng.uniform(0.5, 4.0, (slots, hkv, 1, d)).astype(np.float32)
    return k, v, (ks, vs, kc)


@pytest.mark.parametrize("d", [16, 64, 136])
@pytest.mark.parametrize("g", [1, 3])
@pytest.mark.parametrize("n", [1, 9, 300])
def test_int8_keys_are_attention_over_their_scaled_values(d, g, n, kernels):
    """K = Kq ks[p] kc[c] and V = Vq vs[p] (cache.KVPool's int8 layout): the kernel puts kc on the
    query, ks on the scores and vs on the weights, as torch_blocks.sequence_attention does."""
    hkv, cap = 2, 304
    k, v, (ks, vs, kc) = int8_pool_layer(3, hkv, cap, d, seed=n + d)
    q = np.random.default_rng(g).standard_normal((1, hkv * g, d), dtype=np.float32)
    kk = (k[1, :, :n].astype(np.float64) * from_bf16_bits(ks[1, :, :n]) * kc[1])  # [Hkv, n, D]
    vv = v[1, :, :n].astype(np.float64) * from_bf16_bits(vs[1, :, :n])
    kk, vv = np.repeat(kk, g, axis=0), np.repeat(vv, g, axis=0)
    s = np.einsum("hd,hnd->hn", q[0].astype(np.float64) * d ** -0.5, kk)
    p = np.exp(s - s.max(-1, keepdims=True))
    ref = np.einsum("hn,hnd->hd", p / p.sum(-1, keepdims=True), vv)
    for kernel in kernels:
        got = kernel(k, v, [1], [n], q, scale=d ** -0.5, threads=2, scales=(ks, vs, kc))[0]
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


@pytest.mark.parametrize("which", [0, -1])  # the best build (AVX-512 where the CPU has it) and AVX2
def test_a_sequence_has_the_same_bits_alone_and_in_any_batch(which, kernels):
    """The exactness the batched decode promises: a sequence's output does not depend on the other
    sequences of the call, their order, or how many threads share the work."""
    kernel = kernels[which]
    hkv, g, d, cap = 3, 3, 64, 320
    k, v = pool_layer(6, hkv, cap, d, seed=7)
    slots, lengths = [3, 0, 5, 1, 2], [1, 7, 64, 300, 301]
    q = np.random.default_rng(8).standard_normal((5, hkv * g, d), dtype=np.float32)
    alone = np.stack([kernel(k, v, [s], [n], q[b:b + 1], scale=0.125, threads=1)[0]
                      for b, (s, n) in enumerate(zip(slots, lengths))])
    for threads in (1, 2, 3, 8, 64, 200):
        assert np.array_equal(kernel(k, v, slots, lengths, q, scale=0.125, threads=threads), alone), threads
    order = [4, 2, 0, 3, 1]
    mixed = kernel(k, v, [slots[i] for i in order], [lengths[i] for i in order], q[order], scale=0.125, threads=2)
    assert np.array_equal(mixed, alone[order])
    k8, v8, scales = int8_pool_layer(6, hkv, cap, d, seed=9)
    alone = np.stack([kernel(k8, v8, [s], [n], q[b:b + 1], scale=0.125, threads=1, scales=scales)[0]
                      for b, (s, n) in enumerate(zip(slots, lengths))])
    for threads in (1, 2, 3):
        assert np.array_equal(kernel(k8, v8, slots, lengths, q, scale=0.125, threads=threads, scales=scales), alone)


def test_the_kernel_refuses_what_it_cannot_read():
    kernel = kernel_or_skip()
    k, v = pool_layer(2, 2, 16, 16, seed=1)
    q = np.zeros((1, 4, 16), np.float32)
    bad = [
        dict(k=k.astype(np.float32)),  # not bfloat16 bits
        dict(k=k[:, :, :8]),  # keys and values of different shapes
        dict(v=v[:, :, ::2], k=k[:, :, ::2]),  # a strided view
        dict(lengths=[17]),  # past the slot's capacity
        dict(lengths=[0]),  # nothing to attend to
        dict(slots=[2]),  # no such slot
        dict(q=np.zeros((1, 5, 16), np.float32)),  # 5 query heads over 2 KV heads
        dict(q=np.zeros((2, 4, 16), np.float32)),  # two queries for one sequence
        dict(k=k.view(np.int8)[..., ::2].copy(), v=v.view(np.int8)[..., ::2].copy()),  # int8 without scales
        dict(k=k.view(np.int16), v=v.view(np.int16)),  # another kind of 16-bit value
    ]
    for change in bad:
        args = dict(k=k, v=v, slots=[1], lengths=[4], q=q) | change
        with pytest.raises(ValueError):
            kernel(args["k"], args["v"], args["slots"], args["lengths"], args["q"], scale=1.0, threads=1)
    assert not native.DecodeAttention.takes(8, 2, 12)  # a head dimension not a multiple of 8
    assert not native.DecodeAttention.takes(34, 2, 64)  # 17 query heads per KV head
    assert native.DecodeAttention.takes(9, 3, 64)  # SmolLM2


def test_a_build_that_cannot_happen_says_why(tmp_path, monkeypatch):
    missing = native.build(tmp_path, cc="no-such-compiler-here")
    assert missing.kernel is None and "no-such-compiler-here" in missing.why and "not found" in missing.why
    if not can_build_here():
        pytest.skip("needs an x86-64 CPU with AVX2 and FMA")
    broken = tmp_path / "cc-that-fails"
    broken.write_text("#!/bin/sh\n[ \"$1\" = -v ] && exit 0\necho 'fatal: cannot write code' >&2\nexit 1\n")
    broken.chmod(broken.stat().st_mode | stat.S_IEXEC)
    failed = native.build(tmp_path / "cache", cc=str(broken))
    assert failed.kernel is None and "fatal: cannot write code" in failed.why
    assert list((tmp_path / "cache").iterdir()) == []  # no half-written library left behind
    monkeypatch.setattr(native, "cpu_flags", lambda: frozenset({"sse2"}))
    assert "AVX2" in native.build(tmp_path).why


def test_a_build_is_made_once_and_reused(tmp_path):
    if not can_build_here():
        pytest.skip("needs an x86-64 CPU with AVX2 and FMA and a C compiler")
    first = native.build(tmp_path)
    assert first.kernel is not None, first.why
    made = first.kernel.path.stat().st_mtime_ns
    again = native.build(tmp_path)
    assert again.kernel.path == first.kernel.path and again.kernel.path.stat().st_mtime_ns == made
    name = first.kernel.path.name
    assert sorted(p.name for p in tmp_path.iterdir()) == [name, name + ".sha256"]  # no temporary file left


def test_a_header_beside_the_source_is_part_of_the_librarys_name(tmp_path):
    """rows.c and bf16_attention.c include csrc/exp16.h: changing it must build both anew, not load a
    library made from the old header."""
    from pantheon_ocr.engine.backends.compiled import cached_build, find_compiler

    if not can_build_here():
        pytest.skip("needs an x86-64 CPU with AVX2 and FMA and a C compiler")
    src, header = tmp_path / "src" / "k.c", tmp_path / "src" / "k.h"
    src.parent.mkdir()
    src.write_text('#include "k.h"\nint k(void) { return K; }\n')
    cc = find_compiler("CC", "cc")
    built = []
    for value in (1, 2, 1):
        header.write_text(f"#define K {value}\n")
        built.append(cached_build(cc, "k", src, [["-O2", "-fPIC", "-shared", str(src)]], tmp_path / "cache", 60)[1])
    assert built[0] != built[1] and built[2] == built[0]
    assert ctypes.CDLL(str(built[1])).k() == 2 and ctypes.CDLL(str(built[2])).k() == 1


def test_a_cached_library_cut_short_is_built_again_not_loaded(tmp_path):
    """Loading a truncated library kills the process with SIGBUS before anything can be said (every
    later run too, until the cache is emptied by hand): it is checked against its digest first."""
    from pantheon_ocr.engine.backends.compiled import cached_build, find_compiler, intact

    if not can_build_here():
        pytest.skip("needs an x86-64 CPU with AVX2 and FMA and a C compiler")
    src = tmp_path / "src" / "k.c"
    src.parent.mkdir()
    src.write_text("int k(void) { return 7; }\n")
    cc, args = find_compiler("CC", "cc"), [["-O2", "-fPIC", "-shared", str(src)]]
    _, built = cached_build(cc, "k", src, args, tmp_path / "cache", 60)
    whole = built.read_bytes()
    built.write_bytes(whole[:1000])  # a disk that filled, a copy cut off
    assert not intact(built)
    assert cached_build(cc, "k", src, args, tmp_path / "cache", 60) == (0, built)
    assert intact(built) and built.read_bytes() == whole and ctypes.CDLL(str(built)).k() == 7
    (tmp_path / "cache" / (built.name + ".sha256")).unlink()  # no digest (a cache from before): built again
    assert cached_build(cc, "k", src, args, tmp_path / "cache", 60) == (0, built) and intact(built)


def test_a_compiler_that_writes_nothing_has_built_nothing(tmp_path):
    from pantheon_ocr.engine.backends.compiled import Compiler, cached_build

    src = tmp_path / "k.c"
    src.write_text("int k(void) { return 7; }\n")
    said = cached_build(Compiler("true", "/bin/true", ""), "k", src, [["-shared", str(src)]], tmp_path / "cache", 60)
    assert said == "true could not build k.c: /bin/true said it built the library but wrote nothing"
    assert list((tmp_path / "cache").iterdir()) == []


def test_the_kernel_runs_on_torchs_openmp_threads(tmp_path):
    """Built with OpenMP, the library's libgomp is the one torch loaded: its threads are torch's
    pool, not a second set waiting for the cores that torch's spinning threads hold."""
    if not can_build_here():
        pytest.skip("needs an x86-64 CPU with AVX2 and FMA and a C compiler")
    built = native.build(tmp_path)
    assert built.kernel is not None and "torch's OpenMP threads" in built.why, built.why
    maps = Path("/proc/self/maps")
    if maps.exists():  # Linux: one OpenMP runtime in the process
        gomp = {line.split()[-1] for line in maps.read_text().splitlines() if "libgomp" in line}
        assert len(gomp) == 1, gomp


def test_a_compiler_without_openmp_builds_with_threads_of_its_own(tmp_path):
    if not can_build_here():
        pytest.skip("needs an x86-64 CPU with AVX2 and FMA and a C compiler")
    cc = tmp_path / "cc-without-openmp"  # refuses -fopenmp, as Apple's clang does
    asked = tmp_path / "asked-for-openmp"
    cc.write_text(f'#!/bin/sh\nfor a in "$@"; do [ "$a" = -fopenmp ] && {{ echo x >> {asked}; '
                  'echo "unsupported option -fopenmp" >&2; exit 1; }; done\nexec cc "$@"\n')
    cc.chmod(cc.stat().st_mode | stat.S_IEXEC)
    built = native.build(tmp_path / "cache", cc=str(cc))
    assert built.kernel is not None and "no OpenMP" in built.why, built.why
    name = built.kernel.path.name
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [name, name + ".sha256"]
    again = native.build(tmp_path / "cache", cc=str(cc))  # the next start takes that build as it is
    assert again.kernel.path == built.kernel.path and asked.read_text() == "x\n"
    rng = np.random.default_rng(3)
    k, v = (rng.standard_normal((1, 2, 16, 16), dtype=np.float32) for _ in range(2))
    q = rng.standard_normal((1, 4, 16), dtype=np.float32)
    kb, vb = (to_bf16_bits(a) for a in (k, v))
    got = built.kernel(kb, vb, [0], [16], q, scale=0.25, threads=2)
    assert np.array_equal(got, native.decode_attention().kernel(kb, vb, [0], [16], q, scale=0.25, threads=2))


@pytest.mark.parametrize("kind", ["bfloat16", "int8"])
def test_the_decoder_takes_the_kernel_where_it_builds(kind):
    """A bf16 decoder decodes over its bfloat16 or int8 pool with the kernel unless its tower says
    not to; both paths agree to the bfloat16 rounding of torch's products (the kernel keeps queries
    and weights in float32 where torch rounds them to bfloat16)."""
    kernel_or_skip()
    on = load_model(LIGHTONOCR_TEXT, weights="bf16").decoder
    off = load_model(LIGHTONOCR_TEXT, weights="bf16", tower=TowerOptions(decode_kernel=False)).decoder
    assert on.torch_blocks.kernel is not None and off.torch_blocks.kernel is None
    prompt = list(range(3, 40))
    rows = []
    for d in (on, off):
        st = d.new_state(64, d.new_pool(kind))
        d.forward(st, prompt)
        rows.append(np.stack([d.forward(st, [t])[0] for t in prompt[:6]]))
    err = np.abs(rows[0] - rows[1]).max() / np.abs(rows[1]).max()
    assert 0 < err <= 2e-2


def test_the_plan_says_which_kv_cache_decode_attention_and_products_run(monkeypatch, tmp_path):
    """auto with torch weights: the KV cache auto takes, the decode and prompt attention, the products and
    the prompt's row operations, each one note (the CLI's one line shows what they chose, -v why); an explicit float32 cache has no
    attention kernel, but its steps' products are still said."""
    from pantheon_ocr.engine import loader, threads
    from pantheon_ocr.engine.backends import bf16_attention
    from pantheon_ocr.engine.backends.products import products as products_of
    from pantheon_ocr.engine.backends.rows import rows_why
    from pantheon_ocr.options import EngineOptions

    monkeypatch.setattr(loader, "_params", lambda path: 600_000_000)
    options = EngineOptions(tmp_path / "m.gguf", tmp_path / "p.gguf", weights="int8")
    built = native.decode_attention()
    _, why = loader.plan_auto(options)
    kv = "int8" if built.kernel else "bfloat16"
    products = products_of()
    prompt = bf16_attention.prompt_attention_why()
    assert [n.split(" (", 1)[0] for n in why] == [f"KV cache: {kv}", f"decode attention: {built.why.split(' (')[0]}",
                                                  f"prompt attention: {prompt.split(' (')[0]}",
                                                  f"products: {products.why.split(' (')[0]}",
                                                  f"prompt rows: {rows_why().split(' (')[0]}",
                                                  f"threads: {threads.cpu_count()}"]
    monkeypatch.setattr(native, "decode_attention", lambda: native.Built(None, "torch's products (no compiler)"))
    _, why = loader.plan_auto(options)
    assert why[:2] == ["KV cache: bfloat16 (torch's decode products read bfloat16 fastest)",
                       "decode attention: torch's products (no compiler)"]
    _, why = loader.plan_auto(EngineOptions(tmp_path / "m.gguf", tmp_path / "p.gguf", weights="int8",
                                            kv_dtype="float32"))
    assert why == [f"products: {products.why}", f"prompt rows: {rows_why()}", f"threads: {threads.cpu_count()} "
                                                                                f"({threads.cores()[1]})"]


def test_a_library_says_what_runs_in_its_place(tmp_path):
    """native.Library: a build whose `takes` function says no is refused with `lacks`; one that builds
    carries load()'s line; compiled() is one kernel per process, and why() its line."""
    if not can_build_here():
        pytest.skip("needs an x86-64 CPU with AVX2 and FMA and a C compiler")
    from pantheon_ocr.engine.backends.rows import Rows

    class Refusing(Rows):
        def __init__(self, path):
            super().__init__(path)
            self.lib = type("Lib", (), {"never": staticmethod(lambda: 0)})()

    refused = native.Library("rows", native.ROWS_SOURCE, Refusing, "row operations", "torch's", "never",
                             "the build lacks it")
    assert refused.build(tmp_path, isa="AVX2") == "torch's (the build lacks it)"
    assert refused.compiled() is None and refused.why() == "torch's (the build lacks it)"
    lib = native.Library("rows", native.ROWS_SOURCE, Rows, "row operations", "torch's", "rows_take", "no AVX-512")
    built = lib.build(tmp_path, isa="AVX2")
    assert built == "torch's (no AVX-512)"  # rows.c's passes need AVX-512: the AVX2 build says so
    if "avx512f" in cpu_flags():
        kernel = lib.compiled()
        assert kernel is lib.compiled() and lib.why() == kernel.why
        assert kernel.why.startswith(f"the compiled {native.isas_here()[0]} row operations (")
