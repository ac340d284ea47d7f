"""Pages read as regions: any page engine, wrapped so that each page is cut into text regions
(`segment.py`), each region is one sequence of the batched decoder, and the page's text is joined
back in reading order. The pipeline's stages see an ordinary page engine.

    engine = SegmentedEngine(engine, "lines")   # or "blocks"; "page" needs no wrapper

A page is finished when all its regions are; a blank page has no regions and reads as "".
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from PIL import Image

from ..engine.sampling import SamplingOptions
from .segment import Region, block_image, blocks, line_images, segment
from .types import SEGMENT_MODES


@dataclass
class RegionFeatures:
    """A page after the vision stage: its regions and, per region, the features of its images
    (a long line is read as several images)."""

    regions: list[Region]
    features: list[list]


class RegionGroup:
    """The sequences of one page's regions, finished together."""

    def __init__(self, regions: list[Region], seqs: list[list]):
        self.regions, self.seqs = regions, seqs

    def live(self) -> list:
        return [s for parts in self.seqs for s in parts if not s.finished]

    @property
    def finished(self) -> bool:
        return not self.live()

    @property
    def n_tokens(self) -> int:
        return sum(s.n_tokens for parts in self.seqs for s in parts)

    @property
    def finish_reason(self) -> str | None:
        if not self.finished:
            return None
        if not self.seqs:
            return "blank"
        reasons = {s.finish_reason for parts in self.seqs for s in parts}
        return next((r for r in ("max_tokens", "repetition") if r in reasons), "eos")

    def text(self) -> str:
        return join_regions(self.regions, [" ".join(s.text().strip() for s in parts) for parts in self.seqs])


def for_options(engine, segment: str | None):
    """The engine the stages run: wrapped to read regions when the options or, by default, the
    model's GGUF ask for blocks or lines."""
    mode = segment or getattr(engine, "segment", "page")
    return engine if mode == "page" else SegmentedEngine(engine, mode)


def join_regions(regions: list[Region], texts: list[str]) -> str:
    """Cells of a row joined by a space, rows by a line break, blocks by a blank line."""
    out, prev = [], None
    for r, text in zip(regions, texts):
        if prev is not None:
            out.append(" " if (r.block, r.row) == (prev.block, prev.row) else "\n" if r.block == prev.block else "\n\n")
        out.append(text)
        prev = r
    return "".join(out).strip()


class SegmentedEngine:
    """A page engine whose pages are read region by region; see the module docstring."""

    def __init__(self, engine, mode: str):
        if mode not in SEGMENT_MODES[1:]:
            raise ValueError(f"segment mode must be one of {', '.join(SEGMENT_MODES[1:])}, not {mode!r}")
        self.engine, self.mode = engine, mode
        # A model trained on lines names their height; for others (LightOnOCR reads pages) a line
        # is cropped at page resolution like a block.
        self.line_height = getattr(engine, "line_height", 0)
        self.line_width = getattr(engine, "line_width", 0) or engine.longest_edge  # wider lines go in pieces
        self.patch = getattr(engine, "patch_size", 14)
        # Pages are rendered finer than the reader's input so lines can be cut from them.
        self.longest_edge = getattr(engine, "page_edge", 0) or engine.longest_edge

    def vision(self, image: Image.Image) -> RegionFeatures:
        grey = np.asarray(image.convert("L"))
        regions, clean = segment(grey)
        if self.mode == "blocks":
            regions = blocks(regions)
        if self.mode == "lines" and self.line_height:
            images = [line_images(clean, r.box, self.line_height, self.patch, self.line_width) for r in regions]
        else:
            images = [[block_image(image, r.box)] for r in regions]
        return RegionFeatures(regions, [[self.engine.vision(im) for im in parts] for parts in images])

    def prefill(self, page: RegionFeatures, sampling: SamplingOptions) -> RegionGroup:
        seqs = [[self.engine.prefill(f, self._budget(f, sampling)) for f in parts] for parts in page.features]
        return RegionGroup(page.regions, seqs)

    def _budget(self, features, sampling: SamplingOptions) -> SamplingOptions:
        """A line of M image tokens cannot hold more than a few characters per token: capping its
        tokens stops a line that does not end from holding up its page."""
        if not (self.mode == "lines" and self.line_height) or not hasattr(features, "shape"):
            return sampling
        return replace(sampling, max_tokens=min(sampling.max_tokens, 4 * int(features.shape[0]) + 16))

    def decode_step(self, groups: list[RegionGroup]) -> None:
        live = [s for g in groups for s in g.live()]
        if live:
            self.engine.decode_step(live)
