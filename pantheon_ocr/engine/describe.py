"""What a GGUF file holds, for `pantheon-ocr inspect`."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict


def describe(path: str) -> dict:
    """Architecture, config, tensors, parameter count, weight types and memory per storage mode
    of one GGUF (a decoder or an mmproj). Building the decoder validates every tensor."""
    from .format.gguf import meta, open_gguf
    from .loader import tensor_params

    gf = open_gguf(path)
    arch = meta(gf, "general.architecture", str)
    if arch == "clip":
        from .models.lightonocr import check_mmproj

        config = check_mmproj(gf)  # the config and every tensor of the tower and the projector
    else:
        from .format.config import decoder_config
        from .models import decoder_class
        from .text.tokenizer import load_tokenizer

        config = decoder_config(gf)
        decoder_class(arch)(gf, config, "quantized")  # validates every tensor name, shape, type
        if "tokenizer.ggml.model" in gf.metadata:
            load_tokenizer(gf)  # its metadata is checked like a load checks it
    types = Counter(t.qtype.name for t in gf.tensors.values())
    n_params = tensor_params(gf)
    on_disk = sum(t.n_bytes for t in gf.tensors.values())
    # f32 mode: every non-F32 tensor is decoded to 4 bytes per value; F32 ones stay mapped.
    f32 = sum(math.prod(t.shape) * 4 for t in gf.tensors.values())
    return {
        "path": str(gf.path),
        "architecture": arch,
        "config": asdict(config),
        "n_tensors": len(gf.tensors),
        "parameters": n_params,
        "types": dict(sorted(types.items())),
        "tensors": [{"name": t.name, "type": t.qtype.name, "shape": list(t.shape)} for t in gf.tensors.values()],
        "memory_bytes": {"quantized": on_disk, "f32": f32},
    }
