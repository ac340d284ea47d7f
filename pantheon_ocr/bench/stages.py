"""Engine benchmarks (figures, never assertions).

- `bench_decoder`: prefill and decode tokens/s of a decoder GGUF per storage mode, beside a bare
  numpy roofline that runs the same GEMM shapes with nothing else around them.
- `bench_vision` / `bench_prefill`: the LightOnOCR stages for one page (a Letter page rendered at
  the model's 1540 px is ~9,350 patches and ~2,310 image tokens): vision encoder + projector
  seconds, prefill seconds with blocked (flash) or naive attention.
- `bench_decode`: `forward_batch` alone, decode tokens/s against the batch size B.

Every configuration can run in its own subprocess (`isolation.run_isolated`). Layers can be dropped at load (`layers=`) to fit a slow machine: every layer of a
tower has the same shapes, so the full-depth time is estimated as the time outside the layers
plus the median layer time x the full layer count; rows say when they are such estimates.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict, dataclass, fields

import numpy as np

from ..engine.format.weights import Weight
from ..options import TORCH_STORAGES
from .isolation import rss_now_mb
from .synthetic import page_pixels, synthetic_page


# -------------------------------------------------------------------------------- decoders


@dataclass(frozen=True)
class DecoderBench:
    model: str
    storage: str
    kv_dtype: str  # what transcribe takes with this storage (cache.kv_kind's auto)
    prefill_tokens: int
    prefill_tok_s: float
    decode_tok_s: float
    roofline_prefill_tok_s: float
    roofline_decode_tok_s: float
    load_s: float
    tokenizer_load_s: float  # building the tokenizer from the file's vocabulary (151,936 entries for Qwen)

    def row(self) -> dict:
        return asdict(self)


def matmul_shapes(decoder) -> Counter:
    """(out, in) of every projection one token goes through, with multiplicity."""
    shapes: Counter = Counter()
    for layer in decoder.layers:
        for f in fields(layer):
            w = getattr(layer, f.name)  # a layer's typed fields: the Weights are its projections
            if isinstance(w, Weight):
                shapes[w.shape] += 1
        if getattr(layer, "ffn_experts", ()):  # each token runs n_expert_used experts
            for w in layer.ffn_experts[0]:
                shapes[w.shape] += decoder.cfg.n_expert_used
    shapes[decoder.output.shape] += 1
    return shapes


def roofline_seconds(shapes: Counter, m: int, repeats: int = 3) -> float:
    """Best-of-`repeats` time of x[m, in] @ W[out, in].T for every shape (float32 BLAS)."""
    rng = np.random.default_rng(0)
    total = 0.0
    for (out, inp), count in shapes.items():
        w = rng.standard_normal((out, inp), dtype=np.float32)
        x = rng.standard_normal((m, inp), dtype=np.float32)
        best = min(_timed(lambda: x @ w.T) for _ in range(repeats))
        total += best * count
    return total


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def bench_decoder(path, storage: str, prefill_tokens: int = 512, decode_tokens: int = 16) -> DecoderBench:
    from ..engine.cache import kv_kind
    from ..engine.loader import load_model

    t0 = time.perf_counter()
    model = load_model(path, weights=storage)
    load_s = time.perf_counter() - t0
    tokenizer_load_s = _timed(lambda: model.tokenizer)
    d = model.decoder
    ids = np.random.default_rng(1).integers(0, model.config.n_vocab, prefill_tokens).tolist()
    pool = d.new_pool(kv_kind("auto", storage))  # the KV cache transcribe takes with these weights
    d.forward(d.new_state(64, pool), ids[:32])  # warm-up: page in the map, start BLAS threads
    state = d.new_state(prefill_tokens + decode_tokens + 1, pool)
    prefill = _timed(lambda: d.forward(state, ids))
    decode = _timed(lambda: [d.forward(state, [t]) for t in ids[:decode_tokens]])
    shapes = matmul_shapes(d)
    roof_p = roofline_seconds(shapes, prefill_tokens)
    roof_d = roofline_seconds(shapes, 1, repeats=5)
    return DecoderBench(
        model=str(path), storage=storage, kv_dtype=pool.kind, prefill_tokens=prefill_tokens,
        prefill_tok_s=prefill_tokens / prefill, decode_tok_s=decode_tokens / decode,
        roofline_prefill_tok_s=prefill_tokens / roof_p, roofline_decode_tok_s=1 / roof_d, load_s=load_s,
        tokenizer_load_s=tokenizer_load_s,
    )


# ---------------------------------------------------------------------- stage benchmarks


def _decode_model(model: str, storage: str, layers: int | None, kernel: bool, step: bool):
    """A decoder for bench_decode: its first `layers` layers, with or without the compiled decode
    attention and the compiled step; no per-layer hook (a hooked decoder keeps the Python chain)."""
    from ..engine.attention import TowerOptions
    from ..engine.loader import load_model

    _tower(layers, [])  # the same check of `layers`
    return load_model(model, storage, TowerOptions(n_layers=layers, decode_kernel=kernel, decode_step=step)).decoder


def _tower(layers: int | None, times: list[float], **kw):
    """Build options for a benchmarked tower: the first `layers` layers, each layer's seconds
    appended to `times` by the tower's own hook (nothing is patched)."""
    from ..engine.attention import TowerOptions

    if layers is not None and layers < 1:
        raise ValueError(f"layers must be at least 1, got {layers}")
    return TowerOptions(n_layers=layers, on_layer=lambda i, seconds: times.append(seconds), **kw)


