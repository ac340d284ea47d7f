"""Times the compiled decode attention (engine/backends/native.py) built for every instruction set
this CPU has, taking turns in one process, at the LightOnOCR-1B decoder's shapes (8 KV heads, 2
queries each, head dim 128), over int8 and bfloat16 pools: docs/benchmarks.md quotes it.

    python scripts/bench_decode_kernel.py [--positions 2336] [--batch 16,4,1] [--threads 2]

"ordinary" keys give scores of unit spread; "peaked" int8 data (scales in [0, 1), values up to 127)
spreads scores over hundreds, so far-off softmax weights times the values are subnormal: the case the
kernel's FTZ/DAZ mode is for."""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from pantheon_ocr.engine.backends import native


def pools(rng, b: int, hkv: int, cap: int, d: int):
    shape, pos = (b, hkv, cap, d), (b, hkv, cap, 1)
    k8 = np.clip(rng.standard_normal(shape) * 42, -127, 127).astype(np.int8)
    v8 = np.clip(rng.standard_normal(shape) * 42, -127, 127).astype(np.int8)
    ordinary = (np.full(pos, 3 / 127, np.float32), np.full(pos, 3 / 127, np.float32),
                0.5 + rng.random((b, hkv, 1, d), dtype=np.float32))
    wide = rng.integers(-127, 128, shape, dtype=np.int8)
    peaked = (rng.random(pos, dtype=np.float32), rng.random(pos, dtype=np.float32),
              rng.random((b, hkv, 1, d), dtype=np.float32))
    kb = (rng.standard_normal(shape, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return {"int8": (k8, v8, ordinary), "int8 peaked": (wide, wide, peaked), "bf16": (kb, kb.copy(), None)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--positions", type=int, default=2336)
    ap.add_argument("--batch", default="16,4,1")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp())
    builds = {isa: native.build(root, isa=isa) for isa in native.isas_here()}
    for isa, b in builds.items():
        print(f"{isa}: {b.why}")
    builds = {isa: b.kernel for isa, b in builds.items() if b.kernel is not None}
    hkv, g, d, n = 8, 2, 128, args.positions
    rng = np.random.default_rng(0)
    for b in (int(x) for x in args.batch.split(",")):
        q = rng.standard_normal((b, hkv * g, d), dtype=np.float32)
        data, times = pools(rng, b, hkv, n, d), {}
        for _ in range(args.rounds):
            for isa, kernel in builds.items():
                for kind, (k, v, scales) in data.items():
                    t = time.perf_counter()
                    for _ in range(10):
                        kernel(k, v, list(range(b)), [n] * b, q, scale=d ** -0.5, threads=args.threads, scales=scales)
                    times.setdefault((kind, isa), []).append((time.perf_counter() - t) / 10 * 1e3)
        for (kind, isa), ts in sorted(times.items()):
            print(f"B = {b:2d}, {n} positions, {kind:11s} {isa:8s} median {np.median(ts):7.2f} ms a call "
                  f"(min {min(ts):.2f}; x 28 layers {28 * np.median(ts):.1f} ms a step)")


if __name__ == "__main__":
    main()
