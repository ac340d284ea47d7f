"""The compiled products (engine/backends/products.py, csrc/products.c): activation rows quantized to
int8 in blocks of 32 as the naive definition says; int8 rows, 4-, 5- and 8-bit tiles and bfloat16 rows
multiplied as float64 references of the same quantized values say; a row's bits the same alone and in
any batch, register block or thread count, in every build this CPU has; the tiles the file's own
values; and widths they cannot take refused."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf import quants  # noqa: E402

from pantheon_ocr.engine.backends import native, products  # noqa: E402
from pantheon_ocr.engine.format.torch_groups import int8_rows  # noqa: E402

from .test_native import can_build_here  # noqa: E402


def products_or_skip() -> products.Products:
    built = products.products()
    if built.kernel is None:
        assert not can_build_here(), f"the products should build on this machine: {built.why}"
        pytest.skip(built.why)
    return built.kernel


@pytest.fixture(scope="module")
def builds(tmp_path_factory) -> dict[str, products.Products]:
    """The products built for every instruction set this CPU has (native.ISAS)."""
    products_or_skip()
    root = tmp_path_factory.mktemp("products")
    built = {isa: products.build(root, isa=isa) for isa in native.isas_here()}
    assert all(b.kernel is not None for b in built.values()), [b.why for b in built.values()]
    return {isa: b.kernel for isa, b in built.items()}


def quantized(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The naive definition: each block of 32 as d = max |x| / 127 and q = round-half-even(x / d) (0
    where the block is all zero) -> (q [M, K] int, d [M, K / 32])."""
    m, k = x.shape
    xb = x.reshape(m, k // 32, 32)
    top = np.abs(xb).max(-1)
    inv = np.where(top > 0, np.float32(127) / np.where(top > 0, top, 1), 0).astype(np.float32)
    q = np.rint(xb * inv[..., None]).astype(np.int64).reshape(m, k)
    return q, (top / np.float32(127)).astype(np.float32)


def test_activations_are_quantized_as_the_definition_says():
    kernel = products_or_skip()
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((5, 96)) * rng.uniform(0.01, 100, (5, 1))).astype(np.float32)
    x[2, 32:64] = 0  # a block of zeros: d = 0, q = 0
    buf, m, k = kernel._acts(x)
    q, d = quantized(x)
    assert np.array_equal(buf[:m * k].view(np.int8).reshape(m, k), q) and np.abs(q).max() == 127
    at = -(-m * k // 64) * 64
    assert np.array_equal(buf[at:at + 4 * m * 3].view(np.float32).reshape(m, 3), d) and d[2, 1] == 0


def test_a_prompts_rows_quantize_to_the_same_bytes_in_every_build_and_thread_count(builds):
    """Many rows (past the count that takes a second thread): the vector path of an AVX-512 build and
    the scalar one of an AVX2 build write the same buffer, alone or on 2 threads, and it is the definition."""
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((300, 160)) * rng.uniform(0.01, 100, (300, 1))).astype(np.float32)
    x[7, 64:96] = 0  # a block of zeros
    x[9, :32] = np.arange(32) - 15.5  # ties: d = 127 / 127, q = x rounded half to even
    x[9, 0] = 127
    x[11, 32:64] = -x[11, 32:64]  # signs flipped: the largest magnitude negative
    q, d = quantized(x)
    bufs = []
    for kernel in builds.values():
        for threads in (1, 2):
            buf, m, k = kernel._acts(x, threads)
            assert np.array_equal(buf[:m * k].view(np.int8).reshape(m, k), q)
            bufs.append(_acts_parts(buf, m, k))
    for parts in bufs[1:]:  # q, d, d * sum(q), the lanes and the offsets
        assert all(np.array_equal(a, b) for a, b in zip(parts, bufs[0]))


