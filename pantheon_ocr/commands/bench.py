"""`pantheon-ocr bench ...`: throughput benchmarks (figures, never assertions).

    bench generate   decoder prefill/decode tok/s per storage mode beside a numpy GEMM roofline
    bench ocr        LightOnOCR vision encoder and prefill seconds per page (flash vs naive,
                     storage modes, BLAS threads), each configuration in its own process
    bench decode     forward_batch alone: decode tokens/s against the batch size
    bench pages      the real pipeline over PDFs or synthetic pages, per-page figures,
                     configurations side by side (batch size, storage, flash, overlap, threads)

Configuration lists are comma-separated (`--batch-size 1,8 --weights quantized,f32`); every
combination runs, one process each, so each has its own peak RSS and BLAS thread count.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import click

from ..errors import ExitCode, ModelError, UsageError, WriteError, path_text
from ..options import (MAX_THREADS, OVERLAP_WORDS, THREADS_DEFAULT, VISION_DTYPES, WEIGHT_CHOICES, EngineOptions,
                       PipelineOptions, SamplingOptions, spec)
from .common import stop_signals_as_interrupt
from .options import table_options


def _items(value: str, name: str, kind: click.ParamType) -> list:
    """'1,8,16' -> [1, 8, 16]: each item converted and checked by `kind` (click's own type, so that
    a bad value is said in the words transcribe says it in: `Invalid value for '--batch-size': 0 is
    not in the range 1<=x<=256.`), a repeat run once; an empty item ('1,,2') is a typo, not nothing."""
    items = [v.strip() for v in str(value).split(",")]
    out = []
    for item in items:
        try:
            out.append(kind.convert(item, None, None))
        except click.BadParameter as e:
            where = f" (in the list {value!r})" if len(items) > 1 else ""
            raise click.BadParameter(e.message + where, param_hint=f"'{name}'") from None
    return list(dict.fromkeys(out))


def _ints(value: str, name: str, low: int = 1, high: int | None = None) -> list[int]:
    return _items(value, name, click.IntRange(low, high))


def _batch_sizes(value: str) -> list[int]:
    size = spec(PipelineOptions, "batch_size")  # the bounds transcribe and job files take
    return _ints(value, "--batch-size", size.lo, size.hi)


def _choices(value: str, name: str, allowed: tuple[str, ...]) -> list[str]:
    return _items(value, name, click.Choice(list(allowed)))


def _on_off(value: str, name: str) -> list[bool]:
    return [v == "on" for v in _choices(value, name, ("on", "off"))]


def _overlaps(value: str) -> list[bool | None]:
    setting = {word: v for v, word in OVERLAP_WORDS.items()}
    return [setting[v] for v in _choices(value, "--overlap", tuple(setting))]


def _threads(value: str | None) -> list[int | None]:
    return [None] if not value else _ints(value, "--threads", 1, MAX_THREADS)


def _check_json(path: str | None) -> None:
    """WriteError naming --json's path unless the file can be written there: said before any model
    is read or any configuration runs, not after the whole benchmark (its figures then lost). The
    folder is made if missing, as transcribe's output folder is."""
    from ..pipeline.outputs import check_output_folder

    if path is None:
        return
    if not path.strip():  # an unset "$OUT": the figures would be lost without a word
        raise UsageError("--json: an empty path (an unset shell variable?): give the file the figures go to")
    p = Path(path)
    if p.is_symlink():  # the atomic writer never writes through a link: refuse it now, not at the end
        raise WriteError(f"--json {path_text(p)}: a symbolic link: the file is not written through a link")
    if p.is_dir():
        raise WriteError(f"--json {path_text(p)}: a folder, not a file")
    try:
        check_output_folder(p.parent)
    except WriteError as e:
        raise WriteError(f"--json {path_text(p)}: {e}") from None


def _write_json(path: str | None, data) -> None:
    """The rows, written atomically: a benchmark stopped while writing leaves the old file or the
    new one, never half a JSON document."""
    from ..pipeline.outputs import atomic_write_text

    if path:
        try:
            atomic_write_text(path, json.dumps(data, indent=2) + "\n")
        except WriteError as e:  # PlantedPath: a link or a file planted since the check
            raise WriteError(f"--json {path_text(path)}: {e}") from None
        except OSError as e:
            raise WriteError(f"--json {path_text(path)}: cannot write the file: {e.strerror or e}") from None
        click.echo(f"wrote {path_text(path)}", err=True)


