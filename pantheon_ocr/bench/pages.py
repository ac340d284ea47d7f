"""Per-page throughput benchmark: the real page pipeline (render workers, vision thread, CPU
thread with continuous batching) over PDFs/images or synthetic pages, one configuration per
process, configurations side by side.

Result shape (JSON, one entry per configuration; the archive HTML report can show it):

    [{"config":  {"name", "batch_size", "weights", "flash", "overlap", "threads", "vision_backend", "kv_dtype",
                  "prefill_chunk", "device", "vision_dtype", "gpu_prefill", "gpu_decode", "max_tokens",
                  "ignore_eos", "longest_edge", "vision_layers", "text_layers", "model", "mmproj"},
      "pages":   [{"doc", "page", "n_tokens", "finish_reason", "error",
                   "seconds": {"render", "vision", "prefill", "decode"}, "decode_tok_s"}, ...],
      "summary": {"pages", "pages_failed", "tokens", "wall_s", "pages_per_min", "tokens_per_s",
                  "decode_tok_s", "mean_batch", "max_decode_gap_s",
                  "busy_s": {"render", "vision", "prefill", "decode"},
                  "mean_page_s": {...}, "load_s", "peak_rss_mb", "load_avg_before",
                  "load_avg_after"}}, ...]

A configuration whose process died (the OOM killer) or crashed, or that cannot run here (a typed
error), in any of its runs has `"error"` (why), no pages and summary None, and is not run again;
the others still run. Ctrl-C or SIGTERM stops the benchmark: bench_pages raises
BenchInterrupted with the configurations that finished before it (the one under way has none).

Per-page seconds are as the pipeline records them: render in a worker process, vision on the
vision thread, prefill on the CPU thread, decode = wall time of the batched steps the page took
part in (shared with the other pages of the batch, so they do not add up across pages).
`pages_per_min` counts the pages read (a page that failed, in a moment, is no throughput).
`busy_s` is how long each stage kept its thread busy over the whole run (render: summed over
pages, in the worker processes). `decode_tok_s` (summary) = generated tokens / decode busy time.
`max_decode_gap_s` is the longest the running pages waited between two decode steps (a page's
prefill, or its vision without overlap, in between): chunked prefill keeps it to one chunk.
"""

from __future__ import annotations

import itertools
import json
import os
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from ..errors import PantheonError, path_record, path_text
from ..options import OVERLAP_WORDS, EngineOptions, PipelineOptions, SamplingOptions, spec
from ..pipeline.types import STAGES, PageEngine


def _default(cls, name: str):
    return spec(cls, name).default


@dataclass(frozen=True)
class PageConfig:
    """One configuration; every default is the options table's, so a bench run with no
    configuration flags measures what `transcribe` runs."""

    batch_size: int = _default(PipelineOptions, "batch_size")
    weights: str = _default(EngineOptions, "weights")
    flash: bool = _default(EngineOptions, "attention") == "flash"
    overlap: bool | None = _default(PipelineOptions, "overlap")  # None: the engine's choice
    threads: int | None = _default(EngineOptions, "threads")  # math threads in all (None: every core)
    vision_backend: str = _default(EngineOptions, "vision_backend")
    kv_dtype: str = _default(EngineOptions, "kv_dtype")  # the KV pool's dtype (auto: by the weights)
    prefill_chunk: int = _default(EngineOptions, "prefill_chunk")  # prompt tokens per prefill step
    device: str | None = _default(EngineOptions, "device")  # torch device (None: the best one torch sees)
    vision_dtype: str = _default(EngineOptions, "vision_dtype")
    gpu_prefill: bool = _default(EngineOptions, "gpu_prefill")
    gpu_decode: bool = _default(EngineOptions, "gpu_decode")

    @property
    def name(self) -> str:
        th = "" if self.threads is None else f" t{self.threads}"
        shown = ("vision_backend", "device", "vision_dtype", "kv_dtype", "prefill_chunk", "gpu_prefill", "gpu_decode")
        changed = {f: getattr(self, f) for f in shown if getattr(self, f) != _default(EngineOptions, f)}
        short = {"vision_backend": "vis", "vision_dtype": "vdtype", "kv_dtype": "kv", "prefill_chunk": "chunk",
                 "gpu_prefill": "gpu-prefill", "gpu_decode": "gpu-decode"}
        extra = "".join(f" {short.get(f, f)}" + ("" if v is True else f"={v}") for f, v in changed.items())
        return (f"B={self.batch_size} {self.weights} flash={'on' if self.flash else 'off'} "
                f"overlap={OVERLAP_WORDS[self.overlap]}{th}{extra}")


