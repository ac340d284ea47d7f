"""Core ML vision backend: the torch module of torch_vision.py, traced per patch-grid bucket and
converted with coremltools to an ML program (`.mlpackage`), cached on disk.

Buckets (buckets.py): a page's h x w patch grid is padded to a bucket grid (sides rounded up to 8
patches, at most the full-page side, 110 for 1540 px) and the padding is masked out of attention,
which leaves the real patches' results exact. So a corpus of Letter and A4 pages in both
orientations converts a handful of fixed-shape programs once, ever, instead of one per page size;
fixed shapes are also what the Neural Engine wants (flexible RangeDim inputs run on CPU/GPU only).

Cache: `<mmproj dir>/.pantheon-ocr-cache/coreml/` when that directory is writable, else
`$PANTHEON_OCR_CACHE/coreml` or `~/.cache/pantheon-ocr/coreml`. A package is named
`vision-v1-<sha256 of the mmproj, 16 hex>-<hb>x<wb>-<fp32|fp16>.mlpackage` and carries the full
hash, bucket and precision in its metadata; it is written under a temporary name and renamed, so
concurrent runs never see half a package.

Program I/O: inputs `pixels` float32 [1, 3, hb*14, wb*14] (the page's pixels top-left, zeros
elsewhere) and `patch_mask` float32 [1, hb*wb] (1 = real patch); output `features` float32
[(hb/2)*(wb/2), n_embd] (every merged token of the bucket; `merged_rows` picks the page's).

Conversion runs anywhere coremltools installs (Linux too); prediction needs macOS 15 or later
(the fused attention op, see DEPLOYMENT_TARGET).
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
import tempfile
import threading
import warnings
from pathlib import Path

import numpy as np

from .common import COREML_EXTRA, BackendUnavailable, check_pixels, has_module, require_torch, user_cache_dir
from .buckets import GRANULE, bucket_grid, max_grid_side, merged_rows, pad_pixels, patch_mask

FORMAT = "v1"  # bump when the traced module changes: old packages are then ignored
# macOS 15 / iOS 18 is the first opset with a fused scaled_dot_product_attention op; before it
# coremltools decomposes attention into matmul + softmax + matmul, materialising [16, N, N] scores
# (6 GB in float32 for a 1540 px page).
DEPLOYMENT_TARGET, MIN_MACOS = "macOS15", 15
PRECISIONS = {"float32": "fp32", "float16": "fp16"}
COMPUTE_UNITS = ("ALL", "CPU_AND_GPU", "CPU_AND_NE", "CPU_ONLY")
INPUTS, OUTPUT = ("pixels", "patch_mask"), "features"
log = logging.getLogger("pantheon_ocr.coreml")


def require_coreml(run: bool = False):
    """coremltools (and torch, which the conversion traces), or BackendUnavailable. run=True also
    requires macOS, the only place Core ML executes programs."""
    if not has_module("coremltools"):
        raise BackendUnavailable(None, f"the Core ML vision backend needs coremltools, which is not installed: {COREML_EXTRA}")
    require_torch()
    if run and platform.system() != "Darwin":
        raise BackendUnavailable("vision_backend", f"Core ML runs models only on macOS (this is {platform.system()}); "
                                                   "use the torch or numpy vision backend here", "coreml")
    if run and macos_major() < MIN_MACOS:
        raise BackendUnavailable("vision_backend", f"the Core ML vision programs need macOS {MIN_MACOS} or later (fused "
                                                   f"attention); this is macOS {platform.mac_ver()[0]}: use the torch "
                                                   "vision backend on the mps device", "coreml")
    import coremltools as ct

    return ct


def macos_major() -> int:
    """The running macOS major version (0 elsewhere)."""
    try:
        return int(platform.mac_ver()[0].split(".")[0] or 0)
    except ValueError:
        return 0


def file_sha256(path: str | Path, chunk: int = 8 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def default_cache_dir(mmproj_path: str | Path) -> Path:
    """Next to the model if that directory is writable, else the user cache."""
    here = Path(mmproj_path).resolve().parent
    if os.access(here, os.W_OK):
        return here / ".pantheon-ocr-cache" / "coreml"
    return user_cache_dir() / "coreml"


class CoreMLVisionBackend:
    """VisionBackend over cached Core ML programs, one per bucket. `runtime=False` converts
    without ever loading a program (what the Linux tests and a pre-conversion step use)."""

    name = "coreml"

    def __init__(self, vlm, dtype: str = "float32", cache_dir: str | Path | None = None,
                 compute_units: str = "ALL", granule: int = GRANULE, runtime: bool = True):
        if dtype not in PRECISIONS:
            raise BackendUnavailable("vision_dtype", "Core ML computes in float32 or float16 (float16 runs on the "
                                                     "Neural Engine)", dtype)
        if compute_units not in COMPUTE_UNITS:
            raise BackendUnavailable("compute_units", f"must be one of {', '.join(COMPUTE_UNITS)}, not {compute_units!r}")
        self.ct = require_coreml(run=runtime)
        self.vlm, self.dtype, self.compute_units, self.granule = vlm, dtype, compute_units, granule
        self.device = f"coreml:{compute_units}"
        self.reason = "chosen"
        self.runtime = runtime
        self.mmproj_path = Path(vlm.mmproj.path)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir(self.mmproj_path)
        vc = vlm.vision_config
        self.patch, self.merge = vc.patch_size, vc.merge
        self.max_side = max_grid_side(vc.longest_edge, vc.patch_size, vc.merge)
        self._sha: str | None = None
        self._module = None  # the float32 torch module, built on the first conversion
        self._models: dict[tuple[int, int], object] = {}
        self._lock = threading.Lock()
        self.conversions = 0  # programs converted by this backend (cache misses)

    # -- cache -------------------------------------------------------------------------------
    @property
    def mmproj_sha256(self) -> str:
        if self._sha is None:
            self._sha = file_sha256(self.mmproj_path)
        return self._sha

    def bucket(self, h: int, w: int) -> tuple[int, int]:
        return bucket_grid(h, w, max_side=self.max_side, granule=self.granule)

    def package_path(self, bucket: tuple[int, int]) -> Path:
        hb, wb = bucket
        return self.cache_dir / f"vision-{FORMAT}-{self.mmproj_sha256[:16]}-{hb}x{wb}-{PRECISIONS[self.dtype]}.mlpackage"

    def ensure_package(self, bucket: tuple[int, int]) -> Path:
        """The cached program for `bucket`, converting it first if it is not there."""
        path = self.package_path(bucket)
        if path.exists():
            return path
        with self._lock:
            if path.exists():
                return path
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            log.info("converting the vision encoder to Core ML for a %dx%d patch grid -> %s", *bucket, path)
            model = self.convert(bucket)
            tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=self.cache_dir)) / path.name
            try:
                model.save(str(tmp))
                try:
                    os.rename(tmp, path)
                except OSError:
                    if not path.exists():  # lost a race to another process: theirs is as good
                        raise
            finally:
                shutil.rmtree(tmp.parent, ignore_errors=True)
            self.conversions += 1
        return path

    def convert(self, bucket: tuple[int, int]):
        """Trace the module on the bucket grid and convert it to an ML program (not saved)."""
        import torch

        from .torch_vision import FixedGrid, LightOnOCRVision

        ct = self.ct
        hb, wb = bucket
        if self._module is None:
            self._module = LightOnOCRVision(self.vlm.vision, self.vlm.projector, torch.float32).eval()
        fixed = FixedGrid(self._module, hb, wb).eval()
        px = torch.zeros(1, 3, hb * self.patch, wb * self.patch)
        mask = torch.ones(1, hb * wb)
        with torch.no_grad(), warnings.catch_warnings():
            # torch.jit.trace is deprecated in favour of torch.export, but it is what
            # coremltools converts best; the rope tables are constants of the bucket on purpose.
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            traced = torch.jit.trace(fixed, (px, mask), check_trace=False)
        precision = ct.precision.FLOAT32 if self.dtype == "float32" else ct.precision.FLOAT16
        model = ct.convert(
            traced,
            inputs=[ct.TensorType(name=INPUTS[0], shape=tuple(px.shape), dtype=np.float32),
                    ct.TensorType(name=INPUTS[1], shape=tuple(mask.shape), dtype=np.float32)],
            outputs=[ct.TensorType(name=OUTPUT, dtype=np.float32)],
            convert_to="mlprogram",
            compute_precision=precision,
            minimum_deployment_target=getattr(ct.target, DEPLOYMENT_TARGET),
            compute_units=ct.ComputeUnit[self.compute_units],
        )
        model.short_description = "pantheon-ocr LightOnOCR vision encoder + projector"
        model.user_defined_metadata.update({
            "pantheon_ocr.format": FORMAT, "pantheon_ocr.mmproj_sha256": self.mmproj_sha256,
            "pantheon_ocr.bucket": f"{hb}x{wb}", "pantheon_ocr.precision": self.dtype,
        })
        return model

    # -- running -----------------------------------------------------------------------------
    def _model(self, bucket: tuple[int, int]):
        model = self._models.get(bucket)
        if model is None:
            if not self.runtime:
                raise BackendUnavailable(None, "this Core ML backend was built to convert only (runtime=False)")
            path = self.ensure_package(bucket)
            model = self.ct.models.MLModel(str(path), compute_units=self.ct.ComputeUnit[self.compute_units])
            self._models[bucket] = model
        return model

    def predict(self, bucket: tuple[int, int], pixels: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Run the bucket's program on padded pixels [1, 3, ., .] and mask [1, hb*wb]."""
        out = self._model(bucket).predict({INPUTS[0]: pixels, INPUTS[1]: mask})
        return np.asarray(out[OUTPUT], dtype=np.float32)

    def encode(self, pixels: np.ndarray) -> np.ndarray:
        px = check_pixels(pixels)
        p = self.patch
        if px.shape[1] % p or px.shape[2] % p or not px.shape[1] or not px.shape[2]:
            raise ValueError(f"pixels must be [3, H, W] with H, W positive multiples of {p}, got {list(px.shape)}")
        h, w = px.shape[1] // p, px.shape[2] // p
        hb, wb = self.bucket(h, w)
        out = self.predict((hb, wb), pad_pixels(px, hb, wb, p)[None], patch_mask(h, w, hb, wb)[None])
        return np.ascontiguousarray(out[merged_rows(h, w, hb, wb, self.merge)])

    def __repr__(self) -> str:
        return (f"CoreMLVisionBackend(dtype={self.dtype!r}, compute_units={self.compute_units!r}, "
                f"cache_dir={str(self.cache_dir)!r})")
