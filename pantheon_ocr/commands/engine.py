"""`pantheon-ocr inspect` and `pantheon-ocr generate`: the engine on its own."""

from __future__ import annotations

import json
import sys
from collections import Counter

import click

from ..errors import UsageError


@click.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def inspect(model: str, as_json: bool) -> None:
    """Describe a GGUF model: architecture, shapes, quant types, memory per storage mode."""
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


def describe(path: str) -> dict:
    import numpy as np

    from ..engine.gguf import open_gguf, meta

    gf = open_gguf(path)
    arch = meta(gf, "general.architecture", str)
    if arch == "clip":
        from ..engine.models.pixtral import vision_config

        config = vision_config(gf)
    else:
        from ..engine.config import decoder_config
        from ..engine.models import decoder_class

        config = decoder_config(gf)
        decoder_class(arch)(gf, config, "quantized")  # validates every tensor name, shape, type
    types = Counter(t.qtype.name for t in gf.tensors.values())
    n_params = sum(int(np.prod(t.shape)) for t in gf.tensors.values())
    on_disk = sum(t.n_bytes for t in gf.tensors.values())
    # f32 mode: every non-F32 tensor is decoded to 4 bytes per value; F32 ones stay mapped.
    f32 = sum(int(np.prod(t.shape)) * 4 for t in gf.tensors.values())
    return {
        "path": str(gf.path),
        "architecture": arch,
        "config": {k: v for k, v in vars(config).items()},
        "n_tensors": len(gf.tensors),
        "parameters": n_params,
        "types": dict(sorted(types.items())),
        "tensors": [{"name": t.name, "type": t.qtype.name, "shape": list(t.shape)} for t in gf.tensors.values()],
        "memory_bytes": {"quantized": on_disk, "f32": f32},
    }


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
    from ..engine import load_model

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
