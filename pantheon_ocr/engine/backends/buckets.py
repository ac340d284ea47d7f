"""Patch-grid buckets: pad a page's pixels to a bucket grid and mask the padding out of attention,
so one fixed-shape compiled model (Core ML) serves every page whose grid fits the bucket.

Exactness: padding goes below and to the right of the real patches, so every real patch keeps
its (row, col) and therefore its 2-D RoPE angles; padded patches are masked out as attention KEYS
(they still compute as queries, and their outputs are thrown away); RMSNorm, the FFN and the
patch embedding act per patch. The 2x2 merger blocks that hold only real patches are exactly
the blocks the unpadded model keeps (an odd last real row/column is dropped either way), so the
real outputs are those of the unpadded model up to float summation order.
"""

from __future__ import annotations

import numpy as np

GRANULE = 8  # patches: a bucket side is a multiple of this (8 patches = 112 px)


def round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def max_grid_side(longest_edge: int, patch_size: int, merge: int = 2) -> int:
    """The largest patch count a preprocessed side can have, rounded up to the merge size."""
    return round_up(round_up(longest_edge, patch_size) // patch_size, merge)


def bucket_grid(h: int, w: int, *, max_side: int | None = None, granule: int = GRANULE) -> tuple[int, int]:
    """The bucket (hb, wb) >= (h, w) for a patch grid h x w: each side rounded up to `granule`,
    but never beyond `max_side` (the full-page side, e.g. 110 for 1540 px), which is itself a bucket
    side. A full Letter page (110 x 85 patches) lands in 110 x 88."""
    if h <= 0 or w <= 0:
        raise ValueError(f"empty patch grid {h}x{w}")

    def side(n: int) -> int:
        b = round_up(n, granule)
        return max(n, max_side) if max_side is not None and b > max_side else b

    return side(h), side(w)


def pad_pixels(pixels: np.ndarray, hb: int, wb: int, patch_size: int) -> np.ndarray:
    """[3, H, W] -> [3, hb*p, wb*p], zeros below and to the right."""
    c, hh, ww = pixels.shape
    out = np.zeros((c, hb * patch_size, wb * patch_size), dtype=np.float32)
    out[:, :hh, :ww] = pixels
    return out


def patch_mask(h: int, w: int, hb: int, wb: int) -> np.ndarray:
    """float32 [hb*wb]: 1 for the real patches of the h x w grid inside the hb x wb bucket, else 0."""
    m = np.zeros((hb, wb), dtype=np.float32)
    m[:h, :w] = 1.0
    return m.reshape(-1)


def merged_rows(h: int, w: int, hb: int, wb: int, merge: int = 2) -> np.ndarray:
    """Indices into the bucket's (hb//s)*(wb//s) merged tokens of the page's (h//s)*(w//s) tokens,
    in row-major order."""
    s = merge
    r, c = np.meshgrid(np.arange(h // s), np.arange(w // s), indexing="ij")
    return (r * (wb // s) + c).reshape(-1)