def _model_file(path: str, option: str) -> None:
    """ModelError (exit 3, naming the path) unless `path` opens as a GGUF model file, as `inspect`
    and `bench generate` say it: a missing or bad model is that, not a usage error (click's
    exists=True would exit 2). Checked before any configuration runs."""
    from ..engine.format.gguf import open_gguf

    try:
        open_gguf(path).close()
    except ModelError as e:
        raise ModelError(e.path, e.problem, option) from None


def _text_model(model: str) -> str:
    """The decoder GGUF `bench generate|decode --model` names: a file, or the text half of a
    folder's pair or of a pulled model (`lightonocr-2`, owner/repo), as transcribe finds them."""
    from ..modelfiles.resolve import resolve_model

    if Path(model).is_file():
        return model
    return str(resolve_model(model, None)[0])


# bench ocr's and bench pages' list of vision compute types, configurations side by side
vision_dtypes_option = click.option(
    "--vision-dtype", "vision_dtypes", default=spec(EngineOptions, "vision_dtype").default, show_default=True,
    help="e.g. float32,bfloat16; auto: what transcribe takes for the backend here.")


@click.group()
def bench() -> None:
    """Throughput benchmarks; configurations side by side in one run."""


@bench.command("generate")
@click.option("--model", "models", multiple=True, required=True,
              help="Decoder GGUF, or a folder or pulled model whose text GGUF to take (repeat for several).")
@click.option("--weights", default=spec(EngineOptions, "weights").default, show_default=True,
              help="Storage modes, e.g. quantized,f32,int8; auto: what transcribe takes for each model here.")
@click.option("--prefill-tokens", default=512, show_default=True, type=click.IntRange(1))
@click.option("--decode-tokens", default=16, show_default=True, type=click.IntRange(1))
@click.option("--json", "json_path", help="Also write the rows as JSON.")
def generate(models, weights, prefill_tokens, decode_tokens, json_path) -> None:
    """Prefill and decode tokens/s per model and storage mode, with a numpy GEMM roofline."""
    from ..bench.isolation import cpu_info
    from ..bench.stages import bench_decoder
    from ..engine.loader import auto_weights

    choices = _choices(weights, "--weights", WEIGHT_CHOICES)
    _check_json(json_path)
    models = [_text_model(m) for m in models]
    for m in models:
        _model_file(m, "model")
    rows = [bench_decoder(m, s, prefill_tokens, decode_tokens).row() for m in models
            for s in dict.fromkeys(auto_weights(m)[0] if w == "auto" else w for w in choices)]
    click.echo(f"# {cpu_info()}")
    click.echo(f"{'model':40} {'storage':9} {'KV':8} {'prefill tok/s':>13} {'roofline':>9} {'ratio':>6} "
               f"{'decode tok/s':>12} {'roofline':>9} {'tokenizer s':>11}")
    for r in rows:
        click.echo(f"{r['model'][-40:]:40} {r['storage']:9} {r['kv_dtype']:8} {r['prefill_tok_s']:13.1f} "
                   f"{r['roofline_prefill_tok_s']:9.1f} {r['roofline_prefill_tok_s'] / r['prefill_tok_s']:6.2f} "
                   f"{r['decode_tok_s']:12.2f} {r['roofline_decode_tok_s']:9.1f} {r['tokenizer_load_s']:11.2f}")
    _write_json(json_path, rows)


@bench.command("ocr")
@click.option("--model", help="Text GGUF, a directory holding the text and mmproj GGUFs, or a pulled model's name "
                              "(default: the bundled reader).")
@click.option("--mmproj", help="mmproj GGUF.")
@click.option("--stage", default="vision,prefill", show_default=True, help="vision,prefill")
@click.option("--weights", default=spec(EngineOptions, "weights").default, show_default=True,
              help="Storage modes, e.g. quantized,f32,int8; auto: what transcribe takes for this model here.")
