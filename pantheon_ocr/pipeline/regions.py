"""Pages read as regions: any page engine, wrapped so that each page is cut into text regions
(`segment.py`), each region is one sequence of the batched decoder, and the page's text is joined
back in reading order. The pipeline's stages see an ordinary page engine.

    engine = SegmentedEngine(engine, "lines")   # or "blocks"; "page" needs no wrapper

A page is finished when all its regions are; a blank page has no regions and reads as "".
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import numpy as np
from PIL import Image

from ..errors import OptionError
from ..options import SEGMENT_MODES, SamplingOptions
from .pieces import join_pieces, line_pieces, piece_joins
from .segment import Region, block_image, blocks, segment
from .types import PageEngine, Seq

log = logging.getLogger(__name__)

# Sequences whose prompt chunk goes into one prefill forward: a page of line pieces (often 50-150
# short prompts) joins in a few steps, each short enough that the pages already decoding do not
# wait long for their next token.
PREFILL_GROUP = 64
# A block of at least this many lines, read at a mean log-probability below this a token, and
# with fewer letters than this share of its characters, is a picture's texture (RegionGroup._noise).
NOISE_LINES = 3
NOISE_LOGPROB = -0.5
NOISE_LETTERS = 0.6


@dataclass
class RegionFeatures:
    """A page after the vision stage: its regions and, per region, the features of its images
    (a long line is read as several images)."""

    regions: list[Region]
    features: list[list]
    joins: list[list[str]] | None = None  # per region, what goes between its pieces' texts (pieces.piece_joins); None: spaces


class RegionGroup:
    """The sequences of one page's regions, finished together: a Seq to the pipeline."""

    def __init__(self, regions: list[Region], seqs: list[list[Seq]], joins: list[list[str]] | None = None):
        self.regions, self.seqs = regions, seqs
        self.joins = joins or [[" "] * (len(parts) - 1) for parts in seqs]

    def parts(self) -> list[Seq]:
        return [s for parts in self.seqs for s in parts]

    def live(self) -> list[Seq]:
        return [s for s in self.parts() if not s.finished and not s.prefilling]

    @property
    def prefilling(self) -> bool:
        return any(s.prefilling for s in self.parts())

    @property
    def finished(self) -> bool:
        return all(s.finished for s in self.parts())

    @property
    def n_tokens(self) -> int:
        return sum(s.n_tokens for s in self.parts())

    @property
    def finish_reason(self) -> str | None:
        if not self.finished:
            return None
        if not self.seqs:
            return "blank"
        reasons = {s.finish_reason for s in self.parts()}
        return next((r for r in ("max_tokens", "repetition") if r in reasons), "eos")

    @property
    def logprob(self) -> float:
        return sum(s.logprob for s in self.parts())

    def text(self) -> str:
        texts = [join_pieces([s.text().strip() for s in parts], joins) for parts, joins in zip(self.seqs, self.joins)]
        noise = self._noise(texts)
        keep = [i not in noise for i in range(len(self.regions))]
        return join_regions([r for r, k in zip(self.regions, keep) if k], [t for t, k in zip(texts, keep) if k])

    def _noise(self, texts: list[str]) -> set[int]:
        """The regions of blocks read as noise: a picture (a photograph, a halftone) cut into
        lines reads as lines of stray symbols the reader is unsure of, token after token. A block
        of NOISE_LINES lines or more goes when its tokens' mean log-probability is below
        NOISE_LOGPROB and under NOISE_LETTERS of its characters are letters of Latin-1 (ASCII's and
        the accented ones of Western languages; a Polish or Czech text's own are still mostly these). A line alone never
        goes (a title, a page number misread is still the page's); nor does a poor scan's text,
        read as unsure but still as letters (its words half right are worth keeping).

        Measured with the bundled reader on blocks of three lines or more: the dev set's 35 pages
        -0.01 to -0.23 a token (tables and code down to 0.28 letters); the same pages scanned badly
        (halved, blurred, noisy: CER 0.33) down to -1.7, but 0.63 letters and more but one block
        of garbage; pictures -0.51 to -1.32 and 0.07 to 0.55 letters. The pages of
        scripts/eval_pictures.py read at CER 0.013 with it, 0.318 without (stretch 12's pair). (A
        sequence stopped at max_tokens scored no end token: its block's mean comes out a little
        higher than it was, so the block is kept if anything.)"""
        by_block: dict[int, list[int]] = {}
        for i, r in enumerate(self.regions):
            by_block.setdefault(r.block, []).append(i)
        # A piece cut off a line as a picture beside it (segment._beside) is judged alone: it is
        # no line of its own, and an icon reads as a few symbols the reader is unsure of.
        groups = [[i] for i, r in enumerate(self.regions) if r.picture]
        groups += [[i for i in members if not self.regions[i].picture] for members in by_block.values()]
        noise = set()
        for members in groups:
            if len(members) < NOISE_LINES and not (len(members) == 1 and self.regions[members[0]].picture):
                continue
            seqs = [s for i in members for s in self.seqs[i]]
            tokens = sum(s.n_tokens + 1 for s in seqs)  # the end token is scored too
            chars = "".join(texts[i] for i in members).replace(" ", "")
            # Latin-1's letters only: a picture's noise also comes out as rare letters among the
            # symbols (stretch 12 read one as "Ļ_Ńæ¬×‹¬«‹«śĴæ", 0.60 letters counting those)
            letters = sum(c.isalpha() and c <= "\xff" for c in chars) / max(1, len(chars))
            if sum(s.logprob for s in seqs) / tokens < NOISE_LOGPROB and letters < NOISE_LETTERS:
                noise.update(members)
                what = "a picture beside a line" if self.regions[members[0]].picture else f"a block of {len(members)} lines"
                log.debug("%s read as a picture's noise is left out: %r", what,
                          " | ".join(texts[i] for i in members)[:120])  # -v shows what went
        return noise

    def close(self) -> None:
        for s in self.parts():
            s.close()