def _estimate(total: float, layer_times: list[float], n_run: int, n_full: int) -> float:
    """Full-depth seconds from a run of n_run layers: outside-the-layers time + median layer x n_full."""
    per_run = layer_times[-n_run:]
    outside = total - sum(per_run)
    return outside + float(np.median(per_run)) * n_full


def bench_vision(mmproj: str, storage: str = "f32", layers: int | None = None, repeats: int = 1,
                 page: str = "letter", longest_edge: int | None = None, seed: int = 0, backend: str = "numpy",
                 model: str | None = None, device: str | None = None, dtype: str = "auto") -> dict:
    """Vision encoder + projector on one synthetic page: seconds per page (median of repeats).
    backend: "numpy" (the engine's tower in `storage`) or one that make_vision_backend builds
    for the pair (model, mmproj) on `device` in `dtype` (EngineOptions.device / vision_dtype):
    torch, Core ML, auto. Layer times come from the towers' own hooks (TowerOptions.on_layer;
    torch's forward hooks on its blocks, the device synchronized), nothing is patched."""
    from ..engine.format.gguf import open_gguf
    from ..engine.image.preprocess import preprocess
    from ..engine.models.pixtral import vision_config

    t0 = time.perf_counter()
    vc = vision_config(open_gguf(mmproj))
    layer_times: list[float] = []
    encode, n_run, name, on = _vision_encoder(mmproj, storage, layers, layer_times, backend, model, device, dtype)
    load_s = time.perf_counter() - t0
    rss_load = rss_now_mb()
    n_full = vc.n_layer
    edge = longest_edge or vc.longest_edge
    img = synthetic_page(*page_pixels(page, edge), seed=seed)
    t = time.perf_counter()
    pixels = preprocess(img, longest_edge=edge, patch_size=vc.patch_size, mean=vc.image_mean, std=vc.image_std,
                        merge=vc.merge)
    preprocess_s = time.perf_counter() - t
    runs, proj_runs, estimates = [], [], []
    for _ in range(repeats):
        t = time.perf_counter()
        feats, grid, t_proj = encode(pixels)
        total = time.perf_counter() - t
        runs.append(total)
        proj_runs.append(t_proj)
        estimates.append(_estimate(total - t_proj, layer_times, n_run, n_full) + t_proj if layer_times else total)
    return {
        "stage": "vision", "storage": storage, "backend": name, "device": on, "mmproj": str(mmproj),
        "image": f"{pixels.shape[2]}x{pixels.shape[1]}", "patches": int(grid[0] * grid[1]),
        "image_tokens": int(feats.shape[0]), "layers_run": n_run, "layers_full": n_full,
        "estimated": n_run < n_full, "repeats": repeats,
        "seconds_run": float(np.median(runs)), "seconds_page": float(np.median(estimates)),
        "layer_s": float(np.median(layer_times)) if layer_times else float("nan"),
        "projector_s": float(np.median(proj_runs)), "preprocess_s": preprocess_s, "load_s": load_s, "rss_after_load_mb": rss_load,
    }


