"""A text layer of well-formed words in the wrong letters (a PDF font without a true character
map) is told from text by the order of its letters, in any language the table was counted in
and in others; `--text-layer prefer` reads such a page by OCR."""

from __future__ import annotations

import json
import random
from pathlib import Path

from fake_engine import FakeEngine, lines_pdf, md_body
from pantheon_ocr.pipeline.fallback import text_layer_problem
from pantheon_ocr.pipeline.inputs import expand_inputs
from pantheon_ocr.pipeline.letter_pairs import GIBBERISH, MIN_PAIRS, TABLE, fold, gibberish, letter_pair_score
from pantheon_ocr.pipeline.run import run_pipeline
from pantheon_ocr.pipeline.types import PipelineOptions

# Paragraphs written for this test (none from the corpus the table was counted in), in languages
# of the corpus and in others.
REAL = {
    "en": "The committee met on Tuesday to review the budget for the coming year. After a long "
          "discussion of the costs of the new building, the members agreed to postpone the decision "
          "until the engineers have finished their report on the foundations and the heating system.",
    "fr": "Le conseil municipal s'est réuni mardi pour examiner le budget de l'année prochaine. Après une "
          "longue discussion sur le coût du nouveau bâtiment, les membres ont décidé de reporter leur "
          "décision jusqu'à ce que les ingénieurs aient terminé leur rapport sur les fondations.",
    "de": "Der Ausschuss trat am Dienstag zusammen, um den Haushalt für das kommende Jahr zu prüfen. Nach "
          "einer langen Aussprache über die Kosten des neuen Gebäudes beschlossen die Mitglieder, die "
          "Entscheidung zu vertagen, bis die Ingenieure ihren Bericht über die Fundamente vorgelegt haben.",
    "pl": "Komisja zebrała się we wtorek, aby przejrzeć budżet na przyszły rok. Po długiej dyskusji o "
          "kosztach nowego budynku członkowie postanowili odłożyć decyzję do czasu, aż inżynierowie "
          "zakończą swój raport dotyczący fundamentów i systemu ogrzewania w całym budynku.",
    "fi": "Valiokunta kokoontui tiistaina käsittelemään ensi vuoden talousarviota. Pitkän keskustelun "
          "jälkeen uuden rakennuksen kustannuksista jäsenet päättivät lykätä päätöstä, kunnes insinöörit "
          "ovat saaneet valmiiksi raporttinsa perustuksista ja lämmitysjärjestelmästä.",
    "hu": "A bizottság kedden ülésezett, hogy megvizsgálja a jövő évi költségvetést. Az új épület "
          "költségeiről folytatott hosszú vita után a tagok úgy döntöttek, hogy elhalasztják a döntést, "
          "amíg a mérnökök be nem fejezik a jelentésüket az alapokról és a fűtési rendszerről.",
    "vi": "Ủy ban đã họp vào thứ Ba để xem xét ngân sách cho năm tới. Sau một cuộc thảo luận dài về chi phí "
          "của tòa nhà mới, các thành viên đã quyết định hoãn quyết định cho đến khi các kỹ sư hoàn thành "
          "báo cáo của họ về nền móng và hệ thống sưởi ấm của tòa nhà.",
    "code": "static int parse_header(struct reader *r, const char *buf, size_t len) { if (len < HEADER_SIZE) "
            "return -EINVAL; memcpy(&r->hdr, buf, sizeof r->hdr); r->offset = le32toh(r->hdr.offset); "
            "for (size_t i = 0; i < r->hdr.count; i++) { if (read_entry(r, buf + r->offset, i) != 0) "
            "goto fail; } return 0; fail: free(r->entries); return -EIO; }",
}


def shift(text: str, k: int) -> str:
    """Letters moved k places (a constant offset between a font's codes and Unicode)."""
    return "".join(chr((ord(c.lower()) - 97 + k) % 26 + 97) if c.isascii() and c.isalpha() else c for c in text)


def glyph_order(text: str) -> str:
    """Each letter replaced in order of first use by a, b, c... (a subset font's own order)."""
    order: dict[str, str] = {}
    return "".join(order.setdefault(c, "abcdefghijklmnopqrstuvwxyz"[len(order) % 26])
                   if c.isascii() and c.isalpha() else c for c in text.lower())


