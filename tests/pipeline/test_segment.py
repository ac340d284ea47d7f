"""Page segmentation: regions in reading order, rules and dust ignored, blank pages empty."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

from pantheon_ocr.pipeline.pieces import line_pieces, piece_joins
from pantheon_ocr.pipeline.segment import segment

FONT = ImageFont.load_default(size=28)


def page(lines: list[tuple[int, int, str]], size=(1700, 2200), rules=(), specks=0, seed=0) -> np.ndarray:
    """A grey page with text at (x, y), optional rules ((x0, y0, x1, y1) lines) and dust specks."""
    img = Image.new("L", size, 250)
    d = ImageDraw.Draw(img)
    for x, y, text in lines:
        d.text((x, y), text, font=FONT, fill=20)
    for r in rules:
        d.line(r, fill=30, width=3)
    a = np.asarray(img).copy()
    rng = np.random.default_rng(seed)
    for _ in range(specks):
        y, x = rng.integers(0, size[1] - 3), rng.integers(0, size[0] - 3)
        a[y: y + 2, x: x + 2] = 40
    return a


def texts_in_order(regions, lines):
    """Map each region back to the line whose box contains its centre."""
    out = []
    for r in regions:
        cx, cy = (r.box[0] + r.box[2]) / 2, (r.box[1] + r.box[3]) / 2
        hit = [t for x, y, t in lines if x - 5 <= cx <= x + 28 * len(t) and y - 5 <= cy <= y + 40]
        out.append(hit[0] if hit else None)
    return out


def test_blank_pages_have_no_regions():
    for grey in (np.full((800, 600), 255, np.uint8), np.full((800, 600), 128, np.uint8), np.zeros((800, 600), np.uint8)):
        regions, _ = segment(grey)
        assert regions == []


def test_lines_top_to_bottom_and_blocks_at_paragraph_gaps():
    lines = [(150, 200, "A heading line"), (150, 300, "first paragraph, line one"), (150, 345, "first paragraph, line two"),
             (150, 500, "second paragraph after a gap")]
    regions, _ = segment(page(lines))
    assert texts_in_order(regions, lines) == [t for _, _, t in lines]
    blocks = [r.block for r in regions]
    assert blocks[1] == blocks[2] and blocks[0] < blocks[1] < blocks[3]


def test_two_text_columns_are_read_column_by_column():
    left = [(100, 300 + 45 * i, f"left column running text {i}") for i in range(5)]
    right = [(900, 300 + 45 * i, f"right column running text {i}") for i in range(5)]
    regions, _ = segment(page(left + right))
    assert texts_in_order(regions, left + right) == [t for _, _, t in left + right]


def test_table_cells_are_read_row_by_row_and_rules_are_removed():
    rows = [["Region", "Q1", "Q2"], ["North", "1,200", "1,380"], ["South", "950", "990"]]
    lines = [(110 + 400 * c, 310 + 80 * r, cell) for r, row in enumerate(rows) for c, cell in enumerate(row)]
    rules = [(100, 300 + 80 * r, 1300, 300 + 80 * r) for r in range(4)] + [(100 + 400 * c, 300, 100 + 400 * c, 540) for c in range(4)]
    grey = page(lines, rules=rules)
    regions, clean = segment(grey)
    assert texts_in_order(regions, lines) == [t for _, _, t in lines]
    assert [r.row for r in regions] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert (clean[300, 100:1300] > 200).all()  # the rule is painted over in the paper's tone
    assert (grey[300, 100:1300] < 100).all()


def test_dust_makes_no_regions():
    lines = [(150, 300, "only this line has text")]
    regions, _ = segment(page(lines, specks=400))
    assert texts_in_order(regions, lines) == ["only this line has text"]


def test_line_images_are_line_height_and_patch_multiples():
    lines = [(150, 300, "a line of text"), (150, 400, "x" * 120)]
    grey = page(lines, size=(4000, 800))
    regions, clean = segment(grey)
    images = [im for r in regions for _, im in line_pieces(clean, r.box, 28, 14, 1400)]
    assert len(images) >= 3  # the long line is cut to fit 1400 px
    for im in images:
        assert im.height == 28 and im.width % 14 == 0 and 28 <= im.width <= 1400


def _cut_columns(pieces) -> list[tuple[int, int]]:
    """(end of a piece, start of the next) on the page, for each cut of a line."""
    return [(a[2], b[0]) for (a, _), (b, _) in zip(pieces, pieces[1:])]


def test_a_long_line_is_cut_between_letters_never_through_one():
    """A URL or a path has no word gap: it was cut through the letter at its middle, each piece
    padded into the other, so both read a part of it ("debian-priv vate@"), and their texts were
    joined by a space. It is cut between two letters, the padding there is paper, and the texts
    join without a space; a line with word gaps is cut at one, joined by a space."""
    url = "https://lists.debian.org/debian-private/archive/index.html"
    prose = "the quick brown fox jumps over the lazy dog and runs far away"
    grey = page([(150, 300, url), (150, 500, prose)], size=(2400, 800))
    regions, clean = segment(grey)
    assert len(regions) == 2
    for region, joined in zip(regions, ("", " ")):
        _, y0, _, y1 = region.box
        pieces = line_pieces(clean, region.box, 28, 14, 280)
        assert len(pieces) >= 3
        ink = (clean[y0:y1] < 128).any(axis=0)
        for end, start in _cut_columns(pieces):
            assert start > end and not ink[end:start].any()  # blank columns: no letter on both sides
        assert set(piece_joins([b for b, _ in pieces])) == {joined}
        for (box, img), (nxt, after) in zip(pieces, pieces[1:]):  # paper past the cut, not the other piece's letter
            assert np.asarray(img)[:, -2:].min() > 200 and np.asarray(after)[:, :2].min() > 200, (box, nxt)


@pytest.mark.parametrize("shape", [(1, 1), (3, 5000), (5000, 3)])
def test_degenerate_pages(shape):
    regions, _ = segment(np.full(shape, 255, np.uint8))
    assert regions == []


def test_a_page_of_two_levels_has_its_lines():
    """A 1-bit scan or a fax: black on white and nothing between. Every Otsu threshold below white
    ties there; the page once came out blank."""
    lines = [(150, 200 + 60 * i, f"bilevel scan line {i}") for i in range(4)]
    grey = np.where(page(lines) < 128, 0, 255).astype(np.uint8)
    assert set(np.unique(grey)) == {0, 255}
    regions, _ = segment(grey)
    assert texts_in_order(regions, lines) == [t for _, _, t in lines]


def test_a_dithered_picture_does_not_swallow_the_lines_under_it():
    """A 1-bit page with a dithered photo (an archive scan): the photo's tall bands once outweighed
    the lines in the page's line height, so the lines were merged several at a time and the title
    was taken for a speck."""
    lines = [(150, 100, "Annual report with a photo")] + [(150, 1000 + 60 * i, f"running text line {i}")
                                                            for i in range(8)]
    grey = page(lines)
    yy, xx = np.mgrid[0:700, 0:1300]
    photo = 128 + 110 * np.sin(xx / 90) * np.cos(yy / 70)  # light and dark areas
    grey[220:920, 200:1500] = np.asarray(Image.fromarray(photo.astype(np.uint8)).convert("1")).astype(np.uint8) * 255
    regions, _ = segment(grey)
    found = texts_in_order(regions, lines)
    assert [t for t in found if t is not None] == [t for _, _, t in lines]  # each line once, in order
    for r, t in zip(regions, found):
        if t is not None:
            assert r.box[3] - r.box[1] < 45  # one line each, not several merged


@pytest.mark.parametrize("seed", [1, 3, 4])
def test_a_speckled_page_does_not_recurse_without_end(seed):
    """5% of the pixels specks (these seeds, and a page so large its text renders a pixel high,
    once gave a line height of 1 px, cut a band at its row 0 and split the same band again and
    again: RecursionError, the page failed)."""
    rng = np.random.default_rng(seed)
    grey = np.full((1000, 1400), 255, np.uint8)
    grey[rng.random(grey.shape) < 0.05] = 0
    segment(grey)  # returns, whatever it finds


def icon_page(size: int, beside: list[str], top_aligned: bool = False) -> tuple[np.ndarray, list]:
    """An icon (a framed picture `size` px tall) at x 150, the lines `beside` it from x 150 + size + 12,
    set at its foot (an HTML manual's image bullet) or at its top (a drop cap's place)."""
    step = 45
    y_text = 300 if top_aligned else 300 + size - step * len(beside) + 8
    lines = [(150 + size + 12, y_text + step * i, t) for i, t in enumerate(beside)]
    grey = page(lines + [(150, 700, "a paragraph under it")])
    img = Image.fromarray(grey)
    d = ImageDraw.Draw(img)
    d.rectangle((150, 300, 150 + size, 300 + size), outline=20, width=3)
    d.ellipse((160, 310, 140 + size, 290 + size), fill=60)
    return np.asarray(img).copy(), lines


def test_an_icon_beside_a_line_is_cut_off_as_a_picture():
    """An icon before a caption (an HTML manual's image bullet) was cut with its line as one tall
    line, read as symbols over the whole line and the caption lost ("self.__........" for "Glue
    selected objects and make them a COMPOUND object."): the icon is now a region of its own,
    marked a picture, on the caption's row, and the caption a line of its height."""
    grey, lines = icon_page(110, ["Glue selected objects together"])
    regions, _ = segment(grey)
    icon, caption = regions[0], regions[1]
    assert icon.picture and 148 <= icon.box[0] <= 151 and icon.box[3] - icon.box[1] >= 100
    assert not caption.picture and (icon.block, icon.row) == (caption.block, caption.row)
    assert texts_in_order([caption], lines) == ["Glue selected objects together"]
    assert caption.box[3] - caption.box[1] < 45 and caption.box[0] > icon.box[2]
    assert not any(r.picture for r in regions[2:]) and len(regions) == 3


def test_a_drop_cap_or_lines_as_tall_as_the_piece_beside_them_are_not_cut():
    """A piece as tall as the lines beside it (a drop cap, a big letter set with its text) is no
    picture beside a line: nothing is marked a picture."""
    grey, _ = icon_page(80, ["first line beside the big piece", "second line beside the big piece"], top_aligned=True)
    regions, _ = segment(grey)
    assert not any(r.picture for r in regions)


def test_a_line_merged_into_a_picture_s_band_is_not_cut_off_with_it():
    """A line just above an inline picture merges into the picture's band: its first words, over
    the picture, once went with it as one "picture" (hanging below the rest of the line), and were
    lost. A picture rests on the line it stands on; one hanging below the text beside it is none."""
    grey, lines = icon_page(80, ["LEFT JUSTIFIED"])
    img = Image.fromarray(grey)
    d = ImageDraw.Draw(img)
    above = (150, 300 - 32, "Set which part of the text should be placed at the point")
    d.text(above[:2], above[2], font=FONT, fill=20)  # its descenders reach the picture's frame
    regions, _ = segment(np.asarray(img))
    assert not any(r.picture for r in regions)


DEJAVU = Path("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")  # Debian's fonts-dejavu-core


@pytest.mark.skipif(not DEJAVU.exists(), reason="DejaVu Sans is not installed (Debian: fonts-dejavu-core)")
@pytest.mark.parametrize("leading", [1.0, 1.08])
def test_lines_set_tight_are_never_a_picture(leading):
    """Lines whose accents and descenders touch (leading 1.0-1.1 in DejaVu Sans) passed for one
    solid piece two lines tall, standing above the rest: read as a picture, then dropped ("Le
    présent devis ..." came out "'recemememememe se fait à réception"). They are lines, which
    _split_tall cuts, and a picture rests on the line beside it."""
    font = ImageFont.truetype(str(DEJAVU), 28)
    img = Image.new("L", (1700, 600), 250)
    d = ImageDraw.Draw(img)
    for i, line in enumerate(["Le présent devis est valable trois mois; le paiement se fait à réception",
                              "État des lieux inclus, garantie légale de conformité",
                              "Électricité et plomberie : forfait (hors taxes)."]):
        d.text((150, 200 + int(i * 28 * leading)), line, font=font, fill=20)
    regions, _ = segment(np.asarray(img))
    assert not any(r.picture for r in regions) and len(regions) == 3


def test_a_cell_holding_lines_of_its_own_is_read_line_by_line():
    """A letterhead: a name in big type beside a three-line address. The band is as tall as the
    address; its cells were cut, and the address read as one tall line of three."""
    img = Image.new("L", (1700, 800), 250)
    d = ImageDraw.Draw(img)
    d.text((150, 270), "ACME Ltd", font=ImageFont.load_default(size=110), fill=90)
    address = [(1100, 290 + 36 * i, t) for i, t in enumerate(["Adresse", "CP Ville", "courriel@domaine.tld"])]
    for x, y, t in address:
        d.text((x, y), t, font=FONT, fill=20)
    regions, _ = segment(np.asarray(img))
    assert len(regions) == 4 and all(r.box[3] - r.box[1] < 40 for r in regions[1:])
    assert [r.row for r in regions] == sorted({r.row for r in regions})  # a row each, name first
    assert [texts_in_order([r], address)[0] for r in regions[1:]] == ["Adresse", "CP Ville", "courriel@domaine.tld"]


def contents_page(entries: list[tuple[str, str]], dot_rows: str = "baseline", spacing=(22,), seed=0) -> np.ndarray:
    """A table of contents: each title at x 150, its page number at x 1400, and specks of 3 x 3 px
    between them (a LaTeX leader's dots at a 2,200-px page are that size, and the dust filter drops
    them): on the baseline `spacing` px apart (cycled), as high as the capitals ("cap"), or
    scattered ("random")."""
    img = Image.new("L", (1700, 200 + 60 * len(entries)), 250)
    d = ImageDraw.Draw(img)
    rng = np.random.default_rng(seed)
    for i, (title, number) in enumerate(entries):
        y = 100 + 60 * i
        d.text((150, y), title, font=FONT, fill=20)
        d.text((1400, y), number, font=FONT, fill=20)
        x0, x1 = 150 + int(FONT.getlength(title)) + 20, 1380
        top, bottom = d.textbbox((150, y), "x", font=FONT)[1::2]
        if dot_rows in ("baseline", "cap"):
            xs, x, k = [], x0, 0
            while x < x1:
                xs.append(x)
                x += spacing[k % len(spacing)]
                k += 1
            ys = [bottom - 3 if dot_rows == "baseline" else top - 2] * len(xs)
        else:
            xs = sorted(rng.integers(x0, x1, 12))
            ys = rng.integers(top - 12, bottom, 12)
        for x, yy in zip(xs, ys):
            d.rectangle((int(x), int(yy), int(x) + 2, int(yy) + 2), fill=20)
    return np.asarray(img).copy()


def test_a_contents_entry_with_a_dot_leader_is_one_line():
    """LaTeX's leader dots stand ~0.8 em apart and the dust filter takes them out of the ink: the
    entries of a table of contents were cut at the leader, the page number read as a cell of its
    own and the dots lost (ltnews28's contents box lost ~240 characters). A gap filled by evenly
    spaced specks on the baseline is a leader: the entry, title to page number, is one region."""
    entries = [("Introduction", "1"), ("The new default", "12"), ("Compatibility notes", "xiv")]
    for spacing in ((22,), (15,), (30,), (22, 23)):
        regions, _ = segment(contents_page(entries, spacing=spacing))
        assert len(regions) == 3, spacing
        assert all(r.box[0] < 155 and r.box[2] > 1400 for r in regions), spacing


def test_specks_that_are_no_leader_still_part_cells():
    """Dust scattered over a gap, specks on the baseline at uneven spacing, even specks at the cap
    height, or specks lines apart are no leader: a table row's cells stay apart."""
    entries = [("Region", "1,200"), ("North", "950")]
    for seed in range(4):
        regions, _ = segment(contents_page(entries, dot_rows="random", seed=seed))
        assert len(regions) == 4, seed
        uneven = tuple(int(s) for s in np.random.default_rng(seed).integers(8, 60, 8))
        regions, _ = segment(contents_page(entries, spacing=uneven))
        assert len(regions) == 4, uneven
    for kind, spacing in (("cap", (22,)), ("baseline", (90,))):
        regions, _ = segment(contents_page(entries, dot_rows=kind, spacing=spacing))
        assert len(regions) == 4, kind
