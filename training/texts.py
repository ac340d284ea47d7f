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
# Labels of forms, invoices and letters in the corpus languages (a hand-made list).
FORM_LABELS = tuple("""Total|Total due|Subtotal|Amount|Invoice No.|Date|Page|Quantity|Price|Discount|Due date|Customer|
Montant|Total HT|Total TTC|Facture n°|Devis n°|Quantité|Prix|Remise|Date d'échéance|Client|Adresse|Payable à|
Summe|Gesamtbetrag|Rechnung Nr.|Datum|Menge|Preis|Rabatt|Kunde|Seite|Betreff|Importe|Factura n.º|Fecha|Cantidad|
Precio|Descuento|Cliente|Página|Totale|Fattura n.|Data|Quantità|Prezzo|Sconto|Pagina|Valor|Quantidade|Preço|
Bedrag|Factuurnummer|Aantal|Prijs|Korting|Klant|Kwota|Faktura nr|Ilość|Cena|Rabat|Částka|Faktura č.|Množství""".replace("\n", "").split("|"))
ROMAN = tuple("i ii iii iv v vi vii viii ix x xi xii xiii xiv xv xvi xvii xviii xix xx".split())
HEAD_WORDS = ("Summary", "Introduction", "Results", "Outlook", "Notes", "Methods", "Appendix", "Overview",
              "Background", "Discussion", "Conclusion", "Revenue", "Costs", "Contents", "References", "Table",
              "Figure", "Chapter", "Section", "Invoice", "Contract", "Terms", "Payment", "Delivery")


# Prose languages and their shares of the prose lines: English (training/build_corpus.py) and the
# translated manual pages (training/build_manpages.py).
LANGS = {"en": 0.30, "de": 0.13, "fr": 0.13, "es": 0.11, "it": 0.11, "nl": 0.05, "pt": 0.07, "pl": 0.06, "cs": 0.04}
MONTHS_BY_LANG = {
    "de": "Januar Februar März April Mai Juni Juli August September Oktober November Dezember",
    "fr": "janvier février mars avril mai juin juillet août septembre octobre novembre décembre",
    "es": "enero febrero marzo abril mayo junio julio agosto septiembre octubre noviembre diciembre",
    "it": "gennaio febbraio marzo aprile maggio giugno luglio agosto settembre ottobre novembre dicembre",
    "pt": "janeiro fevereiro março abril maio junho julho agosto setembro outubro novembro dezembro",
    "nl": "januari februari maart april mei juni juli augustus september oktober november december",
    "pl": "stycznia lutego marca kwietnia maja czerwca lipca sierpnia września października listopada grudnia",
    "cs": "ledna února března dubna května června července srpna září října listopadu prosince",
}


@lru_cache(maxsize=None)
def corpus(name: str) -> tuple[str, ...]:
    return tuple(lzma.decompress((CORPUS / f"{name}.txt.xz").read_bytes()).decode("utf-8").splitlines())


def prose(lang: str, split: str) -> tuple[str, ...]:
    return corpus(f"prose-{split}") if lang == "en" else corpus(f"lang-{lang}-{split}")


def _lang(rng: np.random.Generator) -> str:
    names = list(LANGS)
    return names[int(rng.choice(len(names), p=np.array(list(LANGS.values())) / sum(LANGS.values())))]


@lru_cache(maxsize=None)
def vocabulary(split: str) -> tuple[str, ...]:
    """Every distinct word of the prose of all languages: random words are drawn from it."""
    words = set()
    for lang in LANGS:
        for item in prose(lang, split):
            words.update(w.strip(".,;:()[]«»\"'!?") for w in item.split(" "))
    return tuple(sorted(w for w in words if w))


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
        amount = f"{rng.uniform(0, 10**rng.integers(1, 5)):,.2f}"
        if rng.random() < 0.5:  # the continental way: 1.234,56 or 1 234,56, the currency after
            amount = amount.replace(",", "_").replace(".", ",").replace("_", rng.choice([".", " ", ""]))
            return f"{amount} {rng.choice(['€', 'EUR', 'CHF', 'zł', 'Kč'])}"
        return f"{rng.choice(CURRENCY)}{amount}"
    if kind == 5:
        months = MONTHS if rng.random() < 0.4 else MONTHS_BY_LANG[str(rng.choice(list(MONTHS_BY_LANG)))].split()
        return f"{int(rng.integers(1, 29))}{rng.choice(['', '.'])} {rng.choice(months)} {int(rng.integers(1950, 2031))}"
    if kind == 6:
        d, m, y = int(rng.integers(1, 29)), int(rng.integers(1, 13)), int(rng.integers(1990, 2031))
        return f"{y}-{m:02d}-{d:02d}" if rng.random() < 0.5 else f"{d:02d}{rng.choice(['.', '/', '-'])}{m:02d}{rng.choice(['.', '/', '-'])}{y}"
    return f"{rng.uniform(0, 1000):.{rng.integers(1, 4)}f} {rng.choice(UNITS)}"