@dataclass(frozen=True)
class PageBenchOptions:
    model: str
    mmproj: str
    inputs: tuple[str, ...]
    max_tokens: int = _default(SamplingOptions, "max_tokens")
    ignore_eos: bool = False  # every page generates exactly max_tokens (random-weight models)
    longest_edge: int | None = None  # None: the model's (1540)
    vision_layers: int | None = None  # run only the first N layers (say so when quoting figures)
    text_layers: int | None = None
    pages_per_config: str = "all"  # "all", "N" (first N pages of each document), "auto" = max(4, 2B)
    render_workers: int = 2


def expand_configs(batch_sizes=(PageConfig.batch_size,), weights=(PageConfig.weights,), flash=(PageConfig.flash,),
                   overlap=(PageConfig.overlap,), threads=(PageConfig.threads,), vision_backend=PageConfig.vision_backend,
                   kv_dtype=PageConfig.kv_dtype, prefill_chunk=PageConfig.prefill_chunk, device=PageConfig.device,
                   vision_dtype=(PageConfig.vision_dtype,), gpu_prefill=(PageConfig.gpu_prefill,),
                   gpu_decode=(PageConfig.gpu_decode,)) -> list[PageConfig]:
    """Every combination, in a stable order (batch size varies fastest)."""
    return [PageConfig(b, w, f, o, t, vision_backend, kv_dtype, prefill_chunk, device, vd, gp, gd)
            for t, w, vd, gp, gd, f, o, b in itertools.product(threads, weights, vision_dtype, gpu_prefill, gpu_decode,
                                                                flash, overlap, batch_sizes)]


# --------------------------------------------------------------------- one configuration


class TimedEngine:
    """A PageEngine around another that records how long each stage keeps its thread busy; it
    implements the whole protocol, so the pipeline runs it as it runs any engine."""

    def __init__(self, inner: PageEngine):
        self.inner = inner
        self.longest_edge = inner.longest_edge
        self.hints = inner.hints  # how the model cuts pages
        self.overlaps = inner.overlaps
        self.vision_device = inner.vision_device
        self.model = inner.model
        self.busy = dict.fromkeys(("vision", "prefill", "decode"), 0.0)
        self.decode_tokens = 0
        self.decode_steps = 0
        self.batch_sizes: Counter = Counter()
        # Decode as the running pages see it: the span from the first decode step to the last,
        # and the longest wait between two steps (a prefill or vision call in between).
        self.decode_first: float | None = None
        self.decode_last: float | None = None
        self.max_decode_gap = 0.0

    def _busy(self, stage: str, call, *args):
        """call(*args), its wall time added to the stage's busy time (failed calls too)."""
        t = time.perf_counter()
        try:
            return call(*args)
        finally:
            self.busy[stage] += time.perf_counter() - t

    def vision(self, image):
        return self._busy("vision", self.inner.vision, image)

    def vision_many(self, images):
        return self._busy("vision", self.inner.vision_many, images)

    def start_prefill(self, features, sampling):
        return self._busy("prefill", self.inner.start_prefill, features, sampling)

    def prefill_steps(self, seqs):
        return self._busy("prefill", self.inner.prefill_steps, seqs)

    def decode_step(self, seqs):
        live = sum(not s.finished for s in seqs)
        t = time.perf_counter()
        if self.decode_last is not None:
            self.max_decode_gap = max(self.max_decode_gap, t - self.decode_last)
        if self.decode_first is None:
            self.decode_first = t
        try:
            return self.inner.decode_step(seqs)
        finally:
            self.decode_last = time.perf_counter()
            self.busy["decode"] += self.decode_last - t
            self.decode_tokens += live
            self.decode_steps += 1
            self.batch_sizes[live] += 1
            if all(s.finished for s in seqs):
                self.decode_last = None  # the batch drained: waiting for new pages is no stall


