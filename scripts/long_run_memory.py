"""Is memory flat over a long run? Run a command and sample its process tree's resident set.

    python scripts/long_run_memory.py pdfs OUT_DIR --from samples/docs --documents 100 --pages 10
    python scripts/long_run_memory.py sample rss.log -- pantheon-ocr archive run job.toml --no-progress

`pdfs` writes DOCUMENTS PDFs of PAGES pages each from the pages of the PDFs in --from, taken in turn
(each document starts one page further on, and ends with its own number: no two are the same
bytes, so none is skipped as already done). `sample` runs the command and writes, every --every
seconds, the elapsed seconds and the summed VmRSS (MiB) of the command and all its descendants
(render workers, Ray workers), read from /proc (Linux); at the end its exit code, wall seconds and
the median, largest and first-minute / last-minute RSS, which it also prints.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def write_pdfs(out: Path, source: Path, documents: int, pages: int) -> None:
    import pypdfium2 as pdfium

    sources = [pdfium.PdfDocument(p) for p in sorted(source.glob("*.pdf"))]
    every = [(doc, i) for doc in sources for i in range(len(doc))]
    if not every:
        raise SystemExit(f"{source}: no PDF pages to take")
    out.mkdir(parents=True, exist_ok=True)
    for n in range(documents):
        doc = pdfium.PdfDocument.new()
        for j in range(pages):
            src, i = every[(n + j) % len(every)]
            doc.import_pages(src, [i])
        with open(out / f"doc{n:04d}.pdf", "wb") as f:
            doc.save(f)
            f.write(f"\n%{n}\n".encode())  # a comment after %%EOF: this document's own bytes
    print(f"{documents} PDFs of {pages} pages from {len(every)} source pages in {out}")


def tree_rss_mib(root: int) -> float:
    """Summed VmRSS of `root` and its descendants (children found through /proc/*/stat's ppid)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile
            children.setdefault(ppid, []).append(int(entry))
    todo, kib = [root], 0
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    kib += int(line.split()[1])
        except OSError:
            pass
    return kib / 1024


def sample(log: Path, command: list[str], every: float) -> int:
    proc = subprocess.Popen(command)
    t0 = time.monotonic()
    rows: list[tuple[float, float]] = []
    with open(log, "w") as f:
        while proc.poll() is None:
            rows.append((time.monotonic() - t0, tree_rss_mib(proc.pid)))
            f.write(f"{rows[-1][0]:.0f} {rows[-1][1]:.0f}\n")
            f.flush()
            time.sleep(every)
        wall = time.monotonic() - t0
        rss = [r for _, r in rows if r > 0]
        first = [r for t, r in rows if 0 < r and t <= 60]
        last = [r for t, r in rows if 0 < r and t >= wall - 60]
        summary = (f"rc {proc.returncode} wall {wall:.0f} s; RSS MiB median {statistics.median(rss or [0]):.0f}, "
                   f"largest {max(rss or [0]):.0f}, first minute {max(first or [0]):.0f}, "
                   f"last minute {max(last or [0]):.0f}")
        f.write(summary + "\n")
    print(summary)
    return proc.returncode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    p = sub.add_parser("pdfs")
    p.add_argument("out", type=Path)
    p.add_argument("--from", dest="source", type=Path, default=Path("samples/docs"))
    p.add_argument("--documents", type=int, default=100)
    p.add_argument("--pages", type=int, default=10)
    s = sub.add_parser("sample")
    s.add_argument("log", type=Path)
    s.add_argument("--every", type=float, default=5.0)
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args, command = ap.parse_args(argv[:cut]), argv[cut + 1:]
    if args.what == "pdfs":
        write_pdfs(args.out, args.source, args.documents, args.pages)
        return 0
    if not command:
        ap.error("sample: no command after --")
    return sample(args.log, command, args.every)


if __name__ == "__main__":
    sys.exit(main())
