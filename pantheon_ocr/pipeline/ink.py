"""A page's ink: its ground made white (normalise_ground), binarised (otsu), table rules and other
long strokes taken out, dust dropped (ink_mask). What segment.py cuts into regions.
"""

from __future__ import annotations

import numpy as np


def otsu(grey: np.ndarray) -> int:
    """Otsu's threshold as ink = grey < otsu(grey). Its class 0 is the levels <= k for the k of the
    largest between-class variance, so the threshold is k + 1: on a page of two levels (a 1-bit
    scan, a fax) every k below the lighter one ties, argmax takes the darker, and `grey < k` alone
    would find no ink at all and call the page blank."""
    hist = np.bincount(grey.ravel(), minlength=256).astype(np.float64)
    p = hist / hist.sum()
    omega, mu = np.cumsum(p), np.cumsum(p * np.arange(256))
    between = (mu[-1] * omega - mu) ** 2 / np.maximum(omega * (1 - omega), 1e-12)
    return int(np.argmax(between)) + 1


def runs(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start and end (exclusive) indices of the True runs of a 1-D mask."""
    d = np.diff(np.concatenate(([0], mask.view(np.int8), [0])))
    return np.flatnonzero(d == 1), np.flatnonzero(d == -1)


def gaps(cols: np.ndarray, min_gap: float) -> list[tuple[int, int]]:
    """Runs of empty columns at least min_gap wide, not touching either edge."""
    starts, ends = runs(~cols)
    return [(s, e) for s, e in zip(starts, ends) if e - s >= min_gap and s > 0 and e < cols.size]


def _long_runs(ink: np.ndarray, min_len: int) -> np.ndarray:
    """Pixels of horizontal runs of ink at least min_len long (rows scanned as one padded line)."""
    h, w = ink.shape
    flat = np.concatenate([ink, np.zeros((h, 1), bool)], axis=1).ravel()
    starts, ends = runs(flat)
    keep = (ends - starts) >= min_len
    out = np.zeros(flat.size + 1, np.int32)
    np.add.at(out, starts[keep], 1)
    np.add.at(out, ends[keep], -1)
    return (np.cumsum(out[:-1]) > 0).reshape(h, w + 1)[:, :w]


def ink_mask(grey: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ink, rules, specks): text ink of a grey page, the long straight strokes (table rules,
    underlines, frames) taken out of it, grown by 2 px to cover their anti-aliased edges, and the
    isolated specks of a few pixels dropped from it as dust (a dot leader's dots are among them:
    segment.py looks for those)."""
    if int(grey.max()) - int(grey.min()) < 40:  # a blank or flat page: no ink
        return tuple(np.zeros(grey.shape, bool) for _ in range(3))
    ink = grey < otsu(grey)
    h, w = ink.shape
    rules = _long_runs(ink, max(40, w // 12)) | _long_runs(ink.T, max(40, h // 18)).T
    ink &= ~rules
    kept = ink & (_box_count(ink, 9) >= 12)
    return kept, _box_count(rules, 5) > 0, ink & ~kept


def _box_count(mask: np.ndarray, k: int) -> np.ndarray:
    """Number of True pixels in the k x k window around each pixel (an integral image)."""
    r = k // 2
    c = np.pad(mask.astype(np.int32), ((r + 1, r), (r + 1, r))).cumsum(0).cumsum(1)
    return c[k:, k:] - c[:-k, k:] - c[k:, :-k] + c[:-k, :-k]


GROUND_TILE = 16  # px: tiles in which the ground's tone is judged


def _box_sum(a: np.ndarray, k: int) -> np.ndarray:
    """Sum over the k x k tiles around each tile (edges padded with the edge tiles)."""
    r = k // 2
    c = np.pad(a, ((r + 1, r), (r + 1, r)) + ((0, 0),) * (a.ndim - 2), mode="edge").cumsum(0).cumsum(1)
    return c[k:, k:] - c[:-k, k:] - c[k:, :-k] + c[:-k, :-k]


def normalise_ground(grey: np.ndarray) -> np.ndarray:
    """The page with its ground made white and its ink dark, whatever their tones: text on a grey
    table header, white text on a dark title bar, coloured slide blocks. A tile's ground is the most
    common tone of the 5 x 5 tiles around it (80 px: no letter stroke fills that much), or its own
    tone where it and most of its neighbours are one flat tone (a thin band of colour). A pixel's
    ink is its distance from its tile's ground, scaled by the contrast that ground leaves room
    for; a pixel in the tone of a neighbouring tile's ground (a band's edge
    reaching into the tile) is ground. A plain white page comes back nearly unchanged."""
    h, w = grey.shape
    t = GROUND_TILE
    th, tw = -(-h // t), -(-w // t)
    padded = np.pad(grey, ((0, th * t - h), (0, tw * t - w)), mode="edge")
    bins = (padded.reshape(th, t, tw, t).transpose(0, 2, 1, 3).reshape(th * tw, t * t) >> 3).astype(np.int64)
    bins += (np.arange(th * tw) * 32)[:, None]  # one histogram of 32 tone bins per tile
    hist = np.bincount(bins.ravel(), minlength=th * tw * 32).reshape(th, tw, 32).astype(np.int32)
    wide = _box_sum(hist, 5).argmax(-1)  # [th, tw] mode bin of the 80-px neighbourhood
    own = hist.argmax(-1)
    flat = hist.max(-1) >= 0.6 * t * t  # one tone covers the tile
    agree = np.zeros((th, tw), np.int32)
    po, pf = np.pad(own, 1, mode="edge"), np.pad(flat, 1, mode="edge")
    for dy in (0, 1, 2):
        for dx in (0, 1, 2):
            agree += pf[dy:dy + th, dx:dx + tw] & (np.abs(po[dy:dy + th, dx:dx + tw] - own) <= 2)
    ground = (np.where(flat & (agree >= 5), own, wide) * 8 + 4).astype(np.int16)
    g = np.pad(ground, 1, mode="edge")
    px = padded.astype(np.int16)
    mine = np.repeat(np.repeat(ground, t, 0), t, 1)
    dist = np.abs(px - mine)
    for dy in (0, 1, 2):  # a neighbour's ground reaching into the tile (a band's edge) is ground too
        for dx in (0, 1, 2):
            near = np.abs(px - np.repeat(np.repeat(g[dy:dy + th, dx:dx + tw], t, 0), t, 1))
            np.copyto(dist, near, where=near <= 12)
    room = np.maximum(mine, 255 - mine).astype(np.float32)
    out = 255 - np.clip(dist * (255 / room), 0, 255)
    return out[:h, :w].astype(np.uint8)
