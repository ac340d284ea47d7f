"""Build pantheon_ocr/pipeline/letter_pairs.txt: log-probabilities of each letter after another,
counted in the training corpus (prose of nine languages and code, each corpus weighing the same).

    python -m training.letter_pairs          # writes the table; rerun when the corpus changes
"""

from __future__ import annotations

import math

from pantheon_ocr.pipeline.letter_pairs import ALPHABET, TABLE, letter_pairs

from .texts import CORPUS


def count(text: str) -> list[list[float]]:
    n = len(ALPHABET)
    pairs = [[0.0] * n for _ in range(n)]
    for a, b in letter_pairs(text):
        pairs[a][b] += 1
    return pairs


def build() -> list[list[int]]:
    import lzma

    n = len(ALPHABET)
    total = [[1.0] * n for _ in range(n)]  # one of each pair: none is impossible
    files = sorted(CORPUS.glob("*-train.txt.xz"))
    if not files:
        raise SystemExit(f"{CORPUS}: no *-train.txt.xz corpus files")
    for path in files:
        pairs = count(lzma.open(path, "rt", encoding="utf-8").read())
        mass = sum(map(sum, pairs))
        for r in range(n):
            for c in range(n):
                total[r][c] += pairs[r][c] / mass * 1e6
    return [[round(100 * math.log(v / sum(row))) for v in row] for row in total]


def main() -> None:
    table = build()
    head = ("# log-probability x 100 of the column's letter after the row's (' ' = a word's edge), "
            "built by training/letter_pairs.py\n#" + " ".join(f"{c:>5}" for c in ALPHABET.replace(" ", "_"))[1:] + "\n")
    TABLE.write_text(head + "\n".join(" ".join(f"{v:5d}" for v in row) for row in table) + "\n", encoding="ascii")
    print(f"wrote {TABLE}")


if __name__ == "__main__":
    main()
