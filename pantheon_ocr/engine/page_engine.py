"""The page API: LightOnOCR pages as sequences, prefilled one by one and decoded together
(forward_batch), each leaving at EOS, max tokens or the repetition guard.

    engine = OCREngine(load_vlm(text, mmproj))              # or engine.loader.load_page_engine
    engine.transcribe("page.png")                            # one page, start to finish -> str
    seq = engine.run_page("page.png", SamplingOptions(...))  # the same, the finished sequence
    # what the pipeline does with many pages at once (its PageEngine protocol):
    features = engine.vision(image)                          # vision thread
    seq = engine.prefill(features, sampling)                 # CPU thread: a new sequence
    engine.decode_step([seq, ...])                           # CPU thread: one token for each
    # chunked prefill: the CPU thread alternates one chunk of a joining page's prompt with
    # one decode step of the pages already decoding, so they never wait for a whole prompt
    seq = engine.start_prefill(features, sampling)           # nothing computed yet
    while not engine.prefill_step(seq): engine.decode_step(decoding)
    engine.prefill_steps([seq, ...])                         # the next chunk of each, one forward

Decode state belongs to the page engine: it creates one KV pool (`kv_dtype`), every sequence
holds a slot of it until the sequence finishes or is closed (`seq.close()`), then the slot is
reused. Nothing relies on garbage collection to give memory back.

Accelerators (engine/backends): `vision_backend` runs the vision stage (torch, Core ML; None =
the numpy encoder in the model); `gpu_prefill` / `gpu_decode` run the prefill or batched decode
projections on a torch `device` through a mirrored decoder (backends.device.GpuSwitches), off by
default. The KV caches stay numpy, so a page prefilled on the device decodes on the CPU path."""

from __future__ import annotations

import numpy as np

from ..options import PREFILL_CHUNK
from .batch import batch_logits
from .cache import DecoderState, Rows, kv_kind
from .models.lightonocr import LightOnOCR
from .models.reader import ReadingHints
from .sampling import RepetitionGuard, Sampler, SamplingOptions



class PageSeq:
    """One page being decoded: its KV cache state, sampler and generated ids. While its prompt
    is being prefilled in chunks, `pending` holds what is left of it (ids, image rows)."""

    def __init__(self, engine: "OCREngine", state: DecoderState, sampling: SamplingOptions):
        self.engine, self.state = engine, state
        self.sampler = Sampler(sampling)
        self.max_tokens = sampling.max_tokens
        self.generated: list[int] = []
        self.logprob = 0.0  # of the tokens chosen, the end's included (engine.scores: else 0)
        self.finished = False
        self.finish_reason: str | None = None
        self.pending: tuple[list[int], np.ndarray, np.ndarray] | None = None  # ids, image row idx, rows

    @property
    def prefilling(self) -> bool:
        return self.pending is not None

    @property
    def n_tokens(self) -> int:
        return len(self.generated)

    def accept(self, logits: np.ndarray) -> None:
        """Choose the next token from logits [n_vocab] and decide whether the page is done."""
        tok = self.sampler(logits)
        if self.engine.scores:
            z = logits.astype(np.float64)
            top = z.max()
            self.logprob += float(z[tok] - top - np.log(np.exp(z - top).sum()))
        if tok in self.engine.stop_ids:
            self.finished, self.finish_reason = True, "eos"
        else:
            self.generated.append(tok)
            if len(self.generated) >= self.max_tokens:
                self.finished, self.finish_reason = True, "max_tokens"
            elif self.engine.guard is not None and self.engine.guard.looping(self.generated):
                self.finished, self.finish_reason = True, "repetition"
        if self.finished:
            self.close()  # the KV slot goes back as soon as the page leaves the batch

    def close(self) -> None:
        """Free the decode state (idempotent): the page finished, failed or was abandoned."""
        if self.state is not None:
            self.state.release()
            self.state = None
        self.pending = None

    def text(self) -> str:
        # stopped before the model's end (max_tokens, repetition): maybe inside a character's bytes
        return self.engine.vlm.decode(self.generated, cut=self.finished and self.finish_reason != "eos")


