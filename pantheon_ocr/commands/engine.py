"""`pantheon-ocr inspect` and `pantheon-ocr generate`: the engine on its own."""

from __future__ import annotations

import json
import sys

import click

from ..errors import UsageError


@click.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def inspect(model: str, as_json: bool) -> None:
    """Describe a GGUF model: architecture, shapes, quant types, memory per storage mode."""
    from ..engine.describe import describe

    info = describe(model)
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    click.echo(f"{info['path']}\n  architecture: {info['architecture']}")
    for k, v in info["config"].items():
        click.echo(f"  {k}: {v}")
    click.echo(f"  tensors: {info['n_tensors']}  parameters: {info['parameters']:,}")
    click.echo("  types: " + ", ".join(f"{t} {n}" for t, n in info["types"].items()))
    for mode, nbytes in info["memory_bytes"].items():
        click.echo(f"  memory ({mode}): {nbytes / 2**20:,.1f} MiB")


@click.command()
@click.option("--model", "model_path", required=True, type=click.Path(dir_okay=False), help="Decoder GGUF file.")
@click.option("--prompt", required=True, help="Prompt text ('-' reads standard input).")
@click.option("--chat", is_flag=True, help="Wrap the prompt in the model's chat template.")
@click.option("--max-tokens", default=128, show_default=True, type=click.IntRange(1))
@click.option("--weights", type=click.Choice(["quantized", "f32"]), default="quantized", show_default=True)
@click.option("--temperature", default=0.0, show_default=True, type=click.FloatRange(0))
@click.option("--top-p", default=1.0, show_default=True, type=click.FloatRange(0, 1, min_open=True))
@click.option("--seed", type=int, default=None)
def generate(model_path, prompt, chat, max_tokens, weights, temperature, top_p, seed) -> None:
    """Generate text with a GGUF decoder model, streaming tokens as they come."""
    from ..engine.loader import load_model

    if prompt == "-":
        prompt = sys.stdin.read()
    if not prompt:
        raise UsageError("--prompt is empty")
    model = load_model(model_path, weights=weights)
    tok = model.tokenizer
    text = tok.chat_prompt([{"role": "user", "content": prompt}]) if chat else prompt
    ids = tok.encode(text, add_special=True, parse_special=chat)
    stream = tok.stream_decoder(skip_special=True)
    for t in model.stream(ids, max_tokens, temperature, top_p, seed):
        if t in tok.eos_ids:
            break
        click.echo(stream.push(t), nl=False)
    click.echo(stream.flush())