@click.option("--vision-backend", "vision_backends", default=spec(EngineOptions, "vision_backend").default,
              show_default=True, help="e.g. numpy,torch; auto: what transcribe takes for this model here.")
@table_options(EngineOptions, "device")
@vision_dtypes_option
@click.option("--flash", default="on" if spec(EngineOptions, "attention").default == "flash" else "off",
              show_default=True, help="Prefill attention: on = blocked, off = naive; on,off runs both.")
@click.option("--threads", default=None, help=f"Math threads per configuration, e.g. 1,2 (default: {THREADS_DEFAULT}).")
@click.option("--q-block", "q_blocks", default=None, help="Flash query rows per tile, e.g. 32,256 (default: the engine's).")
@click.option("--vision-layers", type=click.IntRange(1), help="Run only N vision layers; full depth estimated.")
@click.option("--text-layers", type=click.IntRange(1), help="Run only N decoder layers; full depth estimated.")
@click.option("--page", type=click.Choice(["letter", "a4"]), default="letter", show_default=True)
@click.option("--longest-edge", type=click.IntRange(28), default=1540, show_default=True)
@click.option("--repeats", default=1, show_default=True, type=click.IntRange(1), help="Median of N runs.")
@click.option("--in-process", is_flag=True, help="No subprocess per configuration (peak RSS is then shared).")
@click.option("--json", "json_path", help="Also write the rows as JSON.")
def ocr(model, mmproj, stage, weights, vision_backends, device, vision_dtypes, flash, threads, q_blocks, vision_layers,
        text_layers, page, longest_edge, repeats, in_process, json_path) -> None:
    """Vision encoder and prefill seconds per page at the model's shapes (synthetic page).
    Defaults are transcribe's: `auto` weights and vision backend are planned for this model
    here as transcribe plans them, so the figures are those of the path users run."""
    from ..bench.isolation import cpu_info, run_isolated
    from ..engine.backends import BACKENDS
    from ..engine.loader import plan_auto
    from ..modelfiles.resolve import resolve_model

    stages = _choices(stage, "--stage", ("vision", "prefill"))
    _check_json(json_path)
    model, mmproj = (str(p) for p in resolve_model(model, mmproj))
    _model_file(model, "model")
    _model_file(mmproj, "mmproj")
    plans = []  # (weights, vision backend, vision dtype) concrete where auto is, in order
    for w in _choices(weights, "--weights", WEIGHT_CHOICES):
        for vb in _choices(vision_backends, "--vision-backend", BACKENDS):
            for vd in _choices(vision_dtypes, "--vision-dtype", VISION_DTYPES):
                o = plan_auto(EngineOptions(Path(model), Path(mmproj), weights=w, vision_backend=vb, device=device,
                                            vision_dtype=vd))[0]
                plans.append((o.weights, o.vision_backend, o.vision_dtype))
    flashes = _on_off(flash, "--flash")
    thread_list = _threads(threads)
    q_block_list = [None] if not q_blocks else _ints(q_blocks, "--q-block")
    click.echo(f"# {cpu_info()}")
    rows = []
    for th in thread_list:
        for st in dict.fromkeys(w for w, _, _ in plans):
            if "vision" in stages:
                for vb, vd in dict.fromkeys((b, d) for w, b, d in plans if w == st):
                    kw = dict(mmproj=mmproj, storage=st, layers=vision_layers, repeats=repeats, page=page,
                              longest_edge=longest_edge, backend=vb, model=model, device=device, dtype=vd)
                    rows.append(run_isolated("pantheon_ocr.bench.stages:bench_vision", kw, th, not in_process))
                    _ocr_line(rows[-1], header=len(rows) == 1)
            if "prefill" in stages:
                for fl in flashes:
                    for qb in (q_block_list if fl else [None]):
                        kw = dict(model=model, storage=st, flash=fl, layers=text_layers, repeats=repeats, page=page,
                                  longest_edge=longest_edge, q_block=qb)
                        rows.append(run_isolated("pantheon_ocr.bench.stages:bench_prefill", kw, th, not in_process))
                        _ocr_line(rows[-1], header=len(rows) == 1)
    if any(r["estimated"] for r in rows):
        click.echo("* full depth estimated: time outside the layers + median layer time x all layers "
                   "(only the first N layers ran)")
    _write_json(json_path, rows)