def build_engine(opts: PageBenchOptions, config: PageConfig):
    """The real OCREngine, set up as the configuration says; returns (engine, load seconds)."""
    from ..engine.loader import load_page_engine

    t0 = time.perf_counter()
    engine, _ = load_page_engine(EngineOptions(
        opts.model, opts.mmproj, weights=config.weights, vision_layers=opts.vision_layers,
        text_layers=opts.text_layers, attention="flash" if config.flash else "naive", ignore_eos=opts.ignore_eos,
        vision_backend=config.vision_backend, kv_dtype=config.kv_dtype, prefill_chunk=config.prefill_chunk,
        device=config.device, vision_dtype=config.vision_dtype, gpu_prefill=config.gpu_prefill,
        gpu_decode=config.gpu_decode))
    return engine, time.perf_counter() - t0


def _warm_up(engine) -> None:
    """One tiny page through every stage: BLAS threads started, tokenizer built, maps paged in."""
    from PIL import Image

    seq = engine.start_prefill(engine.vision(Image.new("RGB", (56, 56), "white")), SamplingOptions(max_tokens=2))
    while seq.prefilling:
        engine.prefill_steps([seq])
    if not seq.finished:
        engine.decode_step([seq])
    seq.text()
    seq.close()


def run_config(opts: dict, config: dict) -> dict:
    """Run the pipeline once for one configuration (call it in its own process); see the module
    docstring for the result shape (peak_rss_mb is added by the caller)."""
    from ..pipeline.inputs import expand_inputs
    from ..pipeline.run import run_pipeline
    from .isolation import peak_rss_mb

    from ..engine.threads import set_threads, stage_threads

    o, c = PageBenchOptions(**{**opts, "inputs": tuple(opts["inputs"])}), PageConfig(**config)
    set_threads(stage_threads(c.threads, c.overlap))
    inner, load_s = build_engine(o, c)
    _warm_up(inner)
    engine = TimedEngine(inner)
    pages = None
    if o.pages_per_config == "auto":
        pages = f"1-{max(4, 2 * c.batch_size)}"
    elif o.pages_per_config != "all":
        pages = f"1-{int(o.pages_per_config)}"
    with tempfile.TemporaryDirectory(prefix="pantheon-bench-out-") as out:
        options = PipelineOptions(
            out_dir=Path(out), formats=("jsonl",), overwrite=True, pages=pages, batch_size=c.batch_size,
            overlap=c.overlap, render_workers=o.render_workers, longest_edge=o.longest_edge,
            sampling=SamplingOptions(max_tokens=o.max_tokens),
        )
        load0 = os.getloadavg()[0]
        t0 = time.perf_counter()
        summary = run_pipeline(expand_inputs(list(o.inputs)), engine, options)
        wall = time.perf_counter() - t0
        records = []
        for f in sorted(Path(out).rglob("*.jsonl")):
            records += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    page_rows = []
    for r in sorted(records, key=lambda r: (r["doc"], r["page"])):
        sec = r["seconds"]
        page_rows.append({
            "doc": r["doc"], "page": r["page"], "n_tokens": r["n_tokens"],
            "finish_reason": r["finish_reason"], "error": r["error"],
            "seconds": {s: sec.get(s, 0.0) for s in STAGES},
            "decode_tok_s": r["n_tokens"] / sec["decode"] if sec.get("decode") else None,
        })
    # Pages that left no JSONL record (a document whose every page failed writes nothing, a
    # document that cannot be opened has no pages): listed from the run summary instead.
    seen = {(p["doc"], p["page"]) for p in page_rows}
    for f in summary.failed_pages:
        if (path_record(f.path), f.page) not in seen:
            page_rows.append({"doc": path_record(f.path), "page": f.page, "n_tokens": 0, "finish_reason": None,
                              "error": f.reason, "seconds": dict.fromkeys(STAGES, 0.0), "decode_tok_s": None})
    n_pages = summary.pages_done
    busy = {"render": sum(p["seconds"]["render"] for p in page_rows), **engine.busy}
    ok = [p for p in page_rows if p["error"] is None]
    result = {
        "config": config_record(o, c),
        "pages": page_rows,
        "summary": {
            "pages": n_pages,
            "pages_failed": sum(p["error"] is not None for p in page_rows),
            "tokens": summary.tokens,
            "wall_s": wall,
            "pages_per_min": 60 * len(ok) / wall if wall else 0.0,  # read pages: a failed one is no throughput
            "tokens_per_s": summary.tokens / wall if wall else 0.0,
            "decode_tok_s": engine.decode_tokens / engine.busy["decode"] if engine.busy["decode"] else 0.0,
            "mean_batch": engine.decode_tokens / engine.decode_steps if engine.decode_steps else 0.0,
            "max_decode_gap_s": engine.max_decode_gap,
            "overlapped": engine.overlaps if c.overlap is None else c.overlap,  # what auto chose
            "busy_s": busy,
            "mean_page_s": {s: float(np.mean([p["seconds"][s] for p in ok])) if ok else 0.0 for s in STAGES},
            "load_s": load_s,
            "peak_rss_mb": peak_rss_mb(),
            "load_avg_before": round(load0, 2),
            "load_avg_after": round(os.getloadavg()[0], 2),
            "interrupted": summary.interrupted,
        },
    }
    return result


