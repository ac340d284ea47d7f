"""`pantheon-ocr bench ...`: throughput benchmarks (figures, never assertions)."""

from __future__ import annotations

import json

import click


@click.group()
def bench() -> None:
    """Throughput benchmarks; configurations side by side in one run."""


@bench.command("generate")
@click.option("--model", "models", multiple=True, required=True, type=click.Path(dir_okay=False),
              help="Decoder GGUF (repeat for several).")
@click.option("--weights", "storages", multiple=True, type=click.Choice(["quantized", "f32"]),
              default=("quantized", "f32"), show_default=True)
@click.option("--prefill-tokens", default=512, show_default=True, type=click.IntRange(1))
@click.option("--decode-tokens", default=16, show_default=True, type=click.IntRange(1))
@click.option("--json", "as_json", is_flag=True)
def generate(models, storages, prefill_tokens, decode_tokens, as_json) -> None:
    """Prefill and decode tokens/s per model and storage mode, with a numpy GEMM roofline."""
    from ..bench_engine import bench_decoder

    rows = [bench_decoder(m, s, prefill_tokens, decode_tokens).row() for m in models for s in storages]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    click.echo(f"{'model':40} {'storage':9} {'prefill tok/s':>13} {'roofline':>9} {'ratio':>6} "
               f"{'decode tok/s':>12} {'roofline':>9}")
    for r in rows:
        click.echo(f"{r['model'][-40:]:40} {r['storage']:9} {r['prefill_tok_s']:13.1f} "
                   f"{r['roofline_prefill_tok_s']:9.1f} {r['roofline_prefill_tok_s'] / r['prefill_tok_s']:6.2f} "
                   f"{r['decode_tok_s']:12.2f} {r['roofline_decode_tok_s']:9.1f}")
