"""Every intermediate of LightOnOCR on one image, named like the reference fixtures' ref_*.npz
(pixel_values, vision_*, proj_*, merger_*, image_features, input_ids, inputs_embeds,
text_layer_i, text_hidden, text_final_norm, logits_last), through the engine's own code:
the vision tower's capture dict, then the decoder one block at a time."""

from __future__ import annotations

import numpy as np

from pantheon_ocr.engine.cache import Rows
from pantheon_ocr.engine.ops import rmsnorm, rope_angles


def stage_dump(vlm, image) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    features = vlm.encode_image(image, capture=out)
    ids, rows = vlm.prompt_and_rows(features)
    dec, c = vlm.decoder, vlm.config
    out["input_ids"] = np.asarray(ids, dtype=np.int64)
    x = dec.embed(ids, rows)  # [T, n_embd]
    out["inputs_embeds"] = x
    seq = Rows([dec.new_state()], [len(ids)])
    cos, sin = rope_angles(seq.positions / c.rope_linear_scale, dec.freqs)
    for i, layer in enumerate(dec.layers):
        x = dec.block(i, layer, x, cos, sin, seq)  # [T, n_embd]
        out[f"text_layer_{i}"] = x
    out["text_hidden"] = x
    out["text_final_norm"] = rmsnorm(x, dec.output_norm, c.eps)
    out["logits_last"] = dec.logits_of(x[-1:])[0]
    return out
