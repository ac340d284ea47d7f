"""Pages with pictures: how much of a photograph, a halftone or a texture the reader of lines
reads as text. Typesets PAGES pages (matplotlib: text above and below a picture of a kind each
page) and reads them through the pipeline with the bundled reader (or --model), with the noise
filter of pipeline/regions.py and without it; scores against each page's own text layer.

    python scripts/eval_pictures.py [--pages 10] [--model DIR] [--keep DIR]

Needs the `train` extra (matplotlib). The pictures are made here, from seeded noise: no file of
anyone's is read.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

KINDS = ["smooth", "shapes", "halftone", "texture", "portrait", "bars", "diagram"]
WORDS = ("the of and to in is that for it as with was on be by this are or from at which an not have but all can data "
         "file system value line page figure shows result table time first new each number used output input model "
         "la de et le un une des pour dans avec sur par est der die und").split()


def _field(rng, h: int, w: int, scale: float) -> np.ndarray:
    f = np.fft.ifft2(np.fft.fft2(rng.normal(size=(h, w))) /
                     (1 + np.add.outer(np.fft.fftfreq(h) ** 2, np.fft.fftfreq(w) ** 2) * scale)).real
    return (f - f.min()) / (f.max() - f.min())


def picture(rng, kind: str, h: int, w: int) -> np.ndarray:
    if kind == "smooth":  # a photograph's tones
        f = _field(rng, h, w, 3000)
        return np.stack([f, f ** 0.7, 1 - f], -1)
    if kind == "shapes":
        img = np.stack([_field(rng, h, w, 300)] * 3, -1) * 0.5 + 0.3
        yy, xx = np.mgrid[:h, :w]
        for _ in range(6):
            cy, cx, r = rng.integers(0, h), rng.integers(0, w), rng.integers(10, 60)
            img[(yy - cy) ** 2 + (xx - cx) ** 2 < r * r] = rng.random(3)
        return img
    if kind == "halftone":  # a printed photograph's dots
        f, (yy, xx), cell = _field(rng, h, w, 1000), np.mgrid[:h, :w], 6
        return (np.hypot(yy % cell - cell / 2, xx % cell - cell / 2) > f * cell * 0.7).astype(float)
    if kind == "texture":
        return np.clip(_field(rng, h, w, 20) + rng.normal(0, 0.15, (h, w)), 0, 1)
    yy, xx = np.mgrid[:h, :w]  # portrait: a head and shoulders
    img = np.full((h, w), 0.85)
    img[((yy - h * 0.4) / (h * 0.25)) ** 2 + ((xx - w / 2) / (w * 0.15)) ** 2 < 1] = 0.55
    img[((yy - h * 0.95) / (h * 0.35)) ** 2 + ((xx - w / 2) / (w * 0.35)) ** 2 < 1] = 0.25
    return np.clip(img + _field(rng, h, w, 500) * 0.2, 0, 1)


def make_pdf(path: Path, n_pages: int, seed: int = 0) -> None:
    import matplotlib

    matplotlib.use("pdf")
    import matplotlib.pyplot as plt
    from matplotlib.backends.backend_pdf import PdfPages

    rng = np.random.default_rng(seed)

    def lines(n_words: int) -> list[str]:
        out, line = [], ""
        for word in rng.choice(WORDS, n_words):
            if len(line) + len(word) + 1 > 90:
                out.append(line)
                line = word
            else:
                line = f"{line} {word}".strip()
        return out + [line]

    with PdfPages(path) as pdf:
        for k in range(n_pages):
            kind = KINDS[k % len(KINDS)]
            fig = plt.figure(figsize=(8.27, 11.69))
            y = 0.95
            for line in lines(90):
                fig.text(0.1, y, line, fontsize=10, family="serif" if k % 2 else "sans-serif")
                y -= 0.017
            top, height = y - 0.02, 0.25 + 0.1 * (k % 3)
            if kind == "bars":
                ax = fig.add_axes([0.15, top - height, 0.7, height - 0.03])
                ax.bar(["alpha", "beta", "gamma", "delta"], rng.integers(3, 20, 4))
                ax.set_ylabel("count")
            elif kind == "diagram":
                ax = fig.add_axes([0.1, top - height, 0.8, height])
                ax.axis("off")
                ax.set_xlim(0, 10)
                ax.set_ylim(0, 4)
                for i, label in enumerate(["input", "parser", "output"]):
                    ax.add_patch(plt.Rectangle((0.5 + i * 3.3, 1.5), 2.3, 1, fill=False))
                    ax.text(1.65 + i * 3.3, 2.0, label, ha="center", va="center", fontsize=11)
            else:
                width = 0.5 + 0.3 * (k % 2)
                ax = fig.add_axes([(1 - width) / 2, top - height, width, height])
                ax.axis("off")
                ax.imshow(picture(rng, kind, int(1300 * height), int(770 * width)), cmap="gray", aspect="auto",
                          interpolation="nearest")
            y = top - height - 0.03
            fig.text(0.3, y, f"Figure {k + 1}: {kind}", fontsize=10)
            y -= 0.03
            for line in lines(200):
                if y <= 0.05:
                    break
                fig.text(0.1, y, line, fontsize=10, family="serif")
                y -= 0.017
            pdf.savefig(fig)
            plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, default=10)
    ap.add_argument("--model", help="A folder with the reader's pair (default: the bundled reader).")
    ap.add_argument("--keep", help="Keep the PDF and the texts read in this folder.")
    args = ap.parse_args(argv)

    import pypdfium2 as pdfium

    import pantheon_ocr
    from pantheon_ocr.pipeline import regions
    from training.metrics import error_rates

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.keep or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        pdf = folder / "pictures.pdf"
        make_pdf(pdf, args.pages)
        doc = pdfium.PdfDocument(pdf)
        truth = [doc[i].get_textpage().get_text_range() for i in range(len(doc))]
        doc.close()
        reader = pantheon_ocr.Reader(args.model, text_layer="ocr")
        limit = regions.NOISE_LOGPROB
        for label, threshold in (("with the noise filter", limit), ("without it", float("-inf"))):
            regions.NOISE_LOGPROB = threshold
            pages = list(reader.read(pdf))
            (folder / f"{label.split()[0]}.txt").write_text("\f".join(p.text for p in pages), encoding="utf-8")
            per_page = [error_rates([(t, p.text)])["cer"] for t, p in zip(truth, pages)]
            rates = error_rates([(t, p.text) for t, p in zip(truth, pages)])
            print(f"{label:22} CER {rates['cer']:.3f}  per page " + " ".join(f"{c:.3f}" for c in per_page))
        regions.NOISE_LOGPROB = limit
    return 0


if __name__ == "__main__":
    sys.exit(main())