def _vision_encoder(mmproj: str, storage: str, layers: int | None, layer_times: list[float], backend: str,
                    model: str | None, device: str | None = None, dtype: str = "auto"):
    """(encode(pixels) -> (features, grid, projector seconds), layers built, the backend's name, its device)."""
    from ..engine.backends import make_vision_backend, plan_vision_backend
    from ..engine.format.gguf import open_gguf
    from ..engine.format.weights import WeightLoader
    from ..engine.models.lightonocr import Projector
    from ..engine.models.pixtral import PixtralVision, vision_config

    if plan_vision_backend(backend, device, dtype)[0] == "numpy":
        gf = open_gguf(mmproj)
        vc = vision_config(gf)
        vision = PixtralVision(gf, vc, storage, _tower(layers, layer_times))
        projector = Projector(WeightLoader(gf, storage), vc, 1e-6)  # the text eps (LightOnOCR: 1e-6)

        def encode(pixels):
            x, grid = vision.forward(pixels)
            t = time.perf_counter()
            feats = projector.forward(x, grid)
            return feats, grid, time.perf_counter() - t

        return encode, len(vision.layers), f"numpy/{storage}", "cpu"
    from ..engine.backends.torch_vision import TorchVisionBackend
    from ..engine.loader import load_vlm

    if model is None:
        raise ValueError(f"the {backend} vision backend is built for a model pair: give the text GGUF too")
    # Another backend keeps its own weights: the numpy towers only map the files (as load_page_engine).
    vlm = load_vlm(model, mmproj, weights="quantized", vision_weights="quantized", vision_tower=_tower(layers, []))
    be = make_vision_backend(backend, vlm, device=device, dtype=dtype)
    projector_s: list[float] = []
    if isinstance(be, TorchVisionBackend):  # its blocks and projector timed by torch's forward hooks
        sync = _synchronize(be.device)
        _time_modules(be.module.layers, layer_times, sync)
        _time_modules([be.module.projector], projector_s, sync)
    elif layers is not None:
        raise ValueError(f"the {be.name} vision backend has no layer times to estimate full depth from: "
                         "run all its layers")
    patch = vlm.vision_config.patch_size

    def encode(pixels):
        before = len(projector_s)
        feats = be.encode(pixels)
        return feats, (pixels.shape[1] // patch, pixels.shape[2] // patch), sum(projector_s[before:])

    on = "" if be.device in (None, "cpu") else f"@{be.device}"
    return encode, len(vlm.vision.layers), f"{be.name}{on}/{be.dtype}", be.device or "cpu"


def _synchronize(device: str):
    """A call that waits for the device's queued work: a GPU runs a module after its Python call
    returns, so a timer read without it would time the launches."""
    import torch

    kind = torch.device(device).type
    if kind == "cuda":
        return lambda: torch.cuda.synchronize(device)
    if kind == "mps":
        return torch.mps.synchronize
    return lambda: None


def _time_modules(modules, times: list[float], sync=lambda: None) -> None:
    """Append each run's seconds of every module to `times` (torch forward hooks; `sync` waits
    for the device before each reading)."""
    def stamp() -> float:
        sync()
        return time.perf_counter()

    for m in modules:
        start: list[float] = []
        m.register_forward_pre_hook(lambda *_, start=start: start.append(stamp()))
        m.register_forward_hook(lambda *_, start=start: times.append(stamp() - start.pop()))


def bench_prefill(model: str, storage: str = "f32", flash: bool = True, layers: int | None = None,
                  image_tokens: int | None = None, repeats: int = 1, page: str = "letter",
                  longest_edge: int = 1540, patch: int = 14, merge: int = 2, seed: int = 0,
                  q_block: int | None = None) -> dict:
    """Prefill of one page's prompt (image rows as embedding overrides) as transcribe prefills it: in
    chunks of the options table's prefill_chunk tokens into the KV cache transcribe takes with these
    weights (cache.kv_kind's auto): seconds per page. q_block: query rows per flash tile (None: the
    engine's default, attention.Q_BLOCK)."""
    from ..engine import attention
    from ..engine.cache import kv_kind
    from ..engine.loader import load_model
    from ..engine.models.lightonocr import IMAGE_TOKEN, PROMPT_PIECES
    from ..options import EngineOptions, spec

    chunk = spec(EngineOptions, "prefill_chunk").default

    t0 = time.perf_counter()
    layer_times: list[float] = []
    tm = load_model(model, storage, _tower(layers, layer_times, attention="flash" if flash else "naive", q_block=q_block))
    load_s = time.perf_counter() - t0
    rss_load = rss_now_mb()
    dec, cfg = tm.decoder, tm.config
    if image_tokens is None:  # the page's resized size -> (H // 28) * (W // 28)
        from ..engine.image.preprocess import target_size

        w, h = page_pixels(page, longest_edge)
        hh, ww = target_size(h, w, longest_edge, patch)
        image_tokens = (hh // (patch * merge)) * (ww // (patch * merge))
    ids: list[int] = []
    for piece in PROMPT_PIECES:
        ids += [tm.tokenizer.token_id(IMAGE_TOKEN)] * image_tokens if piece is None else [tm.tokenizer.token_id(piece)]
    idx = np.flatnonzero(np.asarray(ids) == tm.tokenizer.token_id(IMAGE_TOKEN))
    rows = np.random.default_rng(seed).standard_normal((image_tokens, cfg.n_embd), dtype=np.float32) * 0.6
    n_full = cfg.n_layer
    truncated = len(dec.layers) < n_full
    runs, estimates = [], []
    pool = dec.new_pool(kv_kind("auto", storage))
    warm = dec.new_state(max_seq=64, pool=pool)  # warm-up, as llama-batched-bench's: start the threads, load
    dec.hidden(warm, ids[:32])                   # the kernels, fault in the buffers a page's first chunk meets
    warm.release()
    layer_times.clear()
    for _ in range(repeats):
        state = dec.new_state(max_seq=len(ids) + 1, pool=pool)
        t = time.perf_counter()
        for s in range(0, len(ids), chunk):  # the image rows that fall in this chunk, at their places in it
            here = (idx >= s) & (idx < s + chunk)
            # logits for the last chunk only, as PageEngine.prefill_steps: the head is 151,936 rows to read
            step = dec.forward if s + chunk >= len(ids) else dec.hidden
            logits = step(state, ids[s:s + chunk], embd_rows=(idx[here] - s, rows[here]))
        total = time.perf_counter() - t
        runs.append(total)
        per = layer_times[-len(dec.layers) * -(-len(ids) // chunk):]  # this run's layers, every chunk
        estimates.append(total - sum(per) + sum(per) * n_full / len(dec.layers))  # all layers: the run itself
        if not np.all(np.isfinite(logits)):
            raise RuntimeError("prefill produced non-finite logits")
        state.release()
    sec = float(np.median(estimates))
    return {
        "stage": "prefill", "storage": storage, "attention": "flash" if flash else "naive", "model": str(model),
        "kv_dtype": pool.kind, "prefill_chunk": chunk,
        "q_block": (q_block or attention.Q_BLOCK) if flash else None,
        "prompt_tokens": len(ids), "image_tokens": image_tokens, "layers_run": len(dec.layers),
        "layers_full": n_full, "estimated": truncated, "repeats": repeats,
        "seconds_run": float(np.median(runs)), "seconds_page": sec, "tok_s": len(ids) / sec,
        "layer_s": float(np.median(layer_times)), "load_s": load_s, "rss_after_load_mb": rss_load,
    }


def bench_decode(model: str, storage: str = "f32", batch_sizes=(1, 4, 8, 16, 32), context: int = 256,
                 steps: int = 8, layers: int | None = None, seed: int = 0, kv_dtype: str = "auto",
                 kernels: tuple[bool, ...] = (True,), steps_compiled: tuple[bool, ...] = (True,)) -> dict:
    """forward_batch alone: B sequences, each with `context` cached positions (random K/V: the
    values do not change the cost) in one `kv_dtype` pool, advanced one token per step. The
    batch sizes (and, with two `kernels`, a decoder with and one without the compiled decode
    attention, and with two `steps_compiled` one with and one without the compiled step) take turns
    step by step (round robin), so that a change in machine load hits them all alike; the median
    step time per B gives tokens/s = B / step."""
    from ..engine.backends.native import DecodeAttention
    from ..engine.batch import forward_batch
    from ..engine.cache import kv_kind

    t0 = time.perf_counter()
    decoders = {(kernel, step): _decode_model(model, storage, layers, kernel, step)
                for kernel in kernels for step in steps_compiled}
    load_s = time.perf_counter() - t0
    rss_load = rss_now_mb()
    dec = next(iter(decoders.values()))
    cfg = dec.cfg
    n_full = cfg.n_layer
    truncated = len(dec.layers) < n_full
    kv_dtype = kv_kind(kv_dtype, storage)
    rng = np.random.default_rng(seed)
    kv = rng.standard_normal((cfg.n_head_kv, context, cfg.head_dim), dtype=np.float32)
    groups = {}
    for variant, d in decoders.items():
        pool = d.new_pool(kv_dtype)  # one pool for every batch: the padded decode attention of a real run
        for b in batch_sizes:
            states = []
            for _ in range(b):
                st = d.new_state(max_seq=context + steps + 2, pool=pool)
                for i in range(len(d.layers)):
                    st.cache.write(i, 0, kv, kv)
                st.pos = context
                states.append(st)
            tokens = rng.integers(0, cfg.n_vocab, b).tolist()
            forward_batch(d, states, tokens)  # warm-up (and the KV caches reach their final size)
            groups[(*variant, b)] = (d, states, tokens, [])
    for _ in range(steps):
        for d, states, tokens, times in groups.values():
            t = time.perf_counter()
            logits = forward_batch(d, states, tokens)
            times.append(time.perf_counter() - t)
            tokens[:] = logits.argmax(axis=-1).tolist()
    rows = []
    shapes = matmul_shapes(dec)
    if truncated:
        shapes = Counter({k: (v * n_full // len(dec.layers) if k != dec.output.shape else v) for k, v in shapes.items()})
    for (kernel, compiled, b), (d, states, tokens, times) in groups.items():
        step = float(np.median(times))
        x = rng.standard_normal((b, cfg.n_embd), dtype=np.float32)
        head = float(np.median([_timed(lambda: dec.logits_of(x, exact=True)) for _ in range(3)]))  # as a step
        if truncated:  # scale the layer part only; the LM head runs once per step at any depth
            step = head + (step - head) * n_full / len(dec.layers)
        # The bare GEMMs of one step at M = B (float32 BLAS, nothing around them), same load.
        roof = roofline_seconds(shapes, b, repeats=3) if storage == "f32" else None
        tb = d.torch_blocks  # what ran, which is not what was asked where a kernel did not build or fit
        ran_kernel = bool(tb is not None and tb.kernel is not None and kv_dtype in DecodeAttention.KINDS)
        ran_step = bool(tb is not None and tb.step is not None)
        rows.append({"batch": b, "kernel": kernel, "compiled_step": compiled, "kernel_ran": ran_kernel,
                     "step_ran": ran_step, "step_s": step, "tok_s": b / step, "head_s": head,
                     "roofline_tok_s": b / roof if roof else None, "steps_s": [round(t, 4) for t in times]})
    for r in rows:
        r["speedup_vs_first"] = r["tok_s"] / next(x["tok_s"] for x in rows if x["kernel"] == r["kernel"]
                                                  and x["compiled_step"] == r["compiled_step"])
    return {
        "stage": "decode", "storage": storage, "model": str(model), "context": context, "steps": steps,
        "kv_dtype": kv_dtype, "kernel_why": {str(k): d.torch_blocks.why if d.torch_blocks else "numpy decode step"
                                             for (k, _), d in decoders.items()},
        "step_why": {str(s): d.torch_blocks.step_why if d.torch_blocks else "numpy decode step"
                     for (_, s), d in decoders.items()},
        "products_why": _products_why(storage),
        "layers_run": len(dec.layers), "layers_full": n_full, "estimated": truncated, "rows": rows,
        "load_s": load_s, "rss_after_load_mb": rss_load,
    }


def _products_why(storage: str) -> str:
    """Which products multiply a decode step's rows under this storage, and why."""
    if storage not in TORCH_STORAGES:
        return "numpy's products"
    from ..engine.backends.products import products

    return products().why
