"""What a GGUF file holds, for `pantheon-ocr inspect`."""

from __future__ import annotations

from collections import Counter

import numpy as np

def describe(path: str) -> dict:
    """Architecture, config, tensors, parameter count, weight types and memory per storage mode
    of one GGUF (a decoder or an mmproj). Building the decoder validates every tensor."""
    from .gguf import meta, open_gguf

    gf = open_gguf(path)
    arch = meta(gf, "general.architecture", str)
    if arch == "clip":
        from .models.pixtral import vision_config

        config = vision_config(gf)
    else:
        from .config import decoder_config
        from .models import decoder_class

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
