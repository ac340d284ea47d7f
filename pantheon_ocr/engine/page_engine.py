"""The real engine behind the pipeline's PageEngine protocol: LightOnOCR pages as sequences,
prefilled one by one and decoded together (forward_batch), each leaving at EOS, max tokens or
the repetition guard.

Accelerators (engine/backends): `vision_backend` runs the vision stage (torch, Core ML; None =
the numpy encoder in the model); `gpu_prefill` / `gpu_decode` run the prefill or batched decode
projections on a torch `device` through a mirrored decoder (backends.device.GpuSwitches), off by
default. The KV caches stay numpy, so a page prefilled on the device decodes on the CPU path."""

from __future__ import annotations

import numpy as np
from PIL import Image

from ..pipeline.types import SamplingOptions
from .batch import batch_logits
from .models.lightonocr import LightOnOCR
from .models.llama import DecoderState
from .sampling import RepetitionGuard, Sampler, SamplingParams


class PageSeq:
    """One page being decoded: its KV cache state, sampler and generated ids."""

    def __init__(self, engine: "OCREngine", state: DecoderState, sampling: SamplingOptions):
        self.engine, self.state = engine, state
        self.sampler = Sampler(SamplingParams(sampling.temperature, sampling.top_p, sampling.seed))
        self.max_tokens = sampling.max_tokens
        self.generated: list[int] = []
        self.finished = False
        self.finish_reason: str | None = None

    @property
    def n_tokens(self) -> int:
        return len(self.generated)

    def accept(self, logits: np.ndarray) -> None:
        """Choose the next token from logits [n_vocab] and decide whether the page is done."""
        tok = self.sampler(logits)
        if tok in self.engine.stop_ids:
            self.finished, self.finish_reason = True, "eos"
            return
        self.generated.append(tok)
        if len(self.generated) >= self.max_tokens:
            self.finished, self.finish_reason = True, "max_tokens"
        elif self.engine.guard is not None and self.engine.guard.looping(self.generated):
            self.finished, self.finish_reason = True, "repetition"
        if self.finished:
            self.state = None  # free the KV cache as soon as the page leaves the batch

    def text(self) -> str:
        return self.engine.vlm.decode(self.generated)


class OCREngine:
    """PageEngine over a LightOnOCR model: vision() on the vision thread, prefill() and
    decode_step() on the CPU thread."""

    def __init__(self, vlm: LightOnOCR, vision_backend=None, *, gpu_prefill: bool = False,
                 gpu_decode: bool = False, device: str | None = None, ignore_eos: bool = False):
        self.vlm = vlm
        self.longest_edge = vlm.longest_edge
        # ignore_eos: every page runs to its max_tokens, neither stop ids nor the repetition guard
        # end it (benchmarks on random-weight models, comparisons with reference token streams).
        self.stop_ids = frozenset() if ignore_eos else vlm.stop_ids
        self.guard = None if ignore_eos else RepetitionGuard(vlm.decode)
        self.vision_backend = vision_backend  # None: the numpy encoder in the model itself
        self.prefill_decoder = self.decode_decoder = vlm.decoder
        self.switches = None
        if gpu_prefill or gpu_decode:
            from .backends.device import GpuSwitches  # imports torch (the gpu extra)

            self.switches = GpuSwitches(vlm.decoder, prefill=gpu_prefill, decode=gpu_decode, device=device)
            self.prefill_decoder = self.switches.prefill_decoder
            self.decode_decoder = self.switches.decode_decoder

    def vision(self, image: Image.Image) -> np.ndarray:
        if self.vision_backend is not None:
            return self.vision_backend.encode(self.vlm.preprocess(image))
        return self.vlm.encode_image(image)

    def prefill(self, features: np.ndarray, sampling: SamplingOptions) -> PageSeq:
        ids, rows = self.vlm.prompt_and_rows(features)
        state = self.vlm.decoder.new_state(max_seq=len(ids) + sampling.max_tokens)
        # prefill_decoder is the model's own decoder, or its device mirror (--gpu-prefill);
        # either way the KV cache it fills is numpy.
        logits = self.prefill_decoder.forward(state, ids, embd_rows=rows)
        seq = PageSeq(self, state, sampling)
        seq.accept(logits[-1])
        return seq

    def decode_step(self, seqs: list[PageSeq]) -> None:
        live = [s for s in seqs if not s.finished]
        if not live:
            return
        logits = batch_logits(self.decode_decoder, [s.state for s in live], [s.generated[-1] for s in live])
        for s, row in zip(live, logits):
            s.accept(row)