def _word(rng: np.random.Generator, split: str = "train") -> str:
    words = vocabulary(split)
    return words[int(rng.integers(len(words)))]


def _identifier(rng: np.random.Generator, split: str) -> str:
    """Code and system names: identifiers, options, paths, URLs, versions, e-mail addresses."""
    w = [_word(rng, split).lower() for _ in range(4)]
    a = ["".join(c for c in x if c.isascii() and c.isalnum()) or "x" for x in w]  # ASCII spellings
    pick = rng.choice
    forms = (
        lambda: "_".join(a[: rng.integers(1, 4)]) + pick(["", "()", f"({a[3]})", "_t", str(int(rng.integers(10)))]),
        lambda: "".join(x.title() for x in a[: rng.integers(2, 4)]),
        lambda: pick(["--", "-"]) + "-".join(a[: rng.integers(1, 3)]) + pick(["", "=" + a[3].upper(), f"={int(rng.integers(100))}"]),
        lambda: pick(["/usr/share/", "/etc/", "~/", "./", "C:\\", "/var/lib/"]) + "/".join(a[: rng.integers(1, 4)])
        + pick(["", ".txt", ".conf", ".tex", ".pdf", ".py", ".h"]),
        lambda: f"{pick(['https', 'http', 'ftp'])}://{pick(['www.', ''])}{a[0]}.{pick(['org', 'com', 'de', 'fr', 'it', 'es', 'net'])}"
                f"/{a[1]}{pick(['', '/', '.html', '#' + a[2]])}",
        lambda: f"{int(rng.integers(0, 10))}.{int(rng.integers(0, 30))}"
                f"{pick(['', f'.{int(rng.integers(0, 99))}', f'-{int(rng.integers(1, 9))}', 'rc1', '~beta'])}",
        lambda: f"{a[0]}{pick(['.', '_', ''])}{a[1]}@{a[2]}.{pick(['org', 'com', 'de', 'fr', 'net'])}",
        lambda: f"{a[0].upper()}_{a[1].upper()}",
        lambda: "\\" + a[0] + pick(["", "{" + w[1] + "}", "[" + a[2] + "]{" + w[3] + "}"]),
    )
    return forms[int(rng.integers(len(forms)))]()


# Letters weighted like running text, then the rest of the charset: random strings read only if
# the reader looks at every character.
_LETTERS = "etaoinshrdlcumwfgypbvkjxqz"


def _random_string(rng: np.random.Generator) -> str:
    from .charset import CHARS

    kind = rng.integers(4)
    n = int(rng.integers(2, 18))
    if kind == 0:  # any character of the charset
        pool = [c for c in CHARS if c != " "]
        return "".join(pool[int(i)] for i in rng.integers(len(pool), size=n))
    if kind == 1:  # letter soup with accents, mixed case
        pool = [c for c in CHARS if c.isalpha()]
        return "".join(pool[int(i)] for i in rng.integers(len(pool), size=n))
    if kind == 2:  # pronounceable nonsense words
        p = np.array([1 / (i + 3) for i in range(len(_LETTERS))])
        words = ["".join(_LETTERS[int(i)] for i in rng.choice(len(_LETTERS), size=int(rng.integers(2, 9)), p=p / p.sum()))
                 for _ in range(int(rng.integers(1, 5)))]
        return " ".join(w.title() if rng.random() < 0.2 else w for w in words)
    return "".join(chr(int(c)) for c in rng.integers(33, 127, n))  # random ASCII


def _shuffled_words(rng: np.random.Generator, split: str, length: int) -> str:
    """Words of all languages in random order: no language model can guess the next one."""
    out, n = [], 0
    while n < length:
        w = _word(rng, split)
        w = w.upper() if rng.random() < 0.05 else w.title() if rng.random() < 0.1 else w
        out.append(w)
        n += len(w) + 1
    return " ".join(out)


