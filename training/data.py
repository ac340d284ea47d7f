"""Batches of rendered lines, generated on the fly in worker processes, reproducible from a seed.

Sample k of stream s is a pure function of (seed, s, k); a resumed run starts new streams, so it
sees new samples. Each worker draws a pool of lines, sorts it by width and cuts it into batches,
so a batch of 28-px lines is padded to similar widths (padding costs compute, not correctness).
"""

from __future__ import annotations

import itertools

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from .charset import ctc_targets
from .lines import Line, draw_line

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def pixels(images: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 grey [H, W_i] -> normalised RGB float [B, 3, H, Wmax] (padded white), widths in patches."""
    h = images[0].shape[0]
    wmax = max(im.shape[1] for im in images)
    out = np.full((len(images), h, wmax), 255, np.uint8)
    for i, im in enumerate(images):
        out[i, :, : im.shape[1]] = im
    x = torch.from_numpy(out).float().div_(255)[:, None]  # [B, 1, H, W]
    mean = torch.tensor(CLIP_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(CLIP_STD).view(1, 3, 1, 1)
    widths = torch.tensor([im.shape[1] // 14 for im in images])
    return (x - mean) / std, widths


class LineStream(IterableDataset):
    def __init__(self, seed: int, batch: int, line_height: int, max_width: int, encode, pool: int = 8,
                 shuffle: float = 0.0, max_chars: int = 100, typeset: float = 0.0, piece_width: int = 0,
                 stretch: float = 1.0):
        self.seed, self.batch, self.h, self.w, self.encode, self.pool = seed, batch, line_height, max_width, encode, pool
        self.shuffle, self.max_chars = shuffle, max_chars
        # the share of groff-typeset pieces, cut at the reader's line width (lines.draw_line): decided here alone
        self.typeset, self.piece_width, self.stretch = typeset, piece_width or max_width, stretch

    def __iter__(self):
        info = get_worker_info()
        stream = info.id if info else 0
        for k in itertools.count():
            rng = np.random.default_rng([self.seed, stream, k])
            lines = []
            while len(lines) < self.batch * self.pool:
                try:
                    if self.typeset and rng.random() < self.typeset:
                        lines.append(draw_line(rng, "train", self.h, self.piece_width, max_chars=self.max_chars, typeset=True,
                                               stretch=self.stretch))
                    else:
                        lines.append(draw_line(rng, "train", self.h, self.w, shuffle=self.shuffle, max_chars=self.max_chars))
                except Exception as e:  # noqa: BLE001 - a rendering bug costs one sample, not the run
                    print(f"warning: a sample of stream {stream} batch {k} failed: {type(e).__name__}: {e}", flush=True)
            lines.sort(key=lambda ln: ln.image.shape[1])
            batches = [lines[i: i + self.batch] for i in range(0, len(lines), self.batch)]
            for j in rng.permutation(len(batches)):
                yield self.collate(batches[j])

    def collate(self, lines: list[Line]) -> dict:
        x, widths = pixels([ln.image for ln in lines])
        return {
            "pixels": x,
            "widths": widths,
            "texts": [ln.text for ln in lines],
            "ids": [self.encode(ln.text) for ln in lines],
            "ctc": [ctc_targets(ln.text) for ln in lines],
        }