def test_text_in_many_languages_and_code_is_text():
    for lang, text in REAL.items():
        score, pairs = letter_pair_score(text)
        assert pairs >= MIN_PAIRS, lang
        assert score > GIBBERISH + 0.1, (lang, score)
        assert gibberish(text) is None and text_layer_problem(text) is None, lang


def test_words_in_the_wrong_letters_are_not_text():
    rng = random.Random(0)
    for lang, text in REAL.items():
        if lang == "vi":  # its letters are mostly outside a-z: garbling a-z alone leaves much of it real
            continue
        for garbled in (shift(text, 1), shift(text, 3), shift(text, 13), glyph_order(text)):
            assert gibberish(garbled) is not None, (lang, garbled[:40])
            assert "letters in an order no language has" in text_layer_problem(garbled)
        letters = list("abcdefghijklmnopqrstuvwxyz")
        rng.shuffle(letters)
        assert gibberish(text.lower().translate(str.maketrans("abcdefghijklmnopqrstuvwxyz", "".join(letters))))


def test_short_texts_and_other_scripts_are_not_judged():
    assert letter_pair_score("Wkh txduwhuob")[1] < MIN_PAIRS and gibberish("Wkh txduwhuob uhsruw") is None
    greek = "Η επιτροπή συνεδρίασε την Τρίτη για να εξετάσει τον προϋπολογισμό του επόμενου έτους. " * 3
    assert fold(greek) == [] and gibberish(greek) is None
    assert fold("Straße café naïve Ωmega x2y") == ["strasse", "cafe", "naive", "x", "y"]


def test_the_shipped_table_is_what_the_corpus_gives():
    from training.letter_pairs import build

    rows = [list(map(int, line.split())) for line in TABLE.read_text().splitlines() if not line.startswith("#")]
    assert rows == build()  # rerun `python -m training.letter_pairs` after changing the corpus


def opts(tmp_path: Path, **kw) -> PipelineOptions:
    return PipelineOptions(out_dir=tmp_path / "out", formats=("md", "jsonl"), render_workers=1, **kw)


def wrong_letters_pdf(path: Path) -> Path:
    """Page 1: a paragraph of text; page 2: the same words in letters shifted by 3."""
    words = REAL["en"].split()
    lines = [" ".join(words[i:i + 8]) for i in range(0, len(words), 8)]
    return lines_pdf(path, [lines, [shift(line, 3) for line in lines]])


def test_prefer_reads_a_page_whose_layer_is_in_the_wrong_letters(tmp_path):
    a = wrong_letters_pdf(tmp_path / "in" / "a.pdf")
    engine = FakeEngine()
    run_pipeline(expand_inputs([str(a)]), engine, opts(tmp_path, text_layer="prefer"))
    assert len(engine.prefills) == 1  # page 2 is read by OCR; page 1 keeps its layer
    records = [json.loads(r) for r in (tmp_path / "out" / "a.jsonl").read_text().splitlines()]
    assert [r["source"] for r in records] == ["text-layer", "model"]
    assert "The committee met on Tuesday" in records[0]["text"]


def test_fallback_stands_in_any_words_but_not_glyph_soup(tmp_path):
    """A failed page takes its layer whatever the order of its letters (a list of part numbers or
    Welsh scores as low as wrong letters, and is better than a hole), but glyph soup it does not."""
    a = wrong_letters_pdf(tmp_path / "in" / "a.pdf")
    summary = run_pipeline(expand_inputs([str(a)]), FakeEngine(fail_vision=lambda f: True),
                           opts(tmp_path, text_layer="fallback"))
    reasons = {f.page: f.reason for f in summary.failed_pages}
    assert all(reasons[p].endswith("(the PDF's text layer stands in)") for p in (1, 2))
    assert "The committee met on Tuesday" in md_body(tmp_path / "out" / "a.md")
    assert text_layer_problem(shift(REAL["en"], 3), min_chars=1, letter_order=False) is None
    assert "unprintable" in text_layer_problem("\x90\x03\x11\x07 \x05\x03 " * 10, min_chars=1, letter_order=False)

