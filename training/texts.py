"""Text lines to render: spans of real prose and code from the corpus, and synthetic document text
(numbers, amounts, dates, table rows, headings, list items, identifiers, accented words).

Every draw takes a numpy Generator, so a sample is a pure function of its seed.
"""

from __future__ import annotations

import lzma
from functools import lru_cache
from pathlib import Path

import numpy as np

from .charset import clean_text

CORPUS = Path(__file__).resolve().parent / "corpus"

# Words with the accents of the Western European languages (a hand-made list, not from a source).
ACCENTED = (
    "café naïve élève Straße über Mädchen año niño façade déjà résumé crème brûlée São Köln Zürich Ångström "
    "garçon cœur œuvre fiancée Málaga Bogotá Düsseldorf München Göteborg Århus Ørsted Perú señor mañana "
    "können Größe Fußball Grüße schön für Äpfel Öl Übung Æsop naïveté coöperate Noël Zoë Chloé Renée "
    "hôtel forêt château île côte août où là-bas préféré étudiant économie réunion Québec Montréal "
    "português açúcar pão coração informação São Paulo Lisboa Málaga corazón canción jalapeño piñata "
    "Ibáñez Muñoz González Pérez Sánchez Gómez Martínez Jiménez Hernández Álvarez Ñandú Ærø Søren Bjørn "
    "Kierkegaard Dvořák Brontë Saint-Étienne Besançon Nîmes Orléans Besòs Girona Tromsø Hämeenlinna "
    "Jyväskylä Åland Reykjavík Þingvellir Guðrún"
).split()
FIRST = "Anna Ben Clara David Emma Felix Greta Hugo Ines Jonas Karin Louis Marta Nils Olga Paul Rosa Sven Tara".split()
LAST = tuple("Smith Müller Martin García Rossi Dubois Jensen Novak Silva Fischer Moreau Costa Weber Bauer Laurent".split())
MONTHS = "January February March April May June July August September October November December".split()
UNITS = "kg g km m cm mm h min s ms kWh MB GB % kEUR EUR USD pcs".split()
CURRENCY = ("$", "€", "£", "EUR ", "USD ", "CHF ")
BULLETS = ("•", "-", "*", "–", "·", "»")
HEAD_WORDS = ("Summary", "Introduction", "Results", "Outlook", "Notes", "Methods", "Appendix", "Overview",
              "Background", "Discussion", "Conclusion", "Revenue", "Costs", "Contents", "References", "Table",
              "Figure", "Chapter", "Section", "Invoice", "Contract", "Terms", "Payment", "Delivery")


@lru_cache(maxsize=None)
def corpus(name: str) -> tuple[str, ...]:
    return tuple(lzma.decompress((CORPUS / f"{name}.txt.xz").read_bytes()).decode("utf-8").splitlines())


def _span(rng: np.random.Generator, items: tuple[str, ...], length: int) -> str:
    """A run of whole words of about `length` characters from a random item."""
    words = items[rng.integers(len(items))].split(" ")
    start = int(rng.integers(len(words)))
    out, n = [], 0
    for w in words[start:]:
        if out and n + 1 + len(w) > length:
            break
        out.append(w)
        n += len(w) + (1 if n else 0)
    return " ".join(out)


def _number(rng: np.random.Generator) -> str:
    kind = rng.integers(8)
    if kind == 0:
        return str(int(rng.integers(0, 100)))
    if kind == 1:
        return f"{int(rng.integers(0, 10**6)):,}"
    if kind == 2:
        return f"{rng.uniform(0, 10**rng.integers(1, 6)):.2f}"
    if kind == 3:
        return f"{rng.choice(['+', '-', ''])}{int(rng.integers(0, 100))}%"
    if kind == 4:
        return f"{rng.choice(CURRENCY)}{rng.uniform(0, 10**rng.integers(1, 5)):,.2f}"
    if kind == 5:
        return f"{int(rng.integers(1, 29))} {rng.choice(MONTHS)} {int(rng.integers(1950, 2031))}"
    if kind == 6:
        return f"{int(rng.integers(1990, 2031))}-{int(rng.integers(1, 13)):02d}-{int(rng.integers(1, 29)):02d}"
    return f"{rng.uniform(0, 1000):.{rng.integers(1, 4)}f} {rng.choice(UNITS)}"


def _word(rng: np.random.Generator) -> str:
    items = corpus("prose-train")
    words = [w for w in items[rng.integers(len(items))].split(" ") if w.isalpha()]
    return words[rng.integers(len(words))] if words else "text"