def _synthetic(rng: np.random.Generator, split: str) -> str:
    prose_items = prose(_lang(rng), split)
    kind = rng.integers(10)
    if kind == 0:  # a table row: a label and numbers (rendered with wide gaps)
        return " ".join([_span(rng, prose_items, int(rng.integers(4, 20)))] + [_number(rng) for _ in range(rng.integers(1, 5))])
    if kind == 1:  # a numbered or plain heading
        head = f"{rng.choice(HEAD_WORDS)} {int(rng.integers(1, 20))}" if rng.random() < 0.3 else _span(rng, prose_items, int(rng.integers(8, 40)))
        head = head.title() if rng.random() < 0.3 else head
        prefix = rng.choice(["", f"{int(rng.integers(1, 12))}. ", f"{int(rng.integers(1, 9))}.{int(rng.integers(1, 9))} ",
                             f"{int(rng.integers(1, 9))}.{int(rng.integers(1, 9))}.{int(rng.integers(1, 9))} "])
        return prefix + head + (f": {_span(rng, prose_items, int(rng.integers(8, 40)))}" if rng.random() < 0.3 else "")
    if kind == 2:  # a list item
        mark = rng.choice(BULLETS + (f"{int(rng.integers(1, 20))}.", f"{int(rng.integers(1, 20))})", "a)", "(i)", "–"))
        return f"{mark} {_span(rng, prose_items, int(rng.integers(10, 80)))}"
    if kind == 3:  # invoice / form line
        item = _span(rng, prose_items, int(rng.integers(8, 35)))
        label = str(rng.choice(FORM_LABELS))
        colon = str(rng.choice([": ", " : ", " ", ":\u00a0"]))
        return rng.choice([f"{int(rng.integers(1, 20))} x {item} {_number(rng)}", f"{item.split(' ')[0].title()}{colon}{_number(rng)}",
                           f"{label}{colon}{_number(rng)}", f"{label}{colon}{_span(rng, prose_items, int(rng.integers(3, 20)))}",
                           f"{label} {int(rng.integers(2000, 2031))}-{int(rng.integers(0, 10**4)):04d}",
                           f"{label} {int(rng.integers(1, 50))} / {int(rng.integers(50, 99))}",
                           f"N° {int(rng.integers(1, 10**5))}", f"{item} ........ {int(rng.integers(1, 400))}"])
    if kind == 4:  # people, places, contact details
        name = f"{rng.choice(FIRST)} {rng.choice(LAST + tuple(ACCENTED[-20:]))}"
        return rng.choice([name, f"{name}, {rng.choice(ACCENTED)} {int(rng.integers(1000, 99999))}",
                           f"{int(rng.integers(1, 200))} {rng.choice(['rue', 'Rue de la', 'Via', 'Calle', 'Straße', 'Avenida', 'ul.'])} {_word(rng, split).title()}",
                           f"Tel. +{int(rng.integers(1, 99))} {int(rng.integers(10, 999))} {int(rng.integers(1000, 99999))}",
                           _identifier(rng, split)])
    if kind == 5:  # accented words inside prose
        words = _span(rng, prose_items, int(rng.integers(20, 80))).split(" ")
        for _ in range(rng.integers(1, 4)):
            words.insert(int(rng.integers(len(words) + 1)), str(rng.choice(ACCENTED)))
        return " ".join(words)
    if kind == 6:  # numbers and identifiers
        return " ".join(_number(rng) if rng.random() < 0.6 else _identifier(rng, split) for _ in range(rng.integers(1, 6)))
    if kind == 7:  # single words and short fragments (page numbers, labels)
        return rng.choice([str(int(rng.integers(1, 400))), _word(rng, split), _word(rng, split).upper(), f"({_word(rng, split)})",
                           _identifier(rng, split)])
    if kind == 8:  # capitals and punctuation-heavy text
        return _span(rng, prose_items, int(rng.integers(10, 60))).upper()
    return " ".join(_identifier(rng, split) for _ in range(rng.integers(1, 4)))


