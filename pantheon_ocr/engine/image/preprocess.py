"""Image -> pixel values for the LightOnOCR (Pixtral) vision encoder, with Hugging Face semantics.

The steps (those of the Hugging Face Pixtral image processor):
1. decode, apply the EXIF orientation (transformers' `load_image` does), convert to RGB with any
   alpha composited onto white (images.to_rgb, the same conversion as page rendering);
2. if the longest side exceeds `longest_edge`: ratio = max(h, w) / longest_edge,
   h = floor(h / ratio), w = floor(w / ratio) (never upscale);
3. round each side UP to a multiple of the patch size (14) and resize ONCE from the original with
   PIL bicubic (a stretch, no padding);
4. x / 255 (in float64, then float32, as transformers does), then (x - mean) / std per channel.

Deviations from transformers, on purpose: 16-bit, 32-bit and float grey images are scaled to 8
bits (PIL's convert("RGB") clips them at 255, which turns most 16-bit scans white), and images too
small to give one merged image token raise `InputError` instead of failing deep inside the model.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Sequence, Union

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from ...errors import InputError
from .images import to_rgb

ImageSource = Union[str, Path, bytes, "Image.Image", np.ndarray]


def target_size(height: int, width: int, longest_edge: int, patch_size: int) -> tuple[int, int]:
    """(H, W) the processor resizes an image of height x width to: downscale-only with floor so the
    longest side fits, then each side rounded up to a multiple of patch_size. A side may be 0."""
    ratio = max(height / longest_edge, width / longest_edge)
    if ratio > 1:
        height = int(math.floor(height / ratio))
        width = int(math.floor(width / ratio))
    return ((height - 1) // patch_size + 1) * patch_size, ((width - 1) // patch_size + 1) * patch_size


def image_name(source) -> str:
    """A short name for error messages: the path, the PIL file name, or a description."""
    if isinstance(source, (str, Path)):
        return str(source)
    name = getattr(source, "filename", None)
    if name:
        return str(name)
    if isinstance(source, bytes):
        return f"<{len(source)} bytes of image data>"
    if isinstance(source, np.ndarray):
        return f"<array {list(source.shape)} {source.dtype}>"
    return "<image>"


def load_image(source: ImageSource, name: str | None = None) -> Image.Image:
    """Decode `source` (path, encoded bytes, PIL image, or uint8 array [H, W(, 1|3|4)]) into a fully
    loaded 8-bit RGB PIL image with alpha composited onto white. Raises InputError."""
    name = name or image_name(source)
    try:
        if isinstance(source, np.ndarray):
            image = _from_array(source, name)
        elif isinstance(source, Image.Image):
            image = source
        elif isinstance(source, bytes):
            image = Image.open(io.BytesIO(source))
        elif isinstance(source, (str, Path)):
            image = Image.open(source)
        else:
            raise InputError(name, f"cannot read an image from a {type(source).__name__}")
        image.load()  # decode now: a truncated file fails here, not later
        image = ImageOps.exif_transpose(image)
        if image.width < 1 or image.height < 1:
            raise InputError(name, f"image has no pixels ({image.width}x{image.height})")
        return to_rgb(image)
    except InputError:
        raise
    except FileNotFoundError:
        raise InputError(name, "image file not found") from None
    except IsADirectoryError:
        raise InputError(name, "is a directory, not an image") from None
    except PermissionError:
        raise InputError(name, "permission denied") from None
    except UnidentifiedImageError:
        raise InputError(name, "not an image file (or a format PIL cannot read)") from None
    except Image.DecompressionBombError as exc:
        raise InputError(name, f"image is too large to decode safely ({exc})") from None
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        # PIL reports truncated and corrupt data as OSError/SyntaxError/ValueError/EOFError.
        raise InputError(name, f"cannot decode image: {exc}") from None


def _from_array(arr: np.ndarray, name: str) -> Image.Image:
    if arr.ndim == 3 and arr.shape[-1] == 1:
        arr = arr[..., 0]
    if arr.dtype != np.uint8 or not (arr.ndim == 2 or (arr.ndim == 3 and arr.shape[-1] in (3, 4))):
        raise InputError(name, f"expected a uint8 array [H, W], [H, W, 3] or [H, W, 4], got {arr.dtype} {list(arr.shape)}")
    return Image.fromarray(np.ascontiguousarray(arr))


def preprocess(source: ImageSource, *, longest_edge: int, patch_size: int, mean: Sequence[float],
               std: Sequence[float], merge: int = 2, name: str | None = None) -> np.ndarray:
    """Image -> float32 pixel values [3, H, W] (H, W multiples of patch_size). Raises InputError for
    unreadable images and for images that give no merged image token (< merge patches a side)."""
    name = name or image_name(source)
    rgb = load_image(source, name)
    w0, h0 = rgb.size
    h, w = target_size(h0, w0, longest_edge, patch_size)
    need = patch_size * merge
    if h < need or w < need:
        raise InputError(
            name,
            f"image of {w0}x{h0} px is too small or too thin: it is resized to {w}x{h} px, and each side "
            f"needs at least {need} px ({merge}x{merge} patches of {patch_size} px) to give an image token",
        )
    if (w, h) != (w0, h0):
        rgb = rgb.resize((w, h), resample=Image.Resampling.BICUBIC)
    x = np.asarray(rgb, dtype=np.uint8)  # [H, W, 3]
    x = (x.astype(np.float64) * (1 / 255)).astype(np.float32)  # [H, W, 3]
    x = (x - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)  # [H, W, 3]
    return np.ascontiguousarray(x.transpose(2, 0, 1))  # [3, H, W]