def _synthetic(rng: np.random.Generator, split: str) -> str:
    prose = corpus(f"prose-{split}")
    kind = rng.integers(10)
    if kind == 0:  # a table row: a label and numbers (rendered with wide gaps)
        return " ".join([_span(rng, prose, int(rng.integers(4, 20)))] + [_number(rng) for _ in range(rng.integers(1, 5))])
    if kind == 1:  # a numbered or plain heading
        head = f"{rng.choice(HEAD_WORDS)} {int(rng.integers(1, 20))}" if rng.random() < 0.5 else _span(rng, prose, int(rng.integers(8, 40))).title()
        prefix = rng.choice(["", f"{int(rng.integers(1, 12))}. ", f"{int(rng.integers(1, 9))}.{int(rng.integers(1, 9))} "])
        return prefix + head + (f": {_span(rng, prose, int(rng.integers(8, 40)))}" if rng.random() < 0.3 else "")
    if kind == 2:  # a list item
        mark = rng.choice(BULLETS + (f"{int(rng.integers(1, 20))}.", f"{int(rng.integers(1, 20))})", "a)", "(i)"))
        return f"{mark} {_span(rng, prose, int(rng.integers(10, 80)))}"
    if kind == 3:  # invoice / form line
        item = _span(rng, prose, int(rng.integers(8, 35)))
        return rng.choice([f"{int(rng.integers(1, 20))} x {item} {_number(rng)}", f"{item.split(' ')[0].title()}: {_number(rng)}",
                           f"Total due: {_number(rng)}", f"Invoice No. {int(rng.integers(2000, 2031))}-{int(rng.integers(0, 10**4)):04d}",
                           f"Date: {_number(rng)}", f"Page {int(rng.integers(1, 50))} of {int(rng.integers(50, 99))}"])
    if kind == 4:  # people, places, contact details
        name = f"{rng.choice(FIRST)} {rng.choice(LAST + tuple(ACCENTED[-20:]))}"
        return rng.choice([name, f"{name}, {rng.choice(ACCENTED)} {int(rng.integers(1000, 99999))}",
                           f"{name.lower().replace(' ', '.')}@example.{rng.choice(['com', 'org', 'de', 'fr'])}",
                           f"Tel. +{int(rng.integers(1, 99))} {int(rng.integers(10, 999))} {int(rng.integers(1000, 99999))}",
                           f"https://www.{_word(rng).lower()}.org/{_word(rng).lower()}/{int(rng.integers(1, 999))}"])
    if kind == 5:  # accented words inside prose
        words = _span(rng, prose, int(rng.integers(20, 80))).split(" ")
        for _ in range(rng.integers(1, 4)):
            words.insert(int(rng.integers(len(words) + 1)), str(rng.choice(ACCENTED)))
        return " ".join(words)
    if kind == 6:  # numbers and identifiers
        return " ".join(_number(rng) for _ in range(rng.integers(1, 7)))
    if kind == 7:  # single words and short fragments (page numbers, labels)
        return rng.choice([str(int(rng.integers(1, 400))), _word(rng), _word(rng).upper(), f"({_word(rng)})"])
    if kind == 8:  # capitals and punctuation-heavy text
        return _span(rng, prose, int(rng.integers(10, 60))).upper()
    return "".join(chr(int(c)) for c in rng.integers(33, 127, rng.integers(3, 16)))  # random ASCII


def sample_text(rng: np.random.Generator, split: str = "train", max_chars: int = 100) -> str:
    """One line of text: 55% prose, 10% code, 35% synthetic; cleaned to the charset."""
    r = rng.random()
    if r < 0.55:
        u = rng.random()
        if max_chars >= 45:
            length = int(rng.integers(1, 15) if u < 0.1 else rng.integers(15, 45) if u < 0.4 else rng.integers(45, max_chars))
        else:  # short pieces, as a long line is read in (pantheon.reader.line_width)
            length = int(rng.integers(1, max_chars + 1))
        text = _span(rng, corpus(f"prose-{split}"), length)
    elif r < 0.65:
        items = corpus(f"code-{split}")
        text = items[rng.integers(len(items))]
    else:
        text = _synthetic(rng, split)
    text = clean_text(text)
    if len(text) > max_chars:
        head = text[: max_chars + 1]
        cut = head.rsplit(" ", 1)[0] if max_chars < 45 and " " in head else ""  # short pieces end at a word
        text = cut if cut.strip() else text[:max_chars]
    text = text.strip()
    return text or "."
