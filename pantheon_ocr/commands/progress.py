"""The progress bar of `transcribe` and `archive run`: a tqdm bar fed by the pipeline's Progress."""

from __future__ import annotations


def progress_bar():
    """An on_progress callback drawing pages done, pages/min, tokens/s and failures. A new bar
    starts whenever the count goes back (an archive job's next round of retries)."""
    from tqdm import tqdm

    bar = None

    def update(p) -> None:
        nonlocal bar
        if bar is None or p.pages_done < bar.n:
            if bar is not None:
                bar.close()
            bar = tqdm(total=p.pages_total, unit="page", dynamic_ncols=True)
        bar.total, bar.n = p.pages_total, p.pages_done
        elapsed = max(p.elapsed, 1e-9)
        bar.set_postfix_str(f"{p.pages_done / elapsed * 60:.1f} pages/min, {p.tokens / elapsed:.1f} tok/s, "
                            f"{p.pages_failed} failed", refresh=False)
        bar.refresh()
        if p.pages_done >= p.pages_total:
            bar.close()
            bar = None

    return update