def _acts_parts(buf: np.ndarray, m: int, k: int) -> list[np.ndarray]:
    """quantize_rows' buffer (csrc/products.c's acts_of) as its parts, without the padding between them."""
    up, kb, parts, at = (lambda n: -(-n // 64) * 64), k // 32, [], 0
    for size in (m * k, 4 * m * kb, 4 * m * kb, 4 * m * kb * 8, 4 * m):
        parts.append(buf[at:at + size])
        at += up(size)
    return parts


def _reference(q: np.ndarray, d: np.ndarray, w: np.ndarray) -> np.ndarray:
    """float64 sum over blocks of d[b] * (q_b . w_b) for each row of q and of w [N, K] (float64)."""
    m, k = q.shape
    per_block = np.einsum("mbi,nbi->mnb", q.reshape(m, k // 32, 32).astype(np.float64),
                          w.reshape(w.shape[0], k // 32, 32))
    return (per_block * d[:, None, :]).sum(-1)


def _close(got, want, tol=2e-6):
    assert np.abs(got - want).max() <= tol * np.abs(want).max()


@pytest.mark.parametrize("n,k", [(64, 96), (50, 576), (7, 32)])  # 50, 7: an odd row; 96 = one 64-column chunk + 32
def test_int8_rows_are_the_product_of_the_quantized_values(n, k, builds):
    rng = np.random.default_rng(n)
    qw, scale = int8_rows(rng.standard_normal((n, k)).astype(np.float32))
    x = rng.standard_normal((11, k)).astype(np.float32)
    q, d = quantized(x)
    want = _reference(q, d, qw.numpy().astype(np.float64)) * scale.float().numpy()
    for kernel in builds.values():
        _close(kernel.int8(qw, scale, torch.from_numpy(x)).numpy(), want)


def _groups_file(n: int, k: int, qtype: Q, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k)).astype(np.float32) * rng.uniform(0.1, 3, (n, 1)).astype(np.float32)
    w[:, :32] += 0.7  # a group off zero: Q4_1's / Q5_1's minimum is not -8 d / -16 d there
    raw = quants.quantize(w, qtype)
    return raw, quants.dequantize(raw, qtype).astype(np.float64)


def _unpack(tiles: np.ndarray, bits: int) -> np.ndarray:
    """Tiles back to weights d q + m [N, K] float64, by csrc/products.c's layout written out."""
    t, kb, _ = tiles.shape
    out = np.zeros((t * 16, kb * 32))
    at = {4: 256, 5: 320, 8: 512}[bits]  # d and m after the weights (and the fifth bits)
    for ti in range(t):
        for b in range(kb):
            rec = tiles[ti, b]
            d = rec[at:at + 32].view(np.float16).astype(np.float64)
            m = rec[at + 32:at + 64].view(np.float16).astype(np.float64)
            if bits == 8:  # the tile's blocks of weights (part p: each row's 4p..4p+3 as bytes), then their d
                flat = tiles[ti].reshape(-1)
                d = flat[512 * kb + 32 * b:][:32].view(np.float16).astype(np.float64)
                for p in range(8):
                    for r in range(16):
                        for i in range(4):
                            q = int(flat[512 * b + 64 * p + 4 * r + i])
                            out[16 * ti + r, 32 * b + 4 * p + i] = d[r] * q - 128 * d[r]
                continue
            for p in range(4):
                for r in range(16):
                    for i in range(4):
                        byte = rec[64 * p + 4 * r + i]
                        high = rec[256 + 4 * r + i] if bits == 5 else 0  # weight 4p+i at bit 2p, 16+4p+i at 2p+1
                        lo = (byte & 15) | ((high >> (2 * p)) & 1) << 4
                        hi = (byte >> 4) | ((high >> (2 * p + 1)) & 1) << 4
                        out[16 * ti + r, 32 * b + 4 * p + i] = d[r] * lo + m[r]
                        out[16 * ti + r, 32 * b + 16 + 4 * p + i] = d[r] * hi + m[r]
    return out


TILED = [(Q.Q4_0, 4), (Q.Q4_1, 4), (Q.Q5_0, 5), (Q.Q5_1, 5), (Q.Q8_0, 8)]


@pytest.mark.parametrize("qtype,bits", TILED)
def test_tiles_are_the_files_values(qtype, bits):
    raw, dense = _groups_file(32, 64, qtype, seed=1)
    tiles = products.pack_tiles(raw, qtype)
    assert tiles.shape == (2, 2, products.RECORDS[bits])
    assert np.array_equal(_unpack(tiles, bits), dense)
    with pytest.raises(ValueError, match="whole tiles"):
        products.pack_tiles(raw[:24], qtype)


def test_tiles_packed_a_few_rows_at_a_time_are_the_whole_packed(monkeypatch):
    """pack_tiles packs PACK_ROWS rows at a time (an embedding's temporaries stay small): the same
    bytes as packing the matrix whole."""
    raw, _ = _groups_file(80, 64, Q.Q5_1, seed=3)
    whole = products.pack_tiles(raw, Q.Q5_1)
    monkeypatch.setattr(products, "PACK_ROWS", 32)
    assert np.array_equal(products.pack_tiles(raw, Q.Q5_1), whole)


@pytest.mark.parametrize("qtype,bits", TILED)
def test_tiles_are_the_product_of_the_quantized_values(qtype, bits, builds):
    n, k = 48, 160
    raw, dense = _groups_file(n, k, qtype, seed=2)
    tiles = torch.from_numpy(products.pack_tiles(raw, qtype))
    x = np.random.default_rng(3).standard_normal((11, k)).astype(np.float32)
    q, d = quantized(x)
    want = _reference(q, d, dense)
    got = {isa: kernel.tiles(tiles, bits, n, torch.from_numpy(x)).numpy() for isa, kernel in builds.items()}
    for y in got.values():
        _close(y, want)
    # one 32-bit lane per row and the same operations per lane in every build: the same bits
    assert all(np.array_equal(y, got[native.isas_here()[0]]) for y in got.values())


def test_bfloat16_rows_are_float32_sums_of_the_rounded_values(builds):
    rng = np.random.default_rng(4)
    n, k = 40, 200  # 200: a tail past whole 32- and 16-column chunks
    w = torch.from_numpy(rng.standard_normal((n, k)).astype(np.float32)).to(torch.bfloat16)
    x = torch.from_numpy(rng.standard_normal((9, k)).astype(np.float32))
    want = x.to(torch.bfloat16).double().numpy() @ w.double().numpy().T
    for kernel in builds.values():
        _close(kernel.bf16(w, x).numpy(), want, tol=1e-5)


@pytest.mark.parametrize("which", ["int8", "q4", "q5", "q8", "bf16"])
def test_a_row_has_the_same_bits_alone_and_in_any_batch(which, builds):
    """Any number of rows (register blocks of 8, a partial one), any thread count, any position."""
    rng = np.random.default_rng(5)
    n, k = 96, 288
    if which in ("q4", "q5", "q8"):
        qtype, bits = {"q4": (Q.Q4_1, 4), "q5": (Q.Q5_0, 5), "q8": (Q.Q8_0, 8)}[which]
        raw, _ = _groups_file(n, k, qtype, seed=6)
        tiles = torch.from_numpy(products.pack_tiles(raw, qtype))
        run = lambda kern, x, t: kern.tiles(tiles, bits, n, x, threads=t)  # noqa: E731
    elif which == "int8":
        qw, scale = int8_rows(rng.standard_normal((n, k)).astype(np.float32))
        run = lambda kern, x, t: kern.int8(qw, scale, x, threads=t)  # noqa: E731
    else:
        w = torch.from_numpy(rng.standard_normal((n, k)).astype(np.float32)).to(torch.bfloat16)
        run = lambda kern, x, t: kern.bf16(w, x, threads=t)  # noqa: E731
    x = torch.from_numpy(rng.standard_normal((20, k)).astype(np.float32))
    for kernel in builds.values():
        alone = [run(kernel, x[i:i + 1], 1)[0] for i in range(20)]
        for m, threads in ((2, 2), (7, 1), (8, 2), (9, 3), (17, 2), (20, 1)):
            y = run(kernel, x[:m], threads)
            assert all(torch.equal(y[i], alone[i]) for i in range(m)), (which, m, threads)
        y = run(kernel, x.flip(0), 2)
        assert all(torch.equal(y[19 - i], alone[i]) for i in range(20))


def test_widths_that_are_not_whole_blocks_are_refused():
    kernel = products_or_skip()
    q, scale = int8_rows(np.ones((4, 40), np.float32))
    with pytest.raises(ValueError, match="whole blocks"):
        kernel.int8(q, scale, torch.ones(1, 40))
    raw, _ = _groups_file(16, 64, Q.Q4_0, seed=0)
    tiles = torch.from_numpy(products.pack_tiles(raw, Q.Q4_0))
    with pytest.raises(ValueError, match="do not take rows"):
        kernel.tiles(tiles, 4, 16, torch.ones(1, 96))
    with pytest.raises(ValueError, match="do not take rows"):
        kernel.tiles(tiles, 5, 16, torch.ones(1, 64))  # a 4-bit record is not a 5-bit one


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q5_0])
def test_a_minimum_past_float16_is_refused(qtype):
    """m = -8 d (Q4_0) or -16 d (Q5_0) is stored as float16: a scale that would overflow it is refused
    (the matrix then stays int8 rows). Q8_0's m = -128 d is made in float32 by the kernel."""
    raw, _ = _groups_file(16, 64, qtype, seed=0)
    head = products.TILE_TYPES[qtype][0] + products.WEIGHT_BYTES[products.TILE_TYPES[qtype][1]]
    blocks = raw.reshape(16, 2, head)
    blocks[3, 1, :2] = np.array([9000.0], np.float16).view(np.uint8)  # d = 9,000: -8 d and -16 d pass 65,504
    with pytest.raises(ValueError, match="too large for float16"):
        products.pack_tiles(blocks.reshape(16, -1), qtype)


def test_a_build_that_cannot_happen_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", "no-such-compiler")
    assert products.build(tmp_path).why.startswith("torch's int8 and int4 kernels (")
    monkeypatch.setattr(native, "isas_here", lambda: [])
    built = products.build(tmp_path)
    assert built.kernel is None and "AVX2" in built.why
