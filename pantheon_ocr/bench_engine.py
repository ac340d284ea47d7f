"""Engine benchmarks: prefill and decode tokens/s per storage mode, beside a bare numpy
roofline that runs the same GEMM shapes with nothing else around them."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class DecoderBench:
    model: str
    storage: str
    prefill_tokens: int
    prefill_tok_s: float
    decode_tok_s: float
    roofline_prefill_tok_s: float
    roofline_decode_tok_s: float
    load_s: float

    def row(self) -> dict:
        return asdict(self)


def matmul_shapes(decoder) -> Counter:
    """(out, in) of every projection one token goes through, with multiplicity."""
    shapes: Counter = Counter()
    for layer in decoder.layers:
        for w in vars(layer).values():
            if hasattr(w, "matmul"):
                shapes[w.shape] += 1
        if getattr(layer, "experts", None):  # each token runs n_expert_used experts
            for w in layer.experts[0]:
                shapes[w.shape] += decoder.cfg.n_expert_used
    shapes[decoder.output.shape] += 1
    return shapes


def roofline_seconds(shapes: Counter, m: int, repeats: int = 3) -> float:
    """Best-of-`repeats` time of x[m, in] @ W[out, in].T for every shape (float32 BLAS)."""
    rng = np.random.default_rng(0)
    total = 0.0
    for (out, inp), count in shapes.items():
        w = rng.standard_normal((out, inp), dtype=np.float32)
        x = rng.standard_normal((m, inp), dtype=np.float32)
        best = min(_timed(lambda: x @ w.T) for _ in range(repeats))
        total += best * count
    return total


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def bench_decoder(path, storage: str, prefill_tokens: int = 512, decode_tokens: int = 16) -> DecoderBench:
    from .engine import load_model

    t0 = time.perf_counter()
    model = load_model(path, weights=storage)
    load_s = time.perf_counter() - t0
    d = model.decoder
    ids = np.random.default_rng(1).integers(0, model.config.n_vocab, prefill_tokens).tolist()
    d.forward(d.new_state(64), ids[:32])  # warm-up: page in the map, start BLAS threads
    state = d.new_state(prefill_tokens + decode_tokens + 1)
    prefill = _timed(lambda: d.forward(state, ids))
    decode = _timed(lambda: [d.forward(state, [t]) for t in ids[:decode_tokens]])
    shapes = matmul_shapes(d)
    roof_p = roofline_seconds(shapes, prefill_tokens)
    roof_d = roofline_seconds(shapes, 1, repeats=5)
    return DecoderBench(
        model=str(path), storage=storage, prefill_tokens=prefill_tokens,
        prefill_tok_s=prefill_tokens / prefill, decode_tok_s=decode_tokens / decode,
        roofline_prefill_tok_s=prefill_tokens / roof_p, roofline_decode_tok_s=1 / roof_d, load_s=load_s,
    )