def _contents_entry(rng: np.random.Generator, split: str, max_chars: int) -> str:
    """A table of contents' entry: a numbered title, a dot leader and a page number, most within
    max_chars. LaTeX's leaders are spaced dots (". . ."; render.draw_ink draws them wider apart), a
    word processor's are dots run together; a long entry is read in pieces, so a third start in
    the leader."""
    a, b, c = (int(rng.integers(1, 13)) for _ in range(3))
    number = str(rng.choice(["", "", f"{a}", f"{a}.{b}", f"{a}.{b}.{c}", f"{a}.", rng.choice(ROMAN[:12]) + ".",
                             f"{rng.choice(HEAD_WORDS)} {a}"]))
    page = str(rng.choice(ROMAN)) if rng.random() < 0.1 else str(int(rng.integers(1, 600)))
    spaced = rng.random() < 0.7
    if rng.random() < 0.35:
        head, glue = "", " "
    else:
        title = _span(rng, prose(_lang(rng), split), int(rng.integers(4, max(5, max_chars - 8))))
        title = title.title() if rng.random() < 0.2 else title
        head = f"{number} {title}".strip()
        glue = "" if not spaced and rng.random() < 0.5 else " "
    room = max_chars - len(head) - len(page) - 2 if rng.random() < 0.8 else 80
    dots = int(rng.integers(2, max(3, room // (2 if spaced else 1) + 1)))
    leader = " ".join(["."] * dots) if spaced else "." * dots
    return f"{head}{glue}{leader}{glue}{page}".strip()


def _markup(rng: np.random.Generator, split: str) -> str:
    """A source line of what manuals quote besides Python: LaTeX, HTML and XML, shell commands, C,
    configuration files, JSON and Makefiles, built from the corpus's words. The code corpus is
    Python's, where `&`, braces and backslashes are rare: a tabular row's `&` was read as "6" and
    `{itemize}` as "(itemize}"."""
    w = [_word(rng, split).lower() for _ in range(4)]
    a = ["".join(c for c in x if c.isascii() and c.isalnum()) or "x" for x in w]
    pick = rng.choice
    n, words = int(rng.integers(0, 1000)), _span(rng, prose(_lang(rng), split), int(rng.integers(4, 30)))
    latex = (f"\\begin{{{pick(['tabular', 'itemize', 'enumerate', 'figure', 'verbatim', 'document', a[0]])}}}"
             + pick(["", "{" + "".join(pick(list("lcr|"), size=int(rng.integers(2, 6)))) + "}", "[h]"]),
             f"\\end{{{pick(['tabular', 'itemize', 'enumerate', 'table', a[0]])}}}",
             f"\\{pick(['section', 'subsection', 'textbf', 'emph', 'texttt', 'label', 'cite', 'ref'])}{{{words}}}",
             f"\\usepackage[{a[1]}]{{{a[0]}}}", f"\\item {words}", pick(["\\toprule", "\\midrule", "\\hline", "\\\\[2pt]"]),
             f"\\newcommand{{\\{a[0]}}}[1]{{\\{pick(['textbf', 'emph', 'mathrm'])}{{#1}}}}", f"${a[0][0]}_{{{a[1][:3]}}}^2 + {n}$")
    html = (f'<{(t := pick(["p", "div", "span", "li", "td", "h2", "b"]))} class="{a[0]}">{words}</{t}>',
            f'<a href="https://{a[0]}.org/{a[1]}.html">{w[2]}</a>', '<?xml version="1.0" encoding="UTF-8"?>',
            f"<{a[0]} {a[1]}=\"{n}\"/>", f"&lt;{a[0]}&gt; &amp; {w[1]}")
    shell = (f"$ {pick(['ls', 'grep', 'make', 'cp', 'tar', 'git', 'apt', 'gcc', 'latex'])} -{pick(list('lrvxzc'))} {a[0]}.{pick(['c', 'tex', 'txt', 'gz'])}",
             f"{a[0]} --{a[1]}={n} | grep {a[2]} > /tmp/{a[3]}.log", f'export {a[0].upper()}="$HOME/{a[1]}"',
             f"# apt install {a[0]}-{a[1]}", f"make {a[0]} && make install", f"[ -f {a[0]} ] || echo '{words}'")
    c = (f"{pick(['int', 'char *', 'void', 'static int', 'size_t'])} {a[0]}_{a[1]}({pick(['int', 'const char *'])} {a[2]});",
         f"if ({a[0]} != NULL && {a[1]}->{a[2]} > {n}) {{", f"for (i = 0; i < {n}; i++) {{", f"#include <{a[0]}.h>",
         f"#define {a[0].upper()}_{a[1].upper()} {n}", f"return {a[0]}[{a[1]}] & 0x{n:02X};", f'printf("%s: %d\\n", {a[0]}, {a[1]});', "}")
    config = (f"{a[0]} = {pick([str(n), a[1], 'true', 'false', f'/etc/{a[1]}.conf'])}", f"[{a[0]}]", f'"{a[0]}": "{w[1]}",',
              f"{a[0]}: {{ {a[1]}: {n} }}", f"{a[0].upper()}_{a[1].upper()}={n}", f"{a[0]}: {a[1]}.o {a[2]}.o",
              "\t$(CC) $(CFLAGS) -o $@ $<")
    row = " & ".join(pick([w[i], str(n), _number(rng), ""]) for i in range(int(rng.integers(2, 5)))) + pick([" \\\\", "\\\\", ""])
    group = (latex, latex, (row,), html, shell, c, config)[int(rng.integers(7))]  # tables: a row of cells
    return str(group[int(rng.integers(len(group)))])


SUP = "\u2063"  # before a footnote mark in a drawn text: render.py raises it, lines.py drops this


def _with_footnote_marks(rng: np.random.Generator, split: str, max_chars: int) -> str:
    """Prose with a footnote mark or two (a number, rarely * or †) after a word or its punctuation,
    as the page shows them; their text is the mark itself ("indesiderati6.", "end.12")."""
    words = clean_text(_span(rng, prose(_lang(rng), split), _length(rng, max_chars))).split(" ")
    for i in rng.choice(len(words), size=min(len(words), int(rng.integers(1, 3))), replace=False):
        mark = str(int(rng.integers(1, 40))) if rng.random() < 0.9 else str(rng.choice(["*", "†"]))
        word = words[i]
        core = word.rstrip(".,;:")
        words[i] = (core + SUP + mark + word[len(core):]) if rng.random() < 0.6 else word + SUP + mark
    return " ".join(words)


LOGOS = ("LATEX",) * 5 + ("TEX",) * 3 + ("pdfLATEX", "LuaLATEX", "pdfTEX", "LuaTEX")


def _with_logos(rng: np.random.Generator, split: str, max_chars: int) -> str:
    """Prose with a TeX logo or two among its words, as LaTeX manuals print them (render.py draws
    them as TeX sets them; their text is what the text layer has: "LATEX", "TEX")."""
    words = _span(rng, prose(_lang(rng), split), _length(rng, max_chars)).split(" ")
    for _ in range(rng.integers(1, 3)):
        logo = str(rng.choice(LOGOS)) + str(rng.choice(["", "", "", ",", ".", ":"]))
        words.insert(int(rng.integers(len(words) + 1)), f"({logo})" if rng.random() < 0.1 else logo)
    return " ".join(w for w in words if w)


def _length(rng: np.random.Generator, max_chars: int) -> int:
    u = rng.random()
    if max_chars >= 45:
        return int(rng.integers(1, 15) if u < 0.1 else rng.integers(15, 45) if u < 0.4 else rng.integers(45, max_chars))
    return int(rng.integers(1, max_chars + 1))  # short pieces, as a long line is read in (pantheon.reader.line_width)


def sample_text(rng: np.random.Generator, split: str = "train", max_chars: int = 100, kind: str | None = None) -> str:
    """One line of text, cleaned to the charset: 55% prose in nine languages (1.5% of all with
    footnote marks, after texts.SUP, and 1.5% with TeX logos among its words), 3% markup (LaTeX,
    HTML, shell, C, configuration files), 7% Python code, 20%
    synthetic document text (a tenth of it contents entries with dot leaders), 15% text no language
    model can predict (words of all languages in random order, random strings). `kind` forces one:
    prose, footnotes, logos, markup, code, synthetic, contents, shuffled, random."""
    if kind is None:
        r = rng.random()
        kind = ("prose" if r < 0.52 else "footnotes" if r < 0.535 else "logos" if r < 0.55 else "markup" if r < 0.58
                else "code" if r < 0.65 else "synthetic" if r < 0.83 else "contents" if r < 0.85 else "shuffled" if r < 0.93
                else "random")
    if kind == "prose":
        text = _span(rng, prose(_lang(rng), split), _length(rng, max_chars))
        if rng.random() < 0.04:  # a list item: LaTeX's bullet was read as a middle dot
            text = f"{rng.choice(('•', '•', '•') + BULLETS)} {text}"
    elif kind == "code":
        items = corpus(f"code-{split}")
        text = items[rng.integers(len(items))]
    elif kind == "markup":
        text = _markup(rng, split)
    elif kind == "synthetic":
        text = _synthetic(rng, split)
    elif kind == "footnotes":  # cleaned as drawn: the mark's SUP must stay
        text = _with_footnote_marks(rng, split, max_chars)
    elif kind == "logos":
        text = _with_logos(rng, split, max_chars)
    elif kind == "contents":
        text = _contents_entry(rng, split, max_chars)
    elif kind == "shuffled":
        text = _shuffled_words(rng, split, _length(rng, max_chars))
    elif kind == "random":
        text = " ".join(_random_string(rng) for _ in range(int(rng.integers(1, 4))))
    else:
        raise ValueError(f"unknown kind of text {kind!r}")
    text = text if kind == "footnotes" else clean_text(text)
    if len(text) > max_chars:
        head = text[: max_chars + 1]
        cut = head.rsplit(" ", 1)[0] if max_chars < 45 and " " in head else ""  # short pieces end at a word
        text = cut if cut.strip() else text[:max_chars]
    text = text.strip()
    return text or "."
