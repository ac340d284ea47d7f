"""The reader's training code: data is reproducible, and the torch model exports to a GGUF pair
that our engine runs with the same numbers (and that reads back into torch unchanged)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("matplotlib")  # the training faces ship in matplotlib's wheel

from pantheon_ocr.engine import load_vlm  # noqa: E402
from training.charset import CHARSET, clean_text, ctc_targets  # noqa: E402
from training.data import pixels  # noqa: E402
from training.export import export  # noqa: E402
from training.fonts import HELDOUT, faces  # noqa: E402
from training.gguf_import import load_pair  # noqa: E402
from training.lines import draw_line  # noqa: E402
from training.model import Reader, ReaderConfig  # noqa: E402
from training.pages import make_page  # noqa: E402
from training.steps import Prompt, sequences  # noqa: E402
from training.tokenizer import train_vocab  # noqa: E402

TINY = ReaderConfig(v_dim=64, v_layers=2, v_heads=4, v_ff=96, dim=64, layers=2, heads=4, kv_heads=2, head_dim=16,
                    ff=96, vocab=512)


@pytest.fixture(scope="module")
def vocab():
    return train_vocab(512, n_synthetic=2000)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = Reader(TINY)
    with torch.no_grad():  # weights large enough that every stage matters
        for p in m.parameters():
            p.copy_(1 + 0.1 * torch.randn_like(p) if p.ndim == 1 else torch.randn_like(p) / p[0].numel() ** 0.5)
    return m.eval()


def test_clean_text_keeps_the_charset_only():
    assert clean_text("caf\u00e9\u00a0\u2212 1\u20092 \u4e2d x") == "café - 1 2 x"
    assert all(c in CHARSET for c in clean_text("".join(map(chr, range(0x20, 0x3000)))))
    assert ctc_targets("ab") == [ctc_targets("a")[0], ctc_targets("b")[0]] and 0 not in ctc_targets("a b")


def test_lines_are_reproducible_and_shaped_for_the_reader():
    a = draw_line(np.random.default_rng([5, 1]), "train", 28, 1400)
    b = draw_line(np.random.default_rng([5, 1]), "train", 28, 1400)
    assert a.text == b.text and a.face == b.face and np.array_equal(a.image, b.image)
    for i in range(20):
        line = draw_line(np.random.default_rng([6, i]), "heldout", 28, 1400)
        assert line.image.dtype == np.uint8 and line.image.shape[0] == 28
        assert line.image.shape[1] % 14 == 0 and 28 <= line.image.shape[1] <= 1400
        assert line.face in {f.name for f in faces('heldout')} and line.text


def test_held_out_faces_are_never_trained_on():
    train, held = {f.name for f in faces("train")}, {f.name for f in faces("heldout")}
    assert set(HELDOUT) <= held and not train & held and len(train) >= 20


def test_synthetic_page_is_a_pdf_with_its_text():
    import pypdfium2 as pdfium

    data, truth = make_page(np.random.default_rng(3))
    pdf = pdfium.PdfDocument(data)
    layer = pdf[0].get_textpage().get_text_range()
    assert len(pdf) == 1 and truth.splitlines()[0].split()[0] in layer
    assert len(truth.splitlines()) > 10


def test_export_runs_in_the_engine_with_the_same_numbers(tmp_path, model, vocab):
    text_path, mmproj_path = export(model, vocab, tmp_path, f16=False)
    vlm = load_vlm(text_path, mmproj_path, weights="f32")
    assert vlm.hints.segment == "lines" and vlm.hints.line_height == 28
    line = draw_line(np.random.default_rng(11), "heldout", 28, 1400)
    x, widths = pixels([line.image])
    with torch.no_grad():
        tokens = model.image_tokens(x, widths)
    ours = vlm.encode_image(vlm.preprocess(line.image))
    theirs = tokens[0, :, : int(widths[0]) // 2].reshape(-1, TINY.dim).numpy()
    assert np.abs(ours - theirs).max() <= 1e-5 * np.abs(theirs).max()
    prompt = Prompt(vocab)
    ids = vocab.encode(line.text)
    assert vlm.tokenizer.encode(line.text) == ids  # the GGUF tokenizer is the trained one
    embeds, lengths, _ = sequences(model, prompt, tokens, widths, [ids])
    with torch.no_grad():
        want = model.decoder(embeds, lengths)[0].numpy()
    prompt_ids, rows = vlm.prompt_and_rows(ours)
    state = vlm.decoder.new_state()
    got = vlm.decoder.forward(state, prompt_ids + ids, embd_rows=rows, all_logits=True)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_gguf_pair_reads_back_into_torch_unchanged(tmp_path, model, vocab):
    export(model, vocab, tmp_path, f16=False)
    again, tokenizer_json = load_pair(tmp_path)
    assert again.c == model.c
    for (name, p), q in zip(model.named_parameters(), again.parameters()):
        if not name.startswith("ctc_head"):
            assert torch.equal(p, q), name
    from tokenizers import Tokenizer

    assert Tokenizer.from_str(tokenizer_json).encode("Straße 1,200 +15%").ids == vocab.encode("Straße 1,200 +15%")


def test_short_pieces_end_at_words_and_full_lines_are_unchanged():
    """--max-chars below 45 trains on the pieces a long line is read in: whole words, at most
    max_chars; the default keeps the line texts (and so the evaluation sets) of before."""
    from training.texts import sample_text

    rng = np.random.default_rng(5)
    pieces = [sample_text(rng, "train", 28) for _ in range(400)]
    assert all(0 < len(p) <= 28 for p in pieces)
    assert sum(len(p) > 20 for p in pieces) > 40  # not only single words
    # Code and synthetic lines draw the same text whatever max_chars: the piece is its start, cut
    # before a space (a single word longer than the piece is the one exception: cut hard).
    same = [(sample_text(np.random.default_rng([9, i]), "train", 28), sample_text(np.random.default_rng([9, i]), "train", 10_000))
            for i in range(400)]
    cut = [(p, full) for p, full in same if full.startswith(p) and len(full) > len(p) and " " in full[:29]]
    assert len(cut) > 20 and all(full[len(p)] == " " for p, full in cut)
    a = [sample_text(np.random.default_rng([3, i]), "heldout") for i in range(50)]
    b = [sample_text(np.random.default_rng([3, i]), "heldout", 100) for i in range(50)]
    assert a == b and max(map(len, a)) > 45


def test_contents_entries_have_dot_leaders_drawn_apart():
    """Tables of contents are trained on: a title, a dot leader (spaced as LaTeX sets it, or dots run
    together) and a page number, most within the piece; a spaced leader's dots are drawn further
    apart than a space and a dot, as LaTeX sets them, while the text keeps one space between."""
    from training.fonts import families
    from training.render import _draw_pil, draw_ink
    from training.texts import sample_text

    entries = [sample_text(np.random.default_rng([4, i]), "train", 32, "contents") for i in range(300)]
    assert all(0 < len(e) <= 32 for e in entries)
    spaced = [e for e in entries if ". . ." in e]
    assert len(spaced) > 100 and sum("...." in e and ". ." not in e for e in entries) > 30
    assert all("  " not in e for e in entries)
    assert sum(e.rsplit(" ", 1)[-1].rstrip(".").isdigit() for e in spaced) > 0.6 * len(spaced)
    assert sum(". . ." in sample_text(np.random.default_rng([6, i]), "train", 32) for i in range(2000)) > 20  # ~1.4%
    face = next(f for fam in families("train") for f in fam if f.kind == "ttf")
    leader = ". . . . . . . . . ."

    def width(ink):
        cols = np.flatnonzero(ink.max(axis=0) > 0.25)
        return int(cols[-1] - cols[0])

    one_space = width(_draw_pil(leader, face, 30, [1.0] * 9))
    drawn = [width(draw_ink(leader, face, 30, np.random.default_rng(seed))) for seed in range(40)]
    assert min(drawn) >= one_space - 2 and sum(w > 1.3 * one_space for w in drawn) > 10


def test_tex_logos_are_drawn_as_tex_sets_them():
    """LaTeX manuals print "LaTeX" and "TeX" as logos (a small raised A, a lowered E), which the text
    layer writes "LATEX", "TEX", and the reader read as "ËĘĶ" or "HTgX": prose with logos is trained
    on, drawn as logos. A logo's E hangs below the baseline, so the word stands taller than the
    same capitals set plainly, and no wider than them (the letters are kerned together)."""
    from training.fonts import families
    from training.render import _draw_pil, _logo
    from training.texts import sample_text

    assert _logo("LATEX") == ("", "LATEX", "") and _logo("pdfLATEX,") == ("pdf", "LATEX", ",")
    assert _logo("(TEX)") == ("(", "TEX", ")") and _logo("TEXT") is None and _logo("CONTEX") is None
    face = next(f for fam in families("train") for f in fam if f.kind == "ttf")

    def box(ink):
        ys, xs = np.flatnonzero(ink.max(axis=1) > 0.25), np.flatnonzero(ink.max(axis=0) > 0.25)
        return ys[-1] - ys[0], xs[-1] - xs[0]

    for word in ("LATEX", "TEX"):
        (h_logo, w_logo), (h_plain, w_plain) = (box(_draw_pil(word, face, 40, [], logos=flag)) for flag in (True, False))
        assert h_logo > h_plain + 3 and w_logo <= w_plain
    lines = [sample_text(np.random.default_rng([7, i]), "train", 32) for i in range(3000)]
    assert 20 < sum("LATEX" in t or "TEX" in t.split(" ") for t in lines) < 120  # ~1.5%


def test_footnote_marks_and_old_style_figures_are_trained_on():
    """Footnote marks after words ("indesiderati6." read "indesideratif"") and old-style figures
    (Palatino's "1.1" read "i.x", "3." read "y.") were never drawn. Prose with marks is: the mark
    raised and small, its text the digits; a face with old-style figures draws them in some lines."""
    from training.fonts import families
    from training.lines import draw_line
    from training.render import _draw_pil, old_style_figures
    from training.texts import SUP

    lines = [draw_line(np.random.default_rng([5, i]), "train", 28, 1400, max_chars=32, kind="footnotes") for i in range(30)]
    assert all(SUP not in ln.text for ln in lines) and sum(any(c.isdigit() for c in ln.text) for ln in lines) > 20
    face = next(f for fam in families("train") for f in fam if f.kind == "ttf" and old_style_figures(f))

    def top(ink):
        return int(np.flatnonzero(ink.max(axis=1) > 0.25)[0])

    assert top(_draw_pil("x" + SUP + "17", face, 40, [])) < top(_draw_pil("x17", face, 40, [])) - 2
    lining, old = (_draw_pil("1234567890", face, 40, [], features=f) for f in (None, ["onum"]))
    assert lining.shape != old.shape or not np.array_equal(lining, old)
    assert 50 < sum(old_style_figures(f) for fam in families("train") for f in fam if f.kind == "ttf") < 400


def test_a_pair_exported_again_keeps_its_tensors_and_takes_new_hints(tmp_path, model, vocab):
    """`python -m training.export PAIR_DIR OUT --line-stretch 1.12` writes the same tensors, bit
    for bit, with pantheon.reader.line_stretch added (how the shipped pair got its stretch)."""
    import gguf

    from training.export import main

    export(model, vocab, tmp_path / "a", line_width=280)
    assert main([str(tmp_path / "a"), str(tmp_path / "b"), "--line-stretch", "1.12"]) == 0
    assert main([str(tmp_path / "b"), str(tmp_path / "c")]) == 0  # keeps b's hints: 280 and 1.12
    for name in ("pantheon-reader.gguf", "mmproj-pantheon-reader.gguf"):
        a, b = (gguf.GGUFReader(tmp_path / d / name) for d in ("a", "b"))
        assert [t.name for t in a.tensors] == [t.name for t in b.tensors]
        assert all(t.tensor_type == u.tensor_type and np.array_equal(t.data, u.data) for t, u in zip(a.tensors, b.tensors))
    for d in ("b", "c"):
        vlm = load_vlm(tmp_path / d / "pantheon-reader.gguf", tmp_path / d / "mmproj-pantheon-reader.gguf")
        assert abs(vlm.hints.line_stretch - 1.12) < 1e-6 and vlm.hints.line_width == 280, d
    assert (tmp_path / "b" / "mmproj-pantheon-reader.gguf").read_bytes() == (tmp_path / "c" / "mmproj-pantheon-reader.gguf").read_bytes()
    assert load_vlm(tmp_path / "a" / "pantheon-reader.gguf", tmp_path / "a" / "mmproj-pantheon-reader.gguf").hints.line_stretch == 1.0


def test_markup_lines_are_trained_on():
    """Manuals quote LaTeX, HTML, shell and C, where the Python code corpus has few `&`, braces and
    backslashes: a tabular row's `&` was read "6", `{itemize}` "(itemize}". 3% of the lines are
    such markup, in the charset, within the piece."""
    from training.charset import CHARS
    from training.texts import sample_text

    lines = [sample_text(np.random.default_rng([8, i]), "train", 32, "markup") for i in range(400)]
    assert all(0 < len(t) <= 32 and set(t) <= set(CHARS) for t in lines)
    assert sum(" & " in t for t in lines) > 20 and sum("{" in t and "}" in t for t in lines) > 60
    assert sum(t.startswith("\\") for t in lines) > 60 and sum("<" in t and ">" in t for t in lines) > 8
    assert len(set(lines)) > 300  # made of the corpus's words, not a few fixed lines
    mixed = [sample_text(np.random.default_rng([9, i]), "train", 32) for i in range(3000)]
    assert sum(t.startswith("• ") for t in mixed) > 20  # list items of prose and others: ~1.1%; LaTeX's bullet read "·"
    assert 0.008 < sum(t.startswith(("\\begin", "\\end", "\\item", "#include", "$ ", "<")) or " & " in t
                      for t in mixed) / 3000 < 0.03  # the kinds these starts tell apart: ~1.3%


@pytest.mark.skipif(shutil.which("groff") is None, reason="groff is not installed")
def test_typeset_pieces_are_the_pipelines_crops_with_the_printed_text():
    """Pieces of a groff-typeset page (training/typeset.py) are cut by the pipeline's segmenter and
    line_pieces at the reader's width, and each one's text is what it shows: the paragraph comes
    back whole, word for word in reading order, from its pieces."""
    from training.lines import draw_line
    from training.typeset import page_pieces, typeset_pdf

    words = ("Le système de fichiers offre des répertoires, efficacement et avec différentes fonctionnalités "
             "affinées; tapez make install puis redémarrez le service, le fichier contient 1234 entrées.").split()
    pdf = typeset_pdf(".fam T\n.nr PS 11\n.nr HY 0\n.ad l\n.LP\n" + " ".join(words) + "\n")
    pieces = page_pieces(pdf, 28, 14, 280, 1.12)
    assert len(pieces) >= 4 and all(img.shape[0] == 28 and img.shape[1] % 14 == 0 and img.shape[1] <= 280
                                    for img, _ in pieces)
    assert " ".join(text for _, text in pieces).split() == words
    line = draw_line(np.random.default_rng(3), "train", 28, 280, max_chars=32, typeset=True, stretch=1.12)
    assert line.face == "groff" and 0 < len(line.text) <= 40 and line.image.shape[1] <= 280
