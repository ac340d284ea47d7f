"""The GPU switches: the decoder's projections on a torch device, without a second decoder.

`DeviceWeight` mirrors the engine's `Weight` with the same contract (`matmul(x [M, in] float32
numpy) -> [M, out] float32 numpy`; `rows`, `dense`, `shape`, `name` delegate to the CPU weight),
holding the matrix dequantized to float32 on the device, uploaded once. `mirror_decoder` returns a
shallow copy of a decoder whose layers (and, optionally, output head) hold DeviceWeights: the same
`forward` / `forward_batch` code then runs with its matmuls on the device, while the KV caches,
attention, norms and RoPE stay numpy on the CPU. A sequence can therefore be prefilled by one
decoder object and decoded by the other.

    --gpu-prefill: prefill through the mirror (layer projections; the 1-row output head stays on
                   the CPU), then decode on the CPU path.
    --gpu-decode:  the batched M=B decode step through the mirror (layers and output head).

Each matmul costs a host->device copy of x, a sync and a device->host copy of the result, and
everything between the products runs in numpy on the CPU: that is why the switches lose where the
CPU has the torch path (on an H100 machine with 16 Xeon cores, 8 full pages with both switches on took
more than 200 s against 34 s with neither, docs/benchmarks.md), and why both are off by default.
"""

from __future__ import annotations

from dataclasses import fields, replace

import numpy as np

from ..format.weights import Weight, _by_row_blocks
from .common import require_torch, resolve_device


class DeviceWeight:
    """A Weight's float32 matrix resident on a torch device; same matmul contract."""

    __slots__ = ("base", "device", "_w", "_torch")

    def __init__(self, base: Weight, device: str):
        torch = require_torch()
        self._torch, self.base, self.device = torch, base, device
        dense = np.ascontiguousarray(base.dense(), dtype=np.float32)  # resident f32: no copy on cpu
        self._w = torch.from_numpy(dense).to(device)

    name = property(lambda self: self.base.name)
    shape = property(lambda self: self.base.shape)
    qtype = property(lambda self: self.base.qtype)
    storage = property(lambda self: f"{self.base.storage}->{self.device}")
    resident = True

    def matmul(self, x: np.ndarray, exact_rows: bool = False) -> np.ndarray:
        """x [M, in] float32 -> x @ W.T [M, out] float32 (computed on the device). exact_rows: in
        blocks of ROW_BLOCK rows as on the CPU (same call shape per row; the device's kernels are
        its own, so the bits are not the CPU path's)."""
        if exact_rows:
            return _by_row_blocks(self._matmul, x)
        return self._matmul(x)

    def _matmul(self, x: np.ndarray) -> np.ndarray:
        torch = self._torch
        xt = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
        if self.device != "cpu":
            xt = xt.to(self.device, non_blocking=False)
        with torch.inference_mode():
            y = torch.nn.functional.linear(xt, self._w)
        return (y if y.device.type == "cpu" else y.cpu()).numpy()

    def rows(self, ids) -> np.ndarray:
        return self.base.rows(ids)

    def dense(self) -> np.ndarray:
        return self.base.dense()

    def nbytes(self) -> int:
        return self._w.numel() * self._w.element_size()

    def __repr__(self) -> str:
        return f"DeviceWeight({self.name!r}, {self.shape}, {self.device})"


def mirror_decoder(decoder, device: str, *, output: bool, uploads: dict | None = None):
    """A shallow copy of `decoder` whose layer projections (and the output head if `output`) are
    DeviceWeights on `device`. `uploads` ({id(Weight): DeviceWeight}) shares uploads between
    mirrors, so each matrix goes to the device once."""
    uploads = {} if uploads is None else uploads

    def mirror(v):
        if isinstance(v, Weight):
            dw = uploads.get(id(v))
            if dw is None:
                dw = uploads[id(v)] = DeviceWeight(v, device)
            return dw
        if isinstance(v, (list, tuple)) and any(isinstance(e, (Weight, list, tuple)) for e in v):
            return type(v)(mirror(e) for e in v)  # MoE experts: [(gate, up, down), ...]
        return v

    layers = [replace(layer, **{f.name: mirror(getattr(layer, f.name)) for f in fields(layer)}) for layer in decoder.layers]
    return decoder.mirror(layers, mirror(decoder.output) if output else None)


class GpuSwitches:
    """The decoders the CPU stage uses for prefill and for decode: the engine's own, or a mirror on
    a torch device (weights uploaded once and shared when both switches are on)."""

    def __init__(self, decoder, *, prefill: bool = False, decode: bool = False, device: str | None = None):
        self.prefill, self.decode = prefill, decode
        self.device = resolve_device(device) if (prefill or decode) else None
        uploads: dict = {}
        self.prefill_decoder = mirror_decoder(decoder, self.device, output=decode, uploads=uploads) if prefill else decoder
        self.decode_decoder = mirror_decoder(decoder, self.device, output=True, uploads=uploads) if decode else decoder
        self.device_bytes = sum(w.nbytes() for w in uploads.values())

    def __repr__(self) -> str:
        return f"GpuSwitches(prefill={self.prefill}, decode={self.decode}, device={self.device!r})"