def for_options(engine: PageEngine, segment: str | None) -> PageEngine:
    """The engine the stages run: wrapped to read regions when the options or, by default, the
    model's GGUF ask for blocks or lines."""
    mode = segment or engine.hints.segment
    if mode == "page" and engine.hints.reads_lines:  # said before any page, not as every page's failure
        raise OptionError("segment", f"this model reads lines of text {engine.hints.line_height} px high (its GGUF "
                                     "says so), not whole pages: use lines or blocks", mode)
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
    """A page engine whose pages are read region by region; see the module docstring. It
    implements the whole PageEngine protocol over the engine it wraps."""

    def __init__(self, engine: PageEngine, mode: str):
        if mode not in SEGMENT_MODES[1:]:
            raise ValueError(f"segment mode must be one of {', '.join(SEGMENT_MODES[1:])}, not {mode!r}")
        self.engine, self.mode = engine, mode
        h = engine.hints
        # A model trained on lines names their height; for others (LightOnOCR reads pages) a line
        # is cropped at page resolution like a block. Pages are rendered finer than the reader's
        # input so lines can be cut from them.
        self.hints = replace(h, segment=mode)
        self.longest_edge = h.page_edge
        self.overlaps = engine.overlaps
        self.vision_device = engine.vision_device
        self.model = engine.model

    def vision(self, image: Image.Image) -> RegionFeatures:
        grey = np.asarray(image.convert("L"))
        regions, clean = segment(grey)
        if self.mode == "blocks":
            regions = blocks(regions)
        h = self.hints
        joins = None
        if self.mode == "lines" and h.reads_lines:
            pieces = [line_pieces(clean, r.box, h.line_height, h.patch_size, h.line_width, h.line_stretch)
                      for r in regions]
            images = [[im for _, im in parts] for parts in pieces]
            joins = [piece_joins([b for b, _ in parts]) for parts in pieces]
        else:
            images = [[block_image(image, r.box)] for r in regions]
        flat = self.engine.vision_many([im for parts in images for im in parts])
        it = iter(flat)
        return RegionFeatures(regions, [[next(it) for _ in parts] for parts in images], joins)

    def vision_many(self, images: list[Image.Image]) -> list[RegionFeatures]:
        return [self.vision(im) for im in images]

    def start_prefill(self, page: RegionFeatures, sampling: SamplingOptions) -> RegionGroup:
        seqs = [[self.engine.start_prefill(f, self._budget(f, sampling)) for f in parts] for parts in page.features]
        return RegionGroup(page.regions, seqs, page.joins)

    def prefill_steps(self, groups: list[RegionGroup]) -> None:
        """One prefill forward over the next PREFILL_GROUP region prompts of these pages."""
        pending = [s for g in groups for s in g.parts() if s.prefilling][:PREFILL_GROUP]
        if pending:
            self.engine.prefill_steps(pending)

    def prefill(self, page: RegionFeatures, sampling: SamplingOptions) -> RegionGroup:
        """A page's regions, every prompt prefilled (a page read on its own)."""
        group = self.start_prefill(page, sampling)
        while group.prefilling:
            self.prefill_steps([group])
        return group

    def _budget(self, features, sampling: SamplingOptions) -> SamplingOptions:
        """A line of M image tokens cannot hold more than a few characters per token: capping its
        tokens stops a line that does not end from holding up its page."""
        if not (self.mode == "lines" and self.hints.reads_lines):
            return sampling
        return replace(sampling, max_tokens=min(sampling.max_tokens, 4 * len(features) + 16))

    def decode_step(self, groups: list[RegionGroup]) -> None:
        live = [s for g in groups for s in g.live()]
        if live:
            self.engine.decode_step(live)