def config_record(o: PageBenchOptions, c: PageConfig) -> dict:
    """A result's "config": the configuration and the run's settings."""
    return {"name": c.name, **asdict(c), **{k: v for k, v in asdict(o).items() if k not in ("inputs",)},
            "inputs": [Path(i).name for i in o.inputs]}


class BenchInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped bench_pages: `results` are the configurations that finished."""

    def __init__(self, results: list[dict]):
        super().__init__()
        self.results = results


def bench_pages(opts: PageBenchOptions, configs: list[PageConfig], isolate: bool = True,
                on_result: Callable[[dict], None] | None = None, repeats: int = 1) -> list[dict]:
    """Run every configuration (each in its own process unless isolate=False). With repeats > 1
    the configurations take turns (round robin, so a change of machine load hits them alike) and
    each reports its run with the median wall time (the lower middle one for an even count);
    summary.runs_wall_s lists every run. A configuration whose run died is not run again and is
    reported with its "error" (module docstring)."""
    from .isolation import run_isolated

    runs: dict[int, list[dict]] = {i: [] for i in range(len(configs))}
    died: dict[int, PantheonError] = {}
    try:
        for _ in range(repeats):
            for i, c in enumerate(configs):
                if i in died:  # run again, an OOM kill would only come again, and may take another process
                    continue
                try:
                    r = run_isolated("pantheon_ocr.bench.pages:run_config", {"opts": asdict(opts), "config": asdict(c)},
                                     threads=c.threads, isolate=isolate)
                except PantheonError as e:  # its process died, or it cannot run here: the others still run
                    died[i] = e
                    if on_result:
                        on_result(_failed(opts, c, e))
                    continue
                if r["summary"]["interrupted"]:  # in this process: the pipeline took the Ctrl-C
                    raise KeyboardInterrupt
                # run_isolated adds its own bookkeeping keys at top level: keep the documented shape.
                peak = r.pop("peak_rss_mb", None)
                for k in ("threads", "load_avg_before", "load_avg_after", "wall_s"):
                    r.pop(k, None)
                if peak is not None and isolate:
                    r["summary"]["peak_rss_mb"] = peak
                runs[i].append(r)
                if on_result:
                    on_result(r)
    except KeyboardInterrupt:
        raise BenchInterrupted(_picked(opts, configs, runs, died)) from None
    return _picked(opts, configs, runs, died)


def _failed(o: PageBenchOptions, c: PageConfig, e) -> dict:
    return {"config": config_record(o, c), "error": str(e), "exit_code": int(e.exit_code), "pages": [], "summary": None}


def _picked(o: PageBenchOptions, configs: list[PageConfig], runs: dict[int, list[dict]], died: dict) -> list[dict]:
    """Per configuration that ran: its median run, or its failure if any run of it failed (figures
    over fewer runs than asked for would pass for the median of all)."""
    results = []
    for i, c in enumerate(configs):
        if i in died:
            results.append(_failed(o, c, died[i]))
            continue
        if not runs[i]:
            continue
        done = sorted(runs[i], key=lambda r: r["summary"]["wall_s"])
        pick = done[(len(done) - 1) // 2]
        pick["summary"]["runs_wall_s"] = [r["summary"]["wall_s"] for r in runs[i]]
        results.append(pick)
    return results


# ------------------------------------------------------------------------------- output


def format_table(results: list[dict], header: bool = True) -> str:
    """One line per configuration: throughput, mean per-page stage seconds, busy split, memory."""
    lines = []
    if header:
        lines.append(f"{'configuration':38} {'pages':>5} {'tokens':>6} {'wall s':>7} {'pages/min':>9} {'tok/s':>6} "
                     f"{'dec tok/s':>9} {'mean B':>6} {'gap s':>6} | {'per page s: render':>18} {'vision':>7} {'prefill':>7} "
                     f"{'decode':>7} | {'busy %: vis':>11} {'pre':>4} {'dec':>4} | {'peak RSS':>9} {'load':>5}")
    for r in results:
        if r.get("error"):
            lines.append(f"{r['config']['name']:38} failed: {r['error']}")
            continue
        s, m, b = r["summary"], r["summary"]["mean_page_s"], r["summary"]["busy_s"]
        wall = s["wall_s"] or 1.0
        lines.append(
            f"{r['config']['name']:38} {s['pages']:5d} {s['tokens']:6d} {s['wall_s']:7.1f} {s['pages_per_min']:9.2f} "
            f"{s['tokens_per_s']:6.2f} {s['decode_tok_s']:9.2f} {s['mean_batch']:6.1f} "
            f"{s.get('max_decode_gap_s', 0.0):6.1f} | {m['render']:18.2f} "
            f"{m['vision']:7.2f} {m['prefill']:7.2f} {m['decode']:7.2f} | {100 * b['vision'] / wall:11.0f} "
            f"{100 * b['prefill'] / wall:4.0f} {100 * b['decode'] / wall:4.0f} | {s['peak_rss_mb']:6.0f} MB "
            f"{s['load_avg_before']:5.1f}"
            + (f"  (auto: overlap {OVERLAP_WORDS[s['overlapped']]})" if r["config"]["overlap"] is None else "")
            + (f"  ({s['pages_failed']} failed)" if s["pages_failed"] else ""))
    return "\n".join(lines)


def failure_lines(results: list[dict]) -> list[str]:
    """The failed documents and pages, one line each with its reason, under a count, as transcribe
    lists them (`1 document failed:` / `  bad.pdf: the PDF is damaged ...`). A failure every
    configuration had is listed once; one that only some had names those configurations."""
    names = [r["config"]["name"] for r in results if not r.get("error")]
    seen: dict[tuple, list[str]] = {}  # (doc, page, reason) -> the configurations it failed in
    for r in results:
        for p in r["pages"]:
            if p["error"] is not None:
                reason = " ".join(str(p["error"]).split())  # one line, whatever the error held
                seen.setdefault((p["doc"], p["page"], reason), []).append(r["config"]["name"])
    died = [f"  {r['config']['name']}: {r['error']}" for r in results if r.get("error")]
    died = [f"{len(died)} configuration{'s' if len(died) != 1 else ''} failed (no figures):", *died] if died else []
    if not seen:
        return died
    pages = len({(doc, page) for doc, page, _ in seen if page is not None})
    docs = len({doc for doc, page, _ in seen if page is None})
    head = " and ".join(([f"{pages:,} page{'s' if pages != 1 else ''}"] if pages else [])
                        + ([f"{docs:,} document{'s' if docs != 1 else ''}"] if docs else []))
    lines = [f"{head} failed:"]
    for (doc, page, reason), where in seen.items():
        which = "" if set(where) >= set(names) else f" (in {'; '.join(dict.fromkeys(where))})"
        lines.append(f"  {path_text(doc)}{'' if page is None else f' page {page}'}: {reason}{which}")
    return lines + died


__all__ = ["BenchInterrupted", "PageBenchOptions", "PageConfig", "TimedEngine", "bench_pages", "expand_configs",
           "failure_lines", "format_table", "run_config"]