def _ocr_line(r: dict, header: bool) -> None:
    if header:
        click.echo(f"{'stage':8} {'weights':9} {'on':20} {'threads':>7} {'layers':>7} {'tokens':>6} "
                   f"{'s/page':>8} {'s/layer':>8} {'peak RSS':>9} {'load':>5}")
    on = r.get("backend") or r.get("attention", "flash")  # vision: its backend; prefill: its attention
    if r.get("q_block"):
        on += f"/{r['q_block']}"
    tokens = r.get("prompt_tokens", r.get("image_tokens"))
    layers = f"{r['layers_run']}/{r['layers_full']}"
    star = "*" if r["estimated"] else " "
    click.echo(f"{r['stage']:8} {r['storage']:9} {on:20} {str(r['threads']):>7} {layers:>7} {tokens:6d} "
               f"{r['seconds_page']:7.2f}{star} {r['layer_s']:8.2f} {r['peak_rss_mb']:6.0f} MB "
               f"{r['load_avg_before']:5.1f}")


@bench.command("decode")
@click.option("--model", required=True, help="Decoder GGUF, or a folder or pulled model whose text GGUF to take.")
@click.option("--weights", default=spec(EngineOptions, "weights").default, show_default=True,
              help="Storage modes, e.g. f32,int8; auto: what transcribe takes for this model here.")
@click.option("--batch-size", "batch_sizes", default="1,4,8,16,32", show_default=True)
@click.option("--context", default=256, show_default=True, type=click.IntRange(1),
              help="Cached positions per sequence (a short page's prompt).")
@click.option("--steps", default=8, show_default=True, type=click.IntRange(1), help="Timed steps (median).")
@click.option("--threads", default=None, help=f"Math threads per configuration, e.g. 1,2 (default: {THREADS_DEFAULT}).")
@click.option("--text-layers", type=click.IntRange(1), help="Run only N decoder layers; full depth estimated.")
@table_options(EngineOptions, "kv_dtype")
@click.option("--decode-kernel", default="on", show_default=True,
              help="Decode attention over bfloat16 or int8 keys: on = the compiled kernel where it builds, off = torch's "
                   "products; on,off takes turns step by step.")
@click.option("--decode-step", default="on", show_default=True,
              help="A decode step's layer chain: on = one compiled call where it builds, off = the chain in Python; "
                   "on,off takes turns step by step.")
@click.option("--in-process", is_flag=True)
@click.option("--json", "json_path", help="Also write the results as JSON.")
def decode(model, weights, batch_sizes, context, steps, threads, text_layers, kv_dtype, decode_kernel, decode_step,
           in_process, json_path) -> None:
    """forward_batch alone: aggregate decode tokens/s for each batch size."""
    from ..bench.isolation import cpu_info, run_isolated
    from ..engine.loader import auto_weights

    sizes = _batch_sizes(batch_sizes)
    kernels = tuple(_on_off(decode_kernel, "--decode-kernel"))
    compiled = tuple(_on_off(decode_step, "--decode-step"))
    asked = _choices(weights, "--weights", WEIGHT_CHOICES)
    _check_json(json_path)
    model = _text_model(model)
    _model_file(model, "model")
    storages = list(dict.fromkeys(auto_weights(model)[0] if w == "auto" else w for w in asked))
    click.echo(f"# {cpu_info()}; KV cache {kv_dtype}, {context} cached positions per sequence")
    click.echo(f"{'weights':9} {'kernel':6} {'step':4} {'threads':>7} {'B':>3} {'step s':>7} {'tok/s':>7} "
               f"{'x B=' + str(sizes[0]):>6} {'roofline':>8} {'head s':>7} {'peak RSS':>9} {'load':>5}")
    out = []
    for th in _threads(threads):
        for st in storages:
            kw = dict(model=model, storage=st, batch_sizes=sizes, context=context, steps=steps, layers=text_layers,
                      kv_dtype=kv_dtype, kernels=kernels, steps_compiled=compiled)
            r = run_isolated("pantheon_ocr.bench.stages:bench_decode", kw, th, not in_process)
            out.append(r)
            for row in r["rows"]:
                # what ran: asked on, a kernel that did not build or fit runs torch's (said below)
                kernel = "on" if row["kernel_ran"] else "off"
                step = "on" if row["step_ran"] else "off"
                click.echo(f"{st:9} {kernel:6} {step:4} {str(r['threads']):>7} {row['batch']:3d} {row['step_s']:7.3f} "
                           f"{row['tok_s']:7.1f} {row['speedup_vs_first']:6.2f} "
                           f"{(format(row['roofline_tok_s'], '8.1f') if row.get('roofline_tok_s') else '       -')} "
                           f"{row['head_s']:7.3f} {r['peak_rss_mb']:6.0f} MB "
                           f"{r['load_avg_before']:5.1f}")
    for why in dict.fromkeys(w for r in out for w in r["kernel_why"].values()):
        click.echo(f"decode attention: {why}")
    for why in dict.fromkeys(w for r in out for w in r["step_why"].values()):
        click.echo(f"decode step: {why}")
    for why in dict.fromkeys(r["products_why"] for r in out):
        click.echo(f"products: {why}")
    if any(r["estimated"] for r in out):
        click.echo(f"step times scaled to full depth from {out[0]['layers_run']}/{out[0]['layers_full']} layers")
    _write_json(json_path, out)


