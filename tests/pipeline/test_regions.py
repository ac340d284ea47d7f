"""Pages read as regions: SegmentedEngine over a stub engine, alone and through run_pipeline."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

from pantheon_ocr.engine.models.reader import ReadingHints
from pantheon_ocr.engine.sampling import SamplingOptions
from pantheon_ocr.errors import OptionError
from pantheon_ocr.pipeline.inputs import make_document
from pantheon_ocr.pipeline.regions import SegmentedEngine, for_options, join_regions
from pantheon_ocr.pipeline.run import run_pipeline
from pantheon_ocr.pipeline.segment import Region
from pantheon_ocr.pipeline.types import PipelineOptions
from fake_engine import WholePrompt

FONT = ImageFont.load_default(size=28)


class StubSeq:
    """Finishes after `steps` decode steps; its text says the size of the image it was given
    (width in 28-px tokens x height in px)."""

    prefilling = False
    logprob = 0.0

    def close(self):
        pass

    def __init__(self, size, max_tokens, steps=2):
        self.size, self.max_tokens, self.left = size, max_tokens, steps
        self.n_tokens, self.finished, self.finish_reason = 0, False, None

    def text(self):
        return f"{self.size[0]}x{self.size[1]}"


class StubEngine(WholePrompt):
    """A line reader: 28-px lines, pages rendered at 2200 px, 14-px patches."""

    longest_edge = 1400
    hints = ReadingHints("lines", 28, 1400, 2200, 14)
    overlaps = True
    vision_device = "cpu"
    model = "stub.gguf #0"

    def __init__(self):
        self.batches = []

    def vision(self, image):
        return np.zeros((image.width // 28, image.height), np.float32)  # [M, "features"]

    def prefill(self, features, sampling):
        if self.hints.segment == "lines":
            assert sampling.max_tokens <= 4 * features.shape[0] + 16  # a line's token budget
        return StubSeq(features.shape, sampling.max_tokens)

    def decode_step(self, seqs):
        self.batches.append(len(seqs))
        for s in seqs:
            s.left -= 1
            s.n_tokens += 1
            if s.left <= 0:
                s.finished, s.finish_reason = True, "eos"


def page_image(lines):
    img = Image.new("RGB", (1700, 2200), "white")
    d = ImageDraw.Draw(img)
    for x, y, text in lines:
        d.text((x, y), text, font=FONT, fill="black")
    return img


def read(engine, image):
    group = engine.prefill(engine.vision(image), SamplingOptions(max_tokens=4096))
    while not group.finished:
        engine.decode_step([group])
    return group


def test_join_regions_spaces_rows_and_blocks():
    regions = [Region((0, 0, 1, 1), 0, 0), Region((0, 0, 1, 1), 1, 1), Region((0, 0, 1, 1), 1, 1),
               Region((0, 0, 1, 1), 1, 2), Region((0, 0, 1, 1), 2, 3)]
    assert join_regions(regions, ["Title", "North", "1,200", "South", "end"]) == "Title\n\nNorth 1,200\nSouth\n\nend"


def test_lines_are_read_in_order_and_batched_together():
    lines = [(100, 200, "a"), (100, 260, "aaaaaa"), (100, 320, "aaaaaaaaaaaa")]
    stub = StubEngine()
    group = read(SegmentedEngine(stub, "lines"), page_image(lines))
    widths = [int(t.split("x")[0]) for t in group.text().split()]
    assert len(widths) == 3 and widths == sorted(widths) and widths[0] < widths[-1]
    assert all(t.endswith("x28") for t in group.text().split())
    assert stub.batches[0] == 3  # all the page's lines in one decode step
    assert group.finish_reason == "eos" and group.n_tokens == 6


def test_blank_page_reads_empty():
    group = read(SegmentedEngine(StubEngine(), "lines"), Image.new("RGB", (800, 1000), "white"))
    assert group.finished and group.text() == "" and group.finish_reason == "blank"


def test_blocks_mode_reads_one_region_per_paragraph():
    lines = [(100, 200, "first block line one"), (100, 245, "first block line two"), (100, 600, "second block")]
    stub = StubEngine()
    stub.hints = replace(stub.hints, segment="blocks")
    group = read(SegmentedEngine(stub, "blocks"), page_image(lines))
    texts = group.text().split("\n\n")
    assert len(texts) == 2
    assert int(texts[0].split("x")[1]) > int(texts[1].split("x")[1])  # two lines are taller than one


def test_model_default_and_override():
    stub = StubEngine()
    assert isinstance(for_options(stub, None), SegmentedEngine)
    # a reader of 28-px lines given whole pages failed each page after its vision, context exceeded
    with pytest.raises(OptionError, match="this model reads lines of text 28 px high") as e:
        for_options(stub, "page")
    assert e.value.option == "segment" and e.value.value == "page"
    stub.hints = replace(stub.hints, segment="page", line_height=0)  # a page model
    assert for_options(stub, None) is stub and for_options(stub, "page") is stub
    with pytest.raises(ValueError):
        SegmentedEngine(stub, "words")


def test_pipeline_writes_the_page_text_in_reading_order(tmp_path: Path):
    lines = [(100, 200, "a"), (100, 260, "aaaaaa"), (100, 600, "aaaaaaaaaaaa")]
    src = tmp_path / "page.png"
    page_image(lines).save(src)
    options = PipelineOptions(out_dir=tmp_path / "out", formats=("md", "jsonl"), render_workers=1)
    summary = run_pipeline([make_document(src)], StubEngine(), options, start_method="spawn")
    assert summary.exit_code == 0
    md = (tmp_path / "out" / "page.md").read_text()
    body = [ln for ln in md.splitlines() if ln and not ln.startswith("<!--")]
    assert len(body) == 3 and all(ln.endswith("x28") for ln in body)


def test_a_line_wider_than_the_readers_line_width_is_read_in_pieces_at_word_gaps():
    """The reader names the widest line it reads in one piece (pantheon.reader.line_width); a
    longer line is cut at word gaps, each piece read as its own sequence and joined by a space."""
    words = "aaaa bbbb cccc dddd eeee ffff gggg hhhh"
    engine = StubEngine()
    whole = read(SegmentedEngine(engine, "lines"), page_image([(100, 200, words)])).seqs
    assert [len(parts) for parts in whole] == [1]
    assert whole[0][0].size[0] >= 14  # the line: about 16 tokens of 28 px
    engine.hints = replace(engine.hints, line_width=196)  # 7 tokens
    group = read(SegmentedEngine(engine, "lines"), page_image([(100, 200, words)]))
    (parts,) = group.seqs
    assert len(parts) >= 3 and all(p.size[0] <= 7 for p in parts)
    assert sum(p.size[0] for p in parts) >= whole[0][0].size[0] - len(parts)  # no ink lost between pieces
    assert group.text() == " ".join(p.text() for p in parts)


def test_a_block_read_as_noise_is_left_out_and_a_lone_line_never():
    """RegionGroup.text() drops a block of three lines or more whose tokens the reader chose at a
    mean log-probability below NOISE_LOGPROB and that reads as few letters (a picture's texture);
    a line alone stays, however unsure (a misread title is still the page's), and so do a block
    read with confidence (a table of numbers) and a poor scan's text (unsure, but letters)."""
    from pantheon_ocr.pipeline.regions import NOISE_LOGPROB, RegionGroup
    from pantheon_ocr.pipeline.segment import Region

    class Scored:
        prefilling, finished, finish_reason = False, True, "eos"

        def __init__(self, text, per_token):
            self._text, self.n_tokens = text, len(text)
            self.logprob = per_token * (self.n_tokens + 1)  # the end token is scored too

        def text(self):
            return self._text

        def close(self):
            pass

    low, high = NOISE_LOGPROB * 1.2, NOISE_LOGPROB * 0.8
    blocks = [(0, ["Title", ], low * 3), (1, ["a b c", "d e f", "g h i"], high), (2, ["#~", "*.", "|-", "%"], low),
              (3, ["tail one", "tail two"], low), (4, ["Tbe scan", "rcad badly", "stil1 words"], low * 2),
              (5, ["| 1 |", "| 2 |", "| 3 |"], high), (6, ["~#|"], low * 3), (7, ["*.", "|-"], low * 3)]
    regions, seqs = [], []
    for block, texts, lp in blocks:
        for row, t in enumerate(texts):
            regions.append(Region((0, 0, 10, 10), block, row))
            seqs.append([Scored(t, lp)])
    assert RegionGroup(regions, seqs).text() == ("Title\n\na b c\nd e f\ng h i\n\ntail one\ntail two\n\n"
                                                 "Tbe scan\nrcad badly\nstil1 words\n\n| 1 |\n| 2 |\n| 3 |\n\n"
                                                 "~#|\n\n*.\n|-")


def test_a_picture_beside_a_line_is_left_out_alone_when_read_as_noise():
    """A piece segment cut off a line as a picture (an icon) is judged alone: read as a few
    symbols the reader is unsure of, it goes and the caption beside it stays; read surely (a big
    digit), or as letters, it stays. Lines of text are still never judged alone."""
    from pantheon_ocr.pipeline.regions import NOISE_LOGPROB, RegionGroup
    from pantheon_ocr.pipeline.segment import Region

    class Scored:
        prefilling, finished, finish_reason = False, True, "eos"

        def __init__(self, text, per_token):
            self._text, self.n_tokens = text, len(text)
            self.logprob = per_token * (self.n_tokens + 1)

        def text(self):
            return self._text

        def close(self):
            pass

    low, high = NOISE_LOGPROB * 2, NOISE_LOGPROB * 0.2
    rows = [[("self.__........", low, True), ("Glue selected objects", low)],  # a caption read unsurely stays
            [("8", high, True), ("Measure Area", high)],
            [("Tag", low, True), ("Break compound", high)],
            [("~#|", low)]]
    regions, seqs = [], []
    for row, cells in enumerate(rows):
        for cell in cells:
            regions.append(Region((0, 0, 10, 10), 0, row, picture=len(cell) == 3))
            seqs.append([Scored(cell[0], cell[1])])
    assert RegionGroup(regions, seqs).text() == "Glue selected objects\n8 Measure Area\nTag Break compound\n~#|"


def test_a_readers_line_stretch_draws_its_line_crops_wider():
    """A reader may ask for its line crops drawn wider than the page shows them
    (pantheon.reader.line_stretch): each line's tokens grow by that factor, and a line wider than
    line_width is still cut to fit."""
    words = "aaaa bbbb cccc dddd eeee ffff gggg hhhh"
    engine = StubEngine()
    (plain,), = read(SegmentedEngine(engine, "lines"), page_image([(100, 200, words)])).seqs
    engine.hints = replace(engine.hints, line_stretch=1.5)
    (wide,), = read(SegmentedEngine(engine, "lines"), page_image([(100, 200, words)])).seqs
    assert wide.size[1] == plain.size[1] == 28 and abs(wide.size[0] - 1.5 * plain.size[0]) <= 1
    engine.hints = replace(engine.hints, line_width=196)
    (parts,) = read(SegmentedEngine(engine, "lines"), page_image([(100, 200, words)])).seqs
    assert len(parts) >= 3 and all(p.size[0] <= 7 for p in parts)
    assert sum(p.size[0] for p in parts) >= wide.size[0] - len(parts)
