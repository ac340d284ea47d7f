"""`pantheon-ocr inspect` and `pantheon-ocr generate`: the engine on its own."""

from __future__ import annotations

import json
import sys

import click

from ..errors import ModelError, OptionError, UsageError
from ..options import SamplingOptions
from .options import table_options


@click.command()
@click.argument("model", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def inspect(model: str | None, as_json: bool) -> None:
    """Describe a GGUF model: architecture, shapes, quant types, memory per storage mode.

    MODEL is one GGUF file, or what --model takes: a folder holding a text GGUF and its mmproj,
    or the name of a pulled model (lightonocr-2, owner/repo[:QUANT]); none: the bundled reader, as
    when no --model is given. For a pair, both files are described and checked to fit together."""
    from pathlib import Path

    from ..engine.describe import describe
    from ..engine.format.pairing import check_pair
    from ..modelfiles.catalog import parse_name
    from ..modelfiles.resolve import resolve_model

    path = Path(model) if model is not None else None
    if path is not None and ((path.exists() and not path.is_dir()) or not path.exists() and parse_name(model) is None):
        info = describe(model)  # one file (a missing one, a FIFO, a device: says so, exit 3)
        click.echo(json.dumps(info, indent=2) if as_json else "\n".join(_described(info)))
        return
    try:
        text, mmproj = resolve_model(model, None)
    except OptionError as e:  # said of --model, which inspect takes as its argument
        if e.option != "model":
            raise
        raise OptionError(None, f"{e.value if e.value is not None else model or 'the bundled reader'}: {e.problem}") from None
    infos = {"text": describe(str(text)), "mmproj": describe(str(mmproj))}
    try:
        check_pair(text, mmproj)
        fits = None
    except ModelError as e:  # described all the same (what each file is tells why), then said: exit 3
        fits = e
    if as_json:
        click.echo(json.dumps({**infos, "pair": "fits" if fits is None else f"does not fit: {fits}"}, indent=2))
    else:
        for info in infos.values():
            click.echo("\n".join(_described(info)))
        if fits is None:
            click.echo(f"pair: {text.name} + {mmproj.name} fit together (one LightOnOCR model)")
    if fits is not None:
        raise fits


def _described(info: dict) -> list[str]:
    lines = [f"{info['path']}", f"  architecture: {info['architecture']}"]
    # float32 metadata printed as float64 is noise (eps 9.999999974752427e-07): 7 digits are all it holds
    lines += [f"  {k}: {f'{v:.7g}' if isinstance(v, float) else v}" for k, v in info["config"].items() if k != "arch"]
    lines.append(f"  tensors: {info['n_tensors']}  parameters: {info['parameters']:,}")
    lines.append("  types: " + ", ".join(f"{t} {n}" for t, n in info["types"].items()))
    lines += [f"  memory ({mode}): {nbytes / 2**20:,.1f} MiB" for mode, nbytes in info["memory_bytes"].items()]
    return lines


@click.command()
@click.option("--model", "model_path", required=True, type=click.Path(dir_okay=False), help="Decoder GGUF file.")
@click.option("--prompt", required=True, help="Prompt text ('-' reads standard input).")
@click.option("--chat", is_flag=True, help="Wrap the prompt in the model's chat template.")
@click.option("--weights", type=click.Choice(["quantized", "f32"]), default="quantized", show_default=True,
              help="Weight storage: kept quantized (least memory) or resident float32 (numpy, the reference).")
# the sampling table's options, as transcribe's; a generation is no page, so its own budget
@table_options(SamplingOptions, "max_tokens", "temperature", "top_p", "seed",
               max_tokens={"default": 128, "help": "New tokens at most."})
def generate(model_path, prompt, chat, max_tokens, weights, temperature, top_p, seed) -> None:
    """Generate text with a GGUF decoder model, streaming tokens as they come."""
    from ..engine.loader import load_model

    if prompt == "-":
        prompt = sys.stdin.buffer.read().decode("utf-8", "surrogateescape")
    if not prompt:
        raise UsageError("--prompt is empty")
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as e:  # bytes that are no UTF-8 (an argument or standard input as they came)
        at = len(prompt[: e.start].encode("utf-8", "surrogateescape"))  # the byte, not the character
        raise UsageError(f"--prompt is not UTF-8 text (byte {at}): give it as UTF-8") from None
    model = load_model(model_path, weights=weights)
    tok = model.tokenizer
    text = tok.chat_prompt([{"role": "user", "content": prompt}]) if chat else prompt
    ids = tok.encode(text, add_special=True, parse_special=chat)
    cfg = model.decoder.cfg
    if not cfg.sliding_window:  # a full-attention model holds n_ctx positions, prompt and new tokens together
        if len(ids) >= cfg.n_ctx:
            raise UsageError(f"--prompt is {len(ids):,} tokens: the model's context holds {cfg.n_ctx:,}, and at least "
                             "one new token must fit")
        if len(ids) + max_tokens > cfg.n_ctx:
            max_tokens = cfg.n_ctx - len(ids)
            click.echo(f"note: at most {max_tokens:,} new tokens fit the model's context of {cfg.n_ctx:,} "
                       f"after the prompt's {len(ids):,}", err=True)
    stream = tok.stream_decoder(skip_special=True)
    for t in model.stream(ids, max_tokens, temperature, top_p, seed):
        if t in tok.eos_ids:
            break
        click.echo(stream.push(t), nl=False)
    click.echo(stream.flush())