@bench.command("pages")
@click.argument("inputs", nargs=-1)
@click.option("--model", help="Text GGUF, a directory holding the text and mmproj GGUFs, or a pulled model's name.")
@click.option("--mmproj", help="mmproj GGUF.")
@click.option("--synthetic", type=click.IntRange(1), help="Also OCR N synthetic Letter pages (one PDF).")
@click.option("--batch-size", "batch_sizes", default=str(spec(PipelineOptions, "batch_size").default), show_default=True, help="e.g. 1,8")
@click.option("--weights", default=spec(EngineOptions, "weights").default, show_default=True, help="e.g. quantized,f32,bf16")
@click.option("--flash", default="on" if spec(EngineOptions, "attention").default == "flash" else "off", show_default=True, help="e.g. on,off")
@click.option("--overlap", default=OVERLAP_WORDS[spec(PipelineOptions, "overlap").default],
              show_default=True, help="e.g. auto,on,off (auto: where the engine says it pays)")
@click.option("--threads", default=None, help=f"Math threads in all, e.g. 1,2 (default: {THREADS_DEFAULT}).")
@table_options(EngineOptions, "vision_backend", "device", "kv_dtype", "prefill_chunk")
@vision_dtypes_option
@click.option("--gpu-prefill", default="on" if spec(EngineOptions, "gpu_prefill").default else "off",
              show_default=True, help="Prefill projections on the torch --device: on, off or on,off")
@click.option("--gpu-decode", default="on" if spec(EngineOptions, "gpu_decode").default else "off",
              show_default=True, help="Decode matmuls on the torch --device: on, off or on,off")
@table_options(SamplingOptions, "max_tokens")
@click.option("--ignore-eos/--stop-at-eos", default=False, show_default=True,
              help="Generate exactly --max-tokens per page (random-weight models: no EOS, no loop guard).")
@click.option("--longest-edge", type=click.IntRange(64), help="Render pages smaller than the model's 1540 px.")
@click.option("--vision-layers", type=click.IntRange(1), help="Run only N vision layers (say so when quoting).")
@click.option("--text-layers", type=click.IntRange(1), help="Run only N decoder layers (say so when quoting).")
@click.option("--pages-per-config", default="all", show_default=True,
              help="'all', a number, or 'auto' = max(4, 2 x batch size) pages per configuration.")
@table_options(PipelineOptions, "render_workers")
@click.option("--repeats", default=1, show_default=True, type=click.IntRange(1),
              help="Runs per configuration, taking turns; the median-wall run is reported.")
@click.option("--in-process", is_flag=True, help="No subprocess per configuration (peak RSS is then shared).")
@click.option("--json", "json_path",
              help="Write [{config, pages, summary}, ...] for the archive report.")
