"""LightOnOCR: the mmproj projector and the composition vision encoder -> Qwen3 decoder.

    image -> preprocess [3, H, W] -> PixtralVision [N, D] -> projector [M, n_embd]
          -> prompt with M <|image_pad|> ids whose embedding rows are overridden -> decoder.

Hugging Face transformers is the reference: the projector's RMSNorm uses the TEXT eps, GELU is
the exact erf one, the chat layout has no wrapper tokens around the image and positions are
plain 0..T-1. The page API over this model (sampling, stopping, batching) is page_engine.OCREngine.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

import numpy as np

from ...errors import ModelError
from ..attention import TowerOptions
from ..format.gguf import GGUFFile, meta, meta_array, open_gguf
from ..ops import add_bias, gelu_erf, rmsnorm
from ..image.preprocess import ImageSource, preprocess
from ..text_model import TextModel
from ..format import names as N
from ..format.weights import Storage, WeightLoader
from .pixtral import PixtralVision, VisionConfig, keep, vision_config
from .reader import ReadingHints

IMAGE_TOKEN = "<|image_pad|>"
# The prompt, as vocabulary pieces (byte-level BPE spelling: "Ċ" is "\n"); None marks the image run.
# Renders `<|im_start|>system<|im_end|>\n<|im_start|>user\n{image}<|im_end|>\n<|im_start|>assistant\n`.
PROMPT_PIECES = ("<|im_start|>", "system", "<|im_end|>", "Ċ", "<|im_start|>", "user", "Ċ", None,
                 "<|im_end|>", "Ċ", "<|im_start|>", "assistant", "Ċ")
STOP_PIECES = ("<|im_end|>", "<|endoftext|>")


def merge_patches(x: np.ndarray, h: int, w: int, s: int) -> np.ndarray:
    """Patch features [h*w, D] (row-major grid) -> [(h//s)*(w//s), D*s*s]: each s x s block,
    row-major over blocks, becomes one vector with index channel*s*s + dy*s + dx (torch unfold
    order). An incomplete last row/column of patches is dropped."""
    d = x.shape[1]
    hs, ws = h // s, w // s
    g = x.reshape(h, w, d)[: hs * s, : ws * s]  # [hs*s, ws*s, D]
    g = g.reshape(hs, s, ws, s, d)  # [hs, dy, ws, dx, D]
    g = g.transpose(0, 2, 4, 1, 3)  # [hs, ws, D, dy, dx]
    return np.ascontiguousarray(g.reshape(hs * ws, d * s * s))  # [M, D*s*s]


class Projector:
    """RMSNorm (text eps) -> s x s patch merger -> mm.patch_merger -> mm.1 (+b) -> erf GELU -> mm.2 (+b)."""

    def __init__(self, w: WeightLoader, cfg: VisionConfig, eps: float):
        d, s, p = cfg.n_embd, cfg.merge, cfg.projection_dim
        self.merge, self.eps = s, eps
        self.norm = w.tensor(N.MM_INPUT_NORM, (d,))
        self.merger = w.matrix(N.MM_PATCH_MERGER, (d, d * s * s))
        self.linear_1 = w.matrix(N.MM_1, (p, d))
        self.bias_1 = w.optional_tensor(N.MM_1_BIAS, (p,))
        self.linear_2 = w.matrix(N.MM_2, (p, p))
        self.bias_2 = w.optional_tensor(N.MM_2_BIAS, (p,))

    def forward(self, x: np.ndarray, grid: tuple[int, int], capture: dict | None = None) -> np.ndarray:
        """Vision features [N, D] on a (h, w) patch grid -> image token embeddings [M, n_embd]."""
        return self.forward_many([x], [grid], capture)[0]

    def forward_many(self, xs: list[np.ndarray], grids: list[tuple[int, int]], capture: dict | None = None
                     ) -> list[np.ndarray]:
        """Several images' features at once (their merged rows share each matmul)."""
        merged = [merge_patches(rmsnorm(x, self.norm, self.eps), h, w, self.merge)  # [M_i, D*s*s]
                  for x, (h, w) in zip(xs, grids)]
        if capture is not None:
            keep(capture, "proj_norm", rmsnorm(xs[0], self.norm, self.eps))
        x = np.concatenate(merged)  # [M, D*s*s]
        keep(capture, "merger_in", x)
        x = self.merger.matmul(x)  # [M, D]
        keep(capture, "merger_out", x)
        x = add_bias(self.linear_1.matmul(x), self.bias_1)  # [M, n_embd]
        keep(capture, "proj_linear_1", x)
        x = add_bias(self.linear_2.matmul(gelu_erf(x)), self.bias_2)  # [M, n_embd]
        keep(capture, "image_features", x)
        ends = np.cumsum([len(m) for m in merged])
        return np.split(x, ends[:-1])


def check_mmproj(gf: GGUFFile) -> VisionConfig:
    """Validate an mmproj on its own (`inspect`): its config and every tensor of the vision tower
    and the projector (names, shapes, types), without reading the weights (quantized storage
    only maps them). The projector's norm eps comes from the text model, so any eps does here."""
    vc = vision_config(gf)
    PixtralVision(gf, vc, "quantized")
    Projector(WeightLoader(gf, "quantized"), vc, vc.eps)
    return vc


class LightOnOCR:
    """A LightOnOCR text GGUF + mmproj GGUF pair, ready to transcribe page images.

    `.text` is the TextModel (`.decoder`, `.config`, `.tokenizer`); `.vision` the Pixtral tower;
    `.projector`; `.vision_config`; `.longest_edge` the preprocessing target of the longest side.
    """

    def __init__(self, model_path: str | Path, mmproj_path: str | Path, weights: Storage = "quantized",
                 vision_weights: Storage | None = None, *, vision_tower: TowerOptions = TowerOptions(),
                 text_tower: TowerOptions = TowerOptions()):
        self.mmproj: GGUFFile = open_gguf(mmproj_path)
        self.vision_config = vision_config(self.mmproj)
        try:
            self.text = TextModel(model_path, weights, text_tower)
        except ModelError:
            _explain_swapped(model_path)
            raise
        c, vc = self.text.config, self.vision_config
        if vc.projection_dim != c.n_embd:
            raise ModelError(
                self.mmproj.path,
                f"this mmproj does not fit the text model {Path(model_path).name}: its "
                f"'clip.vision.projection_dim' is {vc.projection_dim} but the text model's "
                f"'{c.arch}.embedding_length' is {c.n_embd}",
            )
        self._vocab: dict[str, int] | None = None
        self.image_token_id = self._vocab_id(IMAGE_TOKEN)
        # vision_weights: the tower's own storage (default: as the text's). "quantized" when another
        # backend (torch, Core ML) runs the vision stage: it keeps its own copy, and this one then
        # only maps the file instead of holding a second resident copy.
        vw = vision_weights or weights
        self.vision = PixtralVision(self.mmproj, vc, vw, vision_tower)
        self.projector = Projector(WeightLoader(self.mmproj, vw), vc, c.eps)
        self.weights = weights

    # -- parts -------------------------------------------------------------------------------
    @property
    def decoder(self):
        return self.text.decoder

    @property
    def config(self):
        return self.text.config

    @property
    def tokenizer(self):
        return self.text.tokenizer

    @property
    def longest_edge(self) -> int:
        return self.vision_config.longest_edge

    @property
    def hints(self) -> ReadingHints:
        """How the model wants its pages cut (pantheon.reader.* keys; whole pages for LightOnOCR)."""
        return self.vision_config.hints

    @cached_property
    def stop_ids(self) -> frozenset[int]:
        """End-of-generation ids: the tokenizer's (llama.cpp's EOG set: eos, eot, <|im_end|>,
        <|endoftext|>, ...) plus `<|im_end|>` and `<|endoftext|>` by name."""
        named = {self._vocab_lookup(p) for p in STOP_PIECES} - {None}
        return frozenset(self.tokenizer.eos_ids) | frozenset(named)

    # -- vision ------------------------------------------------------------------------------
    def preprocess(self, image: ImageSource, name: str | None = None) -> np.ndarray:
        """Image (path, bytes, PIL image, uint8 array) -> float32 pixels [3, H, W]. InputError if bad."""
        vc = self.vision_config
        return preprocess(image, longest_edge=vc.longest_edge, patch_size=vc.patch_size, mean=vc.image_mean,
                          std=vc.image_std, merge=vc.merge, name=name)

    def encode_image(self, image, capture: dict | None = None) -> np.ndarray:
        """Image or pixels [3, H, W] float -> image token embeddings [M, n_embd] float32."""
        pixels = image if _is_pixels(image) else self.preprocess(image)
        keep(capture, "pixel_values", pixels)
        x, grid = self.vision.forward(pixels, capture)  # [N, D], (h, w)
        return self.projector.forward(x, grid, capture)  # [M, n_embd]

    def encode_images(self, images: list) -> list[np.ndarray]:
        """Several images at once (a page's line pieces): every matmul of the tower and the
        projector runs once over all their patches. Image token embeddings [M_i, n_embd] each."""
        pixels = [im if _is_pixels(im) else self.preprocess(im) for im in images]
        xs, grids = self.vision.forward_many(pixels)
        return self.projector.forward_many(xs, grids)

    def n_image_tokens(self, height: int, width: int) -> int:
        """Image tokens for pixels of height x width (already resized)."""
        s = self.vision_config.patch_size * self.vision_config.merge
        return (height // s) * (width // s)

    # -- prompt and text ---------------------------------------------------------------------
    def prompt_ids(self, n_image_tokens: int) -> list[int]:
        """`<|im_start|>system<|im_end|>\\n<|im_start|>user\\n` + <|image_pad|> x M +
        `<|im_end|>\\n<|im_start|>assistant\\n` as token ids."""
        if n_image_tokens <= 0:
            raise ValueError(f"an image needs at least one image token, got {n_image_tokens}")
        ids: list[int] = []
        for piece in PROMPT_PIECES:
            if piece is None:
                ids.extend([self.image_token_id] * n_image_tokens)
            else:
                ids.append(self._piece_id(piece))
        return ids

    def prompt_and_rows(self, features: np.ndarray):
        """Prompt ids for image features [M, n_embd] and the (image row indices, features)
        embedding-row overrides that go with them."""
        features = np.asarray(features, dtype=np.float32)
        if features.ndim != 2 or features.shape[1] != self.config.n_embd or not len(features):
            raise ValueError(f"image features must be [M > 0, {self.config.n_embd}], got {list(features.shape)}")
        ids = self.prompt_ids(features.shape[0])
        idx = np.flatnonzero(np.asarray(ids) == self.image_token_id)  # [M] image rows, in order
        return ids, (idx, features)

    def decode(self, ids, cut: bool = False) -> str:
        """Token ids -> text; control tokens (e.g. <|im_end|>) are left out. cut: see Tokenizer.decode."""
        return self.tokenizer.decode([int(i) for i in ids], skip_special=True, cut=cut)

    # -- helpers -----------------------------------------------------------------------------
    def _piece_id(self, piece: str) -> int:
        """A vocabulary entry's id through the tokenizer; if the tokenizer cannot be built (e.g.
        an unknown pre-tokenizer), straight from the GGUF token list, which is the same table."""
        try:
            tid = self.tokenizer.token_id(piece)
        except ModelError:
            tid = None
        return int(tid) if tid is not None else self._vocab_id(piece)

    def _vocab_lookup(self, piece: str) -> int | None:
        if self._vocab is None:
            tokens = meta_array(self.text.gguf, "tokenizer.ggml.tokens", str)
            self._vocab = {t: i for i, t in enumerate(tokens)}
        return self._vocab.get(piece)

    def _vocab_id(self, piece: str) -> int:
        tid = self._vocab_lookup(piece)
        if tid is None:
            raise ModelError(self.text.path, f"the vocabulary has no {piece!r} token: not a LightOnOCR (Qwen) text model")
        return tid

    def __repr__(self) -> str:
        return f"LightOnOCR({str(self.text.path)!r}, {str(self.mmproj.path)!r}, weights={self.weights!r})"


def _explain_swapped(model_path) -> None:
    """If the 'text model' is an mmproj file, say so instead of 'unsupported architecture clip'."""
    try:
        arch = meta(open_gguf(model_path), "general.architecture", str, "")
    except ModelError:
        return
    if arch == "clip":
        raise ModelError(model_path, "this is a vision projector (mmproj) file, not the text model: "
                                     "are the model and mmproj paths swapped?")


def _is_pixels(x) -> bool:
    return isinstance(x, np.ndarray) and x.ndim == 3 and x.shape[0] == 3 and np.issubdtype(x.dtype, np.floating)





__all__ = ["LightOnOCR", "Projector", "merge_patches"]
