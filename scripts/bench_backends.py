"""Benchmarks of the accelerator seams (figures only, never assertions):

    python scripts/bench_backends.py vision   [--layers 24] [--page 1540x1190] [--dtypes float32,bfloat16]
    python scripts/bench_backends.py switches [--model text.gguf] [--batch 1,4,8]
    python scripts/bench_backends.py all

vision:   s/page of the vision encoder + projector at the real LightOnOCR-1B vision shapes (24
          layers, hidden 1024, 16 heads, FFN 4096, projector to 1024) with RANDOM weights made in
          memory, numpy vs torch (each dtype) on the devices this machine has; plus the error of
          each torch dtype against numpy on the same weights. With --layers N < 24 the encoder
          layers are timed on N layers and scaled to 24 (said in the table).
switches: prefill and batched-decode times of the CPU path vs --gpu-prefill / --gpu-decode on the
          torch device (default: the best one torch sees), and whether greedy streams are equal.
The page pipeline with and without overlap, busy time per stage: `pantheon-ocr bench pages
--overlap on,off` (bench/pages.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pantheon_ocr.engine.backends import has_module  # noqa: E402

REAL_VISION = dict(n_embd=1024, n_ff=4096, n_layer=24, n_head=16, head_dim=64, projection_dim=1024)


# -- random real-shape vision model (in memory) -------------------------------------------------
def random_vision_model(n_layer: int, seed: int = 0, **shape):
    """A LightOnOCR-1B-shaped vision tower + projector with random float32 weights, as the numpy
    engine's own PixtralVision / Projector objects (no GGUF file), plus encode_image."""
    from gguf import GGMLQuantizationType as Q

    from pantheon_ocr.engine.models.lightonocr import Projector
    from pantheon_ocr.engine.models.pixtral import PixtralLayer, PixtralVision, VisionConfig
    from pantheon_ocr.engine.attention import TowerOptions
    from pantheon_ocr.engine.format.weights import Weight

    s = {**REAL_VISION, **shape, "n_layer": n_layer}
    cfg = VisionConfig(projector_type="lightonocr", n_embd=s["n_embd"], n_ff=s["n_ff"], n_layer=n_layer,
                       n_head=s["n_head"], head_dim=s["head_dim"], patch_size=14, longest_edge=1540, eps=1e-5,
                       rope_base=10000.0, merge=2, projection_dim=s["projection_dim"],
                       image_mean=(0.48145466, 0.4578275, 0.40821073), image_std=(0.26862954, 0.26130258, 0.27577711))
    rng = np.random.default_rng(seed)

    def mat(name, out, inp):
        w = rng.standard_normal((out, inp), dtype=np.float32) * np.float32(inp ** -0.5)
        return Weight(name, Q.F32, (out, inp), w, "f32")

    def norm(n):
        return (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    d, ff, p = cfg.n_embd, cfg.n_ff, cfg.projection_dim
    vision = object.__new__(PixtralVision)
    vision.cfg, vision.path, vision.tower = cfg, "<random>", TowerOptions()
    vision.patch_embd = mat("v.patch_embd.weight", d, 3 * 14 * 14)
    vision.patch_bias = None
    vision.pre_ln = norm(d)
    vision.layers = [PixtralLayer(
        ln1=norm(d), ln2=norm(d), attn_q=mat("attn_q", d, d), attn_k=mat("attn_k", d, d), attn_v=mat("attn_v", d, d),
        attn_out=mat("attn_out", d, d), attn_q_bias=None, attn_k_bias=None, attn_v_bias=None, attn_out_bias=None,
        ffn_gate=mat("ffn_gate", ff, d), ffn_up=mat("ffn_up", ff, d), ffn_down=mat("ffn_down", d, ff),
        ffn_gate_bias=None, ffn_up_bias=None, ffn_down_bias=None) for _ in range(n_layer)]
    proj = object.__new__(Projector)
    proj.merge, proj.eps = 2, 1e-6
    proj.norm = norm(d)
    proj.merger = mat("mm.patch_merger.weight", d, 4 * d)
    proj.linear_1, proj.bias_1 = mat("mm.1.weight", p, d), None
    proj.linear_2, proj.bias_2 = mat("mm.2.weight", p, p), None

    def encode_image(px):
        x, grid = vision.forward(px)
        return proj.forward(x, grid)

    return SimpleNamespace(vision=vision, projector=proj, vision_config=cfg, encode_image=encode_image)


def bench_vision(args) -> list[dict]:
    from pantheon_ocr.engine.backends import NumpyVisionBackend

    h_px, w_px = (int(v) for v in args.page.split("x"))
    h_px, w_px = -(-h_px // 14) * 14, -(-w_px // 14) * 14
    n_layer = args.layers
    vlm = random_vision_model(n_layer)
    px = np.random.default_rng(1).standard_normal((3, h_px, w_px), dtype=np.float32)
    scale = 24 / n_layer
    print(f"# vision encoder + projector, LightOnOCR-1B shapes, random weights, page {h_px}x{w_px} px = "
          f"{(h_px // 14) * (w_px // 14)} patches -> {(h_px // 28) * (w_px // 28)} image tokens; "
          f"timed on {n_layer} layer(s)" + ("" if n_layer == 24 else f", scaled x{scale:g} to 24 layers"), flush=True)
    rows = []
    backends = [("numpy", "cpu", "float32", lambda: NumpyVisionBackend(vlm))]
    if has_module("torch"):
        import torch

        from pantheon_ocr.engine.backends.torch_vision import TorchVisionBackend

        devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else []) + (
            ["mps"] if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available() else [])
        for dev in devices:
            for dt in args.dtypes.split(","):
                backends.append(("torch", dev, dt, lambda dev=dev, dt=dt: TorchVisionBackend(vlm, device=dev, dtype=dt)))
    ref = None
    for name, dev, dt, make in backends:
        be = make()
        # Time the encoder layers apart from the fixed part (patch embedding + projector) so that
        # a run on fewer layers scales honestly: total = fixed + per_layer * 24.
        t0 = time.perf_counter()
        out = be.encode(px)
        total = time.perf_counter() - t0
        fixed = _fixed_part_seconds(be, px, vlm)
        per_page = fixed + (total - fixed) * scale
        err = None if ref is None else float(np.max(np.abs(out - ref)) / np.max(np.abs(ref)))
        if ref is None:
            ref = out
        row = dict(backend=name, device=dev, dtype=dt, layers_timed=n_layer, s_per_page=per_page,
                   s_measured=total, rel_err_vs_numpy=err)
        rows.append(row)
        print(f"{name:6} {dev:5} {dt:9} {per_page:8.2f} s/page (measured {total:.2f} s)"
              + ("" if err is None else f"  max rel err vs numpy {err:.2e}"), flush=True)
        del be
    return rows


def _fixed_part_seconds(be, px, vlm) -> float:
    """Seconds of the non-layer part (patch embedding, norm, projector) on this backend: the same
    backend with its layers removed."""
    if be.name == "numpy":
        layers = vlm.vision.layers
        vlm.vision.layers = []
        try:
            t0 = time.perf_counter()
            be.encode(px)
            return time.perf_counter() - t0
        finally:
            vlm.vision.layers = layers
    mod = be.module
    layers = mod.layers
    import torch

    mod.layers = torch.nn.ModuleList()
    try:
        t0 = time.perf_counter()
        be.encode(px)
        return time.perf_counter() - t0
    finally:
        mod.layers = layers


# -- GPU switches -------------------------------------------------------------------------------
def bench_switches(args) -> list[dict]:
    from pantheon_ocr.engine import load_model
    from pantheon_ocr.engine.backends import resolve_device
    from pantheon_ocr.engine.backends.device import GpuSwitches
    from pantheon_ocr.engine.batch import batch_logits

    device = resolve_device(args.device)
    models = args.model or _default_switch_models()
    rows = []
    for path in models:
        tm = load_model(path, weights="f32")
        dec = tm.decoder
        sw = GpuSwitches(dec, prefill=True, decode=True, device=device)
        rng = np.random.default_rng(0)
        prompt = rng.integers(0, tm.config.n_vocab, args.prefill).tolist()
        dec.forward(dec.new_state(64), prompt[:16])  # warm-up
        sw.prefill_decoder.forward(sw.prefill_decoder.new_state(64), prompt[:16])
        for label, pre in (("cpu", dec), (f"torch-{device}", sw.prefill_decoder)):
            best = min(_timed(lambda: pre.forward(pre.new_state(args.prefill + 1), prompt)) for _ in range(args.repeats))
            rows.append(dict(model=Path(path).name, what="prefill", path=label, tokens=args.prefill, seconds=best,
                             tok_s=args.prefill / best))
        for b in (int(x) for x in args.batch.split(",")):
            for label, d in (("cpu", dec), (f"torch-{device}", sw.decode_decoder)):
                states = []
                for i in range(b):
                    st = dec.new_state(args.prefill + args.steps + 2)
                    dec.forward(st, prompt[: 32 + i])
                    states.append(st)
                toks = [int(t) for t in rng.integers(0, tm.config.n_vocab, b)]
                batch_logits(d, states, toks)  # warm-up step
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    logits = batch_logits(d, states, toks)
                    toks = [int(t) for t in logits.argmax(-1)]
                dt = (time.perf_counter() - t0) / args.steps
                rows.append(dict(model=Path(path).name, what=f"decode B={b}", path=label, tokens=b, seconds=dt,
                                 tok_s=b / dt))
        rows += _stream_check(tm, sw, prompt[:48], args.steps)
    print(f"# GPU switches on torch device {device!r} (weights f32; every switch does host<->device copies per matmul)")
    print(f"{'model':34} {'what':12} {'path':12} {'s/call':>9} {'tok/s':>9}  verdict")
    for i in range(0, len(rows)):
        r = rows[i]
        if r["what"] == "greedy streams":
            print(f"{r['model'][:34]:34} greedy streams equal to the CPU path: {r['equal']}")
            continue
        verdict = ""
        if r["path"] != "cpu":
            base = next(x for x in rows if x["model"] == r["model"] and x["what"] == r["what"] and x["path"] == "cpu")
            ratio = base["seconds"] / r["seconds"]
            verdict = (f"LOSES to the CPU path ({1 / ratio:.2f}x slower)" if ratio < 0.97 else
                       f"wins ({ratio:.2f}x faster)" if ratio > 1.03 else "ties the CPU path")
            r["speedup_vs_cpu"] = ratio
        print(f"{r['model'][:34]:34} {r['what']:12} {r['path']:12} {r['seconds']:9.4f} {r['tok_s']:9.1f}  {verdict}")
    return rows


def _stream_check(tm, sw, prompt, n) -> list[dict]:
    """Greedy streams: CPU prefill+decode vs device prefill + CPU decode vs CPU prefill + device decode."""
    from pantheon_ocr.engine.batch import batch_logits

    def run(pre, dec, b=3):
        states, outs = [], []
        for i in range(b):
            st = pre.new_state(len(prompt) + n + 2)
            lg = pre.forward(st, prompt[: len(prompt) - i])
            states.append(st)
            outs.append([int(lg[-1].argmax())])
        for _ in range(n):
            lg = batch_logits(dec, states, [o[-1] for o in outs])
            for o, row in zip(outs, lg):
                o.append(int(row.argmax()))
        return outs

    d = tm.decoder
    want = run(d, d)
    equal = run(sw.prefill_decoder, d) == want and run(d, sw.decode_decoder) == want
    return [dict(model=Path(tm.path).name, what="greedy streams", path="-", equal=equal)]


def _default_switch_models() -> list[str]:
    models = [str(ROOT / "tests" / "fixtures" / "lightonocr-tiny" / "text.gguf")]
    try:
        from tests.pypi_models import smollm2_path

        models.append(str(smollm2_path()))
    except Exception:  # noqa: BLE001 - optional model package
        pass
    return models


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["vision", "switches", "all"])
    ap.add_argument("--layers", type=int, default=24, help="vision: encoder layers to time (scaled to 24)")
    ap.add_argument("--page", default="1540x1190", help="vision: page size HxW in px (default: Letter at 1540)")
    ap.add_argument("--dtypes", default="float32,bfloat16", help="vision: torch dtypes")
    ap.add_argument("--model", action="append", help="switches: decoder GGUF(s)")
    ap.add_argument("--device", default=None, help="switches: torch device (default: best available)")
    ap.add_argument("--prefill", type=int, default=512, help="switches: prompt tokens")
    ap.add_argument("--batch", default="1,4,8", help="switches: decode batch sizes")
    ap.add_argument("--steps", type=int, default=16, help="switches: decode steps timed")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", help="also write every row to this JSON file")
    args = ap.parse_args(argv)
    if has_module("torch"):
        from pantheon_ocr.engine.backends import require_torch

        require_torch()  # first torch import through the engine (sets GOMP_SPINCOUNT, OMP_WAIT_POLICY)
    out = {"machine": _machine()}
    print(f"# machine: {out['machine']}", flush=True)
    if args.what in ("vision", "all"):
        out["vision"] = bench_vision(args)
    if args.what in ("switches", "all"):
        out["switches"] = bench_switches(args)
    out["load_after"] = os.getloadavg()[0]
    print(f"# 1-minute load average at the end: {out['load_after']:.2f} (other processes share these cores)")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


def _machine() -> dict:
    import platform

    info = dict(cpus=os.cpu_count(), system=platform.system(), machine=platform.machine(),
                load_before=round(os.getloadavg()[0], 2))
    if has_module("torch"):
        import torch

        info.update(torch=torch.__version__, torch_threads=torch.get_num_threads(),
                    cuda=torch.cuda.is_available(), OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY"))
    return info


if __name__ == "__main__":
    main()