def pages(inputs, model, mmproj, synthetic, batch_sizes, weights, flash, overlap, threads, vision_backend, device,
          kv_dtype, prefill_chunk, vision_dtypes, gpu_prefill, gpu_decode, max_tokens, ignore_eos, longest_edge,
          vision_layers, text_layers, pages_per_config, render_workers, repeats, in_process, json_path) -> None:
    """Run the page pipeline over PDFs/images (or synthetic pages) per configuration; per-page
    seconds by stage, tokens/s, pages/min, peak RSS, side by side."""
    import tempfile

    from ..bench.isolation import cpu_info
    from ..bench.pages import BenchInterrupted, PageBenchOptions, bench_pages, expand_configs, failure_lines, format_table
    from ..bench.synthetic import synthetic_pdf
    from ..modelfiles.resolve import resolve_model
    from ..pipeline.inputs import expand_inputs

    text_path, mmproj_path = resolve_model(model, mmproj)
    if not inputs and not synthetic:
        raise UsageError("give input PDFs/images or --synthetic N")
    configs = expand_configs(
        batch_sizes=_batch_sizes(batch_sizes), weights=_choices(weights, "--weights", WEIGHT_CHOICES),
        flash=_on_off(flash, "--flash"), overlap=_overlaps(overlap), threads=_threads(threads),
        vision_backend=vision_backend, kv_dtype=kv_dtype, prefill_chunk=prefill_chunk, device=device,
        vision_dtype=_choices(vision_dtypes, "--vision-dtype", VISION_DTYPES),
        gpu_prefill=_on_off(gpu_prefill, "--gpu-prefill"), gpu_decode=_on_off(gpu_decode, "--gpu-decode"),
    )
    if pages_per_config not in ("all", "auto") and not re.fullmatch(r"[1-9][0-9]*", pages_per_config.strip()):
        raise UsageError(f"--pages-per-config: 'all', 'auto' or one whole number of pages from 1, got {pages_per_config!r}")
    _check_json(json_path)
    _model_file(str(text_path), "model")
    _model_file(str(mmproj_path), "mmproj")
    problems: list = []  # inputs that are no document: said, and the others measured, as transcribe does
    interrupted = False
    with tempfile.TemporaryDirectory(prefix="pantheon-bench-") as tmp, stop_signals_as_interrupt():
        docs = [str(d.path) for d in expand_inputs(list(inputs), problems)] if inputs else []
        if synthetic:
            docs.append(str(synthetic_pdf(Path(tmp) / f"synthetic-{synthetic}.pdf", synthetic)))
        for problem in problems[:-1] if not docs else problems:
            click.echo(f"error: {problem}", err=True)
        if not docs:  # nothing to measure: the last problem is the command's error (exit 4)
            raise problems[-1]
        opts = PageBenchOptions(
            model=str(text_path), mmproj=str(mmproj_path), inputs=tuple(docs), max_tokens=max_tokens,
            ignore_eos=ignore_eos, longest_edge=longest_edge, vision_layers=vision_layers, text_layers=text_layers,
            pages_per_config=pages_per_config.strip(), render_workers=render_workers,
        )
        click.echo(f"# {cpu_info()}")
        try:
            results = bench_pages(opts, configs, isolate=not in_process, repeats=repeats,
                                  on_result=lambda r: click.echo(format_table([r], header=False), err=True))
        except BenchInterrupted as e:  # what finished is reported; the configuration under way has no figures
            results, interrupted = e.results, True
    if results:
        click.echo(format_table(results))
    failures = failure_lines(results)
    for line in failures:  # which document or page, and why: the table only counts them
        click.echo(line, err=True)
    _write_json(json_path, results)
    ctx = click.get_current_context()
    if interrupted:
        click.echo(f"interrupted: {len(results)} of {len(configs)} configuration{'s' * (len(configs) != 1)} "
                   "finished (the one under way is not reported)", err=True)
        ctx.exit(int(ExitCode.INTERRUPTED))
    measured = [r for r in results if not r.get("error")]
    if not measured:  # every configuration's process died: its own code (71 killed, 70 crashed)
        ctx.exit(results[0]["exit_code"])
    if not any(p["error"] is None for r in measured for p in r["pages"]):
        ctx.exit(int(ExitCode.INPUT_UNREADABLE))  # nothing was read, as transcribe says it
    if failures or problems:  # the figures stand, but over fewer pages than asked: a script must be able to tell
        ctx.exit(int(ExitCode.PAGES_FAILED))