class OCREngine:
    """A LightOnOCR model as a page engine: vision() on the vision thread, start_prefill() /
    prefill_step(s)() and decode_step() on the CPU thread; transcribe() / run_page() for one page on
    this thread. It owns the KV pool of its sequences."""

    def __init__(self, vlm: LightOnOCR, vision_backend=None, *, gpu_prefill: bool = False,
                 gpu_decode: bool = False, device: str | None = None, ignore_eos: bool = False,
                 prefill_chunk: int | None = PREFILL_CHUNK, kv_dtype: str = "auto", overlaps: bool = True,
                 model: str = ""):
        self.vlm = vlm
        self.model = model  # its files, as outputs record them (loader.model_identity)
        self.prefill_chunk = prefill_chunk  # prompt tokens per prefill_step; None: the whole prompt
        self.longest_edge = vlm.longest_edge  # the widest image the vision tower takes
        # How the model wants its pages cut (pipeline/regions.py), one typed value.
        self.hints: ReadingHints = vlm.hints
        # ignore_eos: every page runs to its max_tokens, neither stop ids nor the repetition guard
        # end it (benchmarks on random-weight models, comparisons with reference token streams).
        self.stop_ids = frozenset() if ignore_eos else vlm.stop_ids
        self.guard = None if ignore_eos else RepetitionGuard(vlm.decode)
        # A reader of lines is asked how sure it was of each line (regions.py leaves out lines
        # it read as noise: a picture's texture); a page model is not (a full softmax a token).
        self.scores = vlm.hints.reads_lines
        self.vision_backend = vision_backend  # None: the numpy encoder in the model itself
        self.vision_device = "cpu" if vision_backend is None else vision_backend.device
        self.overlaps = overlaps  # its vision stage pays beside the CPU stage (loader.overlap_pays)
        self.kv_pool = vlm.decoder.new_pool(kv_kind(kv_dtype, vlm.decoder.storage))  # every sequence's K/V (cache.py)
        self.prefill_decoder = self.decode_decoder = vlm.decoder
        self.switches = None
        if gpu_prefill or gpu_decode:
            from .backends.device import GpuSwitches  # imports torch (the gpu extra)

            self.switches = GpuSwitches(vlm.decoder, prefill=gpu_prefill, decode=gpu_decode, device=device)
            self.prefill_decoder = self.switches.prefill_decoder
            self.decode_decoder = self.switches.decode_decoder

    # -- one page ----------------------------------------------------------------------------
    def transcribe(self, image, sampling: SamplingOptions = SamplingOptions()) -> str:
        """The text (Markdown) of one page image (path, bytes, PIL image or uint8 array)."""
        return self.run_page(image, sampling).text()

    def run_page(self, image=None, sampling: SamplingOptions = SamplingOptions(), *,
                 features: np.ndarray | None = None) -> PageSeq:
        """One page through every stage on this thread; the finished sequence (.generated,
        .finish_reason, .text()). `features` from vision() skips the vision stage."""
        seq = self.prefill(self.vision(image) if features is None else features, sampling)
        while not seq.finished:
            self.decode_step([seq])
        return seq

    # -- the pipeline's stages ---------------------------------------------------------------
    def vision(self, image) -> np.ndarray:
        """Image -> image features [M, n_embd] float32."""
        if self.vision_backend is not None:
            return self.vision_backend.encode(self.vlm.preprocess(image))
        return self.vlm.encode_image(image)

    def vision_many(self, images: list) -> list[np.ndarray]:
        """The vision stage of several images (a page's line pieces) at once; features each."""
        if not images:
            return []
        if self.vision_backend is not None:
            return [self.vision_backend.encode(self.vlm.preprocess(im)) for im in images]
        return self.vlm.encode_images(images)

    def prefill(self, features: np.ndarray, sampling: SamplingOptions) -> PageSeq:
        """A new sequence with its whole prompt prefilled (its first token chosen)."""
        seq = self.start_prefill(features, sampling)
        while not self.prefill_step(seq):
            pass
        return seq

    def start_prefill(self, features: np.ndarray, sampling: SamplingOptions) -> PageSeq:
        """A new sequence whose prompt is still to be prefilled (prefill_step); cheap."""
        ids, (idx, rows) = self.vlm.prompt_and_rows(features)
        state = self.vlm.decoder.new_state(max_seq=len(ids) + sampling.max_tokens, pool=self.kv_pool)
        seq = PageSeq(self, state, sampling)
        seq.pending = (ids, np.asarray(idx), rows)
        return seq

    def prefill_step(self, seq: PageSeq) -> bool:
        """Prefill the next `prefill_chunk` prompt tokens of `seq` (all of them if None); True
        once the prompt is done and the first token chosen. Each chunk attends to the cache of
        the chunks before it (blocked attention over cache + chunk), so the result is the whole
        prompt's up to float rounding: the prompt's rows go through matmuls of another height."""
        self.prefill_steps([seq])
        return not seq.prefilling

    def prefill_steps(self, seqs: list[PageSeq]) -> None:
        """The next chunk of each sequence's prompt, all of them in one forward (one matmul per
        weight for every row: many short prompts, such as the line pieces of a page, cost little
        more than one); a sequence whose prompt is done gets its first token."""
        seqs = [s for s in seqs if s.prefilling]
        if not seqs:
            return
        decoder = self.prefill_decoder  # the model's own decoder, or its device mirror (--gpu-prefill)
        chunks, xs = [], []
        for s in seqs:
            ids, idx, rows = s.pending
            n = len(ids) if not self.prefill_chunk else min(self.prefill_chunk, len(ids))
            p0 = s.state.pos
            mine = (idx >= p0) & (idx < p0 + n)  # image rows that fall in this chunk
            xs.append(decoder.embed(ids[:n], (idx[mine] - p0, rows[mine])))  # [n, n_embd]
            chunks.append(ids[:n])
        x = decoder.run(Rows([s.state for s in seqs], [len(c) for c in chunks]), np.concatenate(xs),
                        [t for c in chunks for t in c])  # [N, n_embd]
        ends = np.cumsum([len(c) for c in chunks]) - 1
        done = [i for i, s in enumerate(seqs) if len(chunks[i]) == len(s.pending[0])]
        logits = decoder.logits_of(x[ends[done]]) if done else None  # [len(done), n_vocab]
        for i, s in enumerate(seqs):
            ids, idx, rows = s.pending
            s.pending = (ids[len(chunks[i]):], idx, rows)
        for j, i in enumerate(done):
            seqs[i].pending = None
            seqs[i].accept(logits[j])

    def decode_step(self, seqs: list[PageSeq]) -> None:
        live = [s for s in seqs if not s.finished]
        if not live:
            return
        logits = batch_logits(self.decode_decoder, [s.state for s in live], [s.generated[-1] for s in live])
        for s, row in zip(live, logits):
            s.accept(row)
