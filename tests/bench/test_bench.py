"""Benchmark code: structure of the results, never timings (figures are not asserted)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from pantheon_ocr.bench.pages import PageBenchOptions, bench_pages, expand_configs, failure_lines, format_table
from pantheon_ocr.bench.stages import bench_decode, bench_prefill, bench_vision
from pantheon_ocr.bench.synthetic import synthetic_pdf
from pantheon_ocr.cli import main
from pantheon_ocr.engine.backends import native

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "fixtures" / "lightonocr-tiny"
TEXT, MMPROJ = str(TINY / "text.gguf"), str(TINY / "mmproj.gguf")
STAGES = {"render", "vision", "prefill", "decode"}
SUMMARY_KEYS = {"pages", "pages_failed", "tokens", "wall_s", "pages_per_min", "tokens_per_s", "decode_tok_s",
                "mean_batch", "busy_s", "mean_page_s", "load_s", "peak_rss_mb", "load_avg_before", "load_avg_after"}


def _script():
    spec = importlib.util.spec_from_file_location("make_random_lightonocr", ROOT / "scripts" / "make_random_lightonocr.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_synthetic_pdf_has_the_pages(tmp_path):
    import pypdfium2 as pdfium

    path = synthetic_pdf(tmp_path / "s.pdf", 2)
    pdf = pdfium.PdfDocument(str(path))
    try:
        assert len(pdf) == 2
        assert pdf[0].get_size() == (612, 792)
        assert "ANNUAL REPORT" in pdf[1].get_textpage().get_text_range()
    finally:
        pdf.close()
    assert synthetic_pdf(tmp_path / "t.pdf", 2).read_bytes() == path.read_bytes()  # deterministic


def _check_result(r: dict, n_pages: int, max_tokens: int) -> None:
    assert set(r) == {"config", "pages", "summary"}
    assert {"name", "batch_size", "weights", "flash", "overlap", "threads", "max_tokens"} <= set(r["config"])
    assert len(r["pages"]) == n_pages
    for p in r["pages"]:
        assert set(p["seconds"]) == STAGES
        assert p["error"] is None and p["n_tokens"] == max_tokens and p["finish_reason"] == "max_tokens"
    s = r["summary"]
    assert SUMMARY_KEYS <= set(s)
    assert s["pages"] == n_pages and s["pages_failed"] == 0 and s["tokens"] == n_pages * max_tokens
    assert set(s["busy_s"]) == STAGES and set(s["mean_page_s"]) == STAGES
    json.dumps(r)  # plain JSON all the way down


def test_bench_pages_two_synthetic_pages_in_process(tmp_path):
    pdf = synthetic_pdf(tmp_path / "two.pdf", 2)
    opts = PageBenchOptions(model=TEXT, mmproj=MMPROJ, inputs=(str(pdf),), max_tokens=3, ignore_eos=True,
                            longest_edge=224, render_workers=1)
    configs = expand_configs(batch_sizes=(1, 2), overlap=(True, False))
    # the defaults are the options table's (weights auto, vision backend auto): what transcribe runs
    assert [c.name for c in configs] == ["B=1 auto flash=on overlap=on", "B=2 auto flash=on overlap=on",
                                         "B=1 auto flash=on overlap=off", "B=2 auto flash=on overlap=off"]
    results = bench_pages(opts, configs, isolate=False)
    assert [r["config"]["name"] for r in results] == [c.name for c in configs]
    for r in results:
        _check_result(r, 2, 3)
    table = format_table(results)
    assert len(table.splitlines()) == 1 + len(configs)


def test_cli_bench_pages_subprocess_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    code = main(["bench", "pages", "--model", TEXT, "--mmproj", MMPROJ, "--synthetic", "2", "--batch-size", "2",
                 "--weights", "quantized", "--flash", "off", "--max-tokens", "2", "--ignore-eos",
                 "--longest-edge", "224", "--render-workers", "1", "--json", str(out)])
    assert code == 0
    data = json.loads(out.read_text())
    assert isinstance(data, list) and len(data) == 1
    _check_result(data[0], 2, 2)
    assert data[0]["config"]["weights"] == "quantized" and data[0]["config"]["flash"] is False
    assert data[0]["summary"]["peak_rss_mb"] > 0  # the child's own peak
    assert "B=2 quantized flash=off overlap=auto" in capsys.readouterr().out  # the default
    assert data[0]["summary"]["overlapped"] is True  # a small vision tower overlaps


def test_cli_bench_pages_bad_lists():
    assert main(["bench", "pages", "--model", TEXT, "--mmproj", MMPROJ, "--synthetic", "1",
                 "--batch-size", "0,x"]) == 2
    assert main(["bench", "pages", "--model", TEXT, "--mmproj", MMPROJ, "--synthetic", "1", "--flash", "maybe"]) == 2
    assert main(["bench", "pages", "--model", TEXT, "--mmproj", MMPROJ]) == 2  # no inputs


def test_stage_benches_tiny_model():
    v = bench_vision(MMPROJ, "f32", layers=2, longest_edge=224)
    assert v["stage"] == "vision" and v["estimated"] and v["layers_run"] == 2 and v["layers_full"] == 3
    assert v["image_tokens"] > 0 and v["patches"] >= 4 * v["image_tokens"]
    p = bench_prefill(TEXT, "quantized", flash=False, longest_edge=224)
    assert p["attention"] == "naive" and not p["estimated"] and p["prompt_tokens"] == p["image_tokens"] + 12
    assert p["kv_dtype"] == "float32" and p["prefill_chunk"] == 512  # transcribe's KV and chunks for these weights
    d = bench_decode(TEXT, "f32", batch_sizes=(1, 3), context=8, steps=2)
    assert [r["batch"] for r in d["rows"]] == [1, 3] and d["rows"][0]["speedup_vs_first"] == 1.0
    q = bench_decode(TEXT, "f32", batch_sizes=(2,), context=8, steps=1, kv_dtype="int8")
    assert q["kv_dtype"] == "int8" and q["rows"][0]["tok_s"] > 0


def test_bench_decode_takes_turns_with_and_without_the_compiled_attention(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "decode.json"
    assert main(["bench", "decode", "--model", TEXT, "--weights", "bf16", "--batch-size", "1,2", "--context", "9",
                 "--steps", "2", "--decode-kernel", "on,off", "--in-process", "--json", str(out)]) == 0
    (d,) = json.loads(out.read_text())
    assert [(r["kernel"], r["batch"]) for r in d["rows"]] == [(True, 1), (True, 2), (False, 1), (False, 2)]
    assert all(len(r["steps_s"]) == 2 for r in d["rows"])
    assert d["kernel_why"]["False"] == "torch's products (the tower's options ask for them)"
    assert d["kernel_why"]["True"] == native.decode_attention().why
    built = native.decode_attention().kernel is not None  # the column says what ran, not what was asked
    assert [r["kernel_ran"] for r in d["rows"]] == [built, built, False, False]


def test_bench_decode_says_the_kernel_did_not_run_where_it_cannot(capsys):
    """float32 weights decode through numpy: --decode-kernel on (the default) printed "on" in the
    kernel column all the same."""
    assert main(["bench", "decode", "--model", TEXT, "--weights", "f32", "--batch-size", "1", "--context", "4",
                 "--steps", "1", "--in-process"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("f32"))
    assert row.split()[1:3] == ["off", "off"] and "decode attention: numpy decode step" in out


def test_bench_decode_takes_turns_with_and_without_the_compiled_step(tmp_path):
    pytest.importorskip("torch")
    from pantheon_ocr.engine.backends import native_step

    out = tmp_path / "decode.json"
    assert main(["bench", "decode", "--model", TEXT, "--weights", "int8", "--batch-size", "1,2", "--context", "9",
                 "--steps", "2", "--decode-step", "on,off", "--in-process", "--json", str(out)]) == 0
    (d,) = json.loads(out.read_text())
    assert [(r["compiled_step"], r["batch"]) for r in d["rows"]] == [(True, 1), (True, 2), (False, 1), (False, 2)]
    assert d["step_why"]["False"] == "the Python chain (the tower's options ask for it)"
    built = native_step.decode_step()
    if built.lib is not None and native.decode_attention().kernel is not None:
        assert d["step_why"]["True"] == built.why and built.why.startswith("compiled (")
    else:
        assert d["step_why"]["True"].startswith("the Python chain (")


def test_cli_bench_ocr_and_decode_json(tmp_path):
    out = tmp_path / "ocr.json"
    assert main(["bench", "ocr", "--model", TEXT, "--mmproj", MMPROJ, "--weights", "f32", "--flash", "on,off",
                 "--vision-layers", "1", "--longest-edge", "112", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [(r["stage"], r.get("attention")) for r in rows] == [("vision", None), ("prefill", "flash"),
                                                               ("prefill", "naive")]
    assert all(r["peak_rss_mb"] > 0 for r in rows)
    out = tmp_path / "decode.json"
    assert main(["bench", "decode", "--model", TEXT, "--batch-size", "1,2", "--context", "4", "--steps", "1",
                 "--kv-dtype", "float16", "--in-process", "--json", str(out)]) == 0
    (d,) = json.loads(out.read_text())
    assert [r["batch"] for r in d["rows"]] == [1, 2] and d["kv_dtype"] == "float16"


def test_bench_ocr_defaults_are_what_transcribe_plans(tmp_path):
    """No --weights / --vision-backend: the storage and vision backend transcribe's plan_auto takes
    for this pair here, so the figures are those of the path users run."""
    from pantheon_ocr.engine.loader import plan_auto
    from pantheon_ocr.options import EngineOptions

    out = tmp_path / "ocr.json"
    assert main(["bench", "ocr", "--model", TEXT, "--mmproj", MMPROJ, "--longest-edge", "112", "--in-process",
                 "--json", str(out)]) == 0
    vision, prefill = json.loads(out.read_text())
    planned = plan_auto(EngineOptions(Path(TEXT), Path(MMPROJ)))[0]
    assert vision["storage"] == prefill["storage"] == planned.weights
    assert vision["backend"].startswith(planned.vision_backend + "/")
    assert prefill["attention"] == "flash"  # the table's attention, not both


def test_bench_ocr_times_the_torch_vision_backend_by_its_own_hooks(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "ocr.json"
    assert main(["bench", "ocr", "--model", TEXT, "--mmproj", MMPROJ, "--stage", "vision", "--weights", "f32",
                 "--vision-backend", "torch,numpy", "--vision-layers", "2", "--longest-edge", "112", "--repeats", "2",
                 "--in-process", "--json", str(out)]) == 0
    torch_row, numpy_row = json.loads(out.read_text())
    assert torch_row["backend"].startswith("torch/") and numpy_row["backend"] == "numpy/f32"
    for r in (torch_row, numpy_row):  # 2 of the tiny tower's 3 layers ran, each timed: full depth estimated
        assert r["layers_run"] == 2 and r["layers_full"] == 3 and r["estimated"]
        assert 0 < r["layer_s"] < r["seconds_run"] < r["seconds_page"] and r["projector_s"] > 0
        assert r["image_tokens"] == torch_row["image_tokens"]


def test_bench_ocr_runs_the_vision_on_the_device_in_each_dtype(tmp_path):
    """--device and --vision-dtype reach the backend (one row per dtype, named by both), so a GPU's
    vision is benchmarked as transcribe runs it (the CPU here; PANTHEON_OCR_TEST_DEVICE names a GPU)."""
    pytest.importorskip("torch")
    from ..engine.conftest import TEST_DEVICE as device
    out = tmp_path / "ocr.json"
    assert main(["bench", "ocr", "--model", TEXT, "--mmproj", MMPROJ, "--stage", "vision", "--vision-backend", "torch",
                 "--device", device, "--vision-dtype", "float32,bfloat16", "--longest-edge", "112", "--in-process",
                 "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    on = "" if device == "cpu" else f"@{device}"
    assert [r["backend"] for r in rows] == [f"torch{on}/float32", f"torch{on}/bfloat16"]
    assert all(r["device"] == device and r["layer_s"] > 0 for r in rows)


def test_bench_pages_takes_the_gpu_switches_and_the_vision_dtype(tmp_path):
    """The GPU switches and the vision dtype are configurations like any other: named, combined and
    given to the engine the benchmark runs."""
    pytest.importorskip("torch")
    from pantheon_ocr.bench.pages import build_engine

    configs = expand_configs(batch_sizes=(2,), gpu_decode=(False, True), vision_dtype=("bfloat16",),
                             vision_backend="torch", device="cpu")
    assert [c.name for c in configs] == ["B=2 auto flash=on overlap=auto vis=torch device=cpu vdtype=bfloat16",
                                         "B=2 auto flash=on overlap=auto vis=torch device=cpu vdtype=bfloat16 "
                                         "gpu-decode"]
    opts = PageBenchOptions(model=TEXT, mmproj=MMPROJ, inputs=(), max_tokens=2, longest_edge=112)
    plain, switched = (build_engine(opts, c)[0] for c in configs)
    assert plain.switches is None and plain.vision_backend.dtype == "bfloat16"
    assert switched.switches.decode and not switched.switches.prefill and switched.switches.device == "cpu"


def test_random_lightonocr_names_and_dtypes_match_the_converter():
    """The generator's tensor list = the converter's (the tiny fixture), layer for layer."""
    from gguf import GGMLQuantizationType as Q

    from pantheon_ocr.engine.format.gguf import open_gguf

    mod = _script()
    for specs, path in ((mod.text_specs(2, Q.BF16), TEXT), (mod.vision_specs(3, Q.BF16), MMPROJ)):
        gf = open_gguf(path)
        assert [s.name for s in specs] == list(gf.tensors)
        assert [s.qtype for s in specs] == [t.qtype for t in gf.tensors.values()]
        assert [len(s.shape) for s in specs] == [len(t.shape) for t in gf.tensors.values()]
    text = {s.name: s.shape for s in mod.text_specs(28, Q.BF16)}
    assert text["token_embd.weight"] == (151936, 1024) and text["blk.27.attn_q.weight"] == (2048, 1024)
    assert text["blk.0.attn_k.weight"] == (1024, 1024) and text["blk.0.ffn_down.weight"] == (1024, 3072)
    assert "output.weight" not in text  # tied embeddings
    vision = {s.name: (s.shape, s.qtype) for s in mod.vision_specs(24, Q.Q8_0)}
    assert vision["v.patch_embd.weight"] == ((1024, 3, 14, 14), Q.F32)
    assert vision["mm.patch_merger.weight"] == ((1024, 4096), Q.F32)
    assert vision["v.blk.23.ffn_gate.weight"] == ((4096, 1024), Q.Q8_0)


@pytest.mark.parametrize("dtype", ["BF16", "Q8_0"])
def test_random_lightonocr_pair_loads_and_runs(tmp_path, monkeypatch, dtype):
    """Written at reduced widths (the real vocabulary stays), the pair loads and runs finite,
    with the fixture's metadata keys."""
    from pantheon_ocr.engine import load_vlm
    from pantheon_ocr.engine.format.gguf import open_gguf

    mod = _script()
    monkeypatch.setattr(mod, "TEXT", {**mod.TEXT, "n_embd": 64, "n_ff": 128, "n_head": 4, "n_head_kv": 2,
                                      "head_dim": 32})
    monkeypatch.setattr(mod, "VISION", {**mod.VISION, "n_embd": 64, "n_ff": 128, "n_head": 4})
    monkeypatch.setattr(mod, "CHUNK_BYTES", 1 << 20)  # several chunks per big tensor
    text, mmproj = mod.make_pair(tmp_path, vision_layers=1, text_layers=2, dtype=dtype, log=None)
    for mine, ref in ((text, TEXT), (mmproj, MMPROJ)):
        assert set(open_gguf(mine).metadata) == set(open_gguf(ref).metadata)
    vlm = load_vlm(text, mmproj)
    assert vlm.config.n_layer == 2 and vlm.vision_config.n_layer == 1 and vlm.config.head_dim == 32
    feats = vlm.encode_image(np.full((70, 84, 3), 200, np.uint8))
    logits = vlm.decoder.forward(vlm.decoder.new_state(), *vlm.prompt_and_rows(feats))
    assert np.all(np.isfinite(feats)) and np.all(np.isfinite(logits))
    assert 0.1 < float(feats.std()) < 10


def test_bench_pages_repeats_report_the_median_run(tmp_path):
    pdf = synthetic_pdf(tmp_path / "one.pdf", 1)
    opts = PageBenchOptions(model=TEXT, mmproj=MMPROJ, inputs=(str(pdf),), max_tokens=2, ignore_eos=True,
                            longest_edge=112, render_workers=1, pages_per_config="1")
    (r,) = bench_pages(opts, expand_configs(batch_sizes=(1,), weights=("quantized",)), isolate=False, repeats=3)
    _check_result(r, 1, 2)
    walls = r["summary"]["runs_wall_s"]
    assert len(walls) == 3 and r["summary"]["wall_s"] == sorted(walls)[1]


def test_a_page_that_fails_is_no_throughput(tmp_path):
    """A 1x1 image fails in a moment: counted in pages/min, it made a failing run look fast."""
    from PIL import Image

    pdf = synthetic_pdf(tmp_path / "good.pdf", 1)
    Image.new("RGB", (1, 1), "white").save(tmp_path / "dot.png")
    opts = PageBenchOptions(model=TEXT, mmproj=MMPROJ, inputs=(str(pdf), str(tmp_path / "dot.png")), max_tokens=2,
                            ignore_eos=True, longest_edge=112, render_workers=1)
    (r,) = bench_pages(opts, expand_configs(batch_sizes=(2,)), isolate=False)
    s = r["summary"]
    assert s["pages_failed"] == 1 and s["pages_per_min"] == pytest.approx(60 * 1 / s["wall_s"])


def test_bench_pages_reports_a_failed_document(tmp_path):
    pdf = synthetic_pdf(tmp_path / "good.pdf", 1)
    bad, other = tmp_path / "bad.pdf", tmp_path / "sub" / "bad.pdf"  # named by path: not one line for both
    other.parent.mkdir()
    for path in (bad, other):
        path.write_bytes(b"%PDF-1.4\nthis is not a pdf\n")
    opts = PageBenchOptions(model=TEXT, mmproj=MMPROJ, inputs=(str(pdf), str(bad), str(other)), max_tokens=2,
                            ignore_eos=True, longest_edge=112, render_workers=1)
    (r,) = bench_pages(opts, expand_configs(batch_sizes=(2,)), isolate=False)
    assert r["summary"]["pages_failed"] == 2 and r["summary"]["pages"] == 1
    failed = [p for p in r["pages"] if p["error"]]
    assert [p["doc"] for p in failed] == [str(bad), str(other)]
    assert all(p["n_tokens"] == 0 and set(p["seconds"]) == STAGES for p in failed)
    assert "(2 failed)" in format_table([r])
    assert failure_lines([r]) == ["2 documents failed:", *(f"  {p}: the PDF is damaged or truncated and cannot be opened" for p in (bad, other))]
    json.dumps(r)


def test_bench_decode_defaults_to_the_weights_transcribe_takes(tmp_path, monkeypatch):
    """`bench decode` without --weights measures what `auto` gives this model here (the options
    table's default, resolved by the loader's rule), not a storage of its own."""
    from pantheon_ocr.engine import loader

    monkeypatch.setattr(loader, "auto_weights", lambda model: ("bf16", "the rule, for this test"))
    out = tmp_path / "decode.json"
    assert main(["bench", "decode", "--model", TEXT, "--batch-size", "1", "--context", "4", "--steps", "1",
                 "--in-process", "--json", str(out)]) == 0
    (d,) = json.loads(out.read_text())
    assert d["storage"] == "bf16"
    assert main(["bench", "decode", "--model", TEXT, "--weights", "auto,f32,auto", "--batch-size", "1", "--context", "4",
                 "--steps", "1", "--in-process", "--json", str(out)]) == 0
    assert [r["storage"] for r in json.loads(out.read_text())] == ["bf16", "f32"]


def test_prefill_bench_prefills_as_transcribe_does(monkeypatch):
    """bench ocr --stage prefill measures what a page's prefill is in a run: the prompt in the options
    table's chunks into the KV cache transcribe takes (int8 weights: int8 KV where the compiled attention
    builds), the output head for the last chunk only (PageEngine.prefill_steps), a layer-truncated run
    scaled by its layers' share; a warm-up chunk before, outside the figures (as llama-batched-bench's)."""
    pytest.importorskip("torch")
    from pantheon_ocr.engine.cache import kv_kind
    from pantheon_ocr.engine.models.llama import Decoder

    heads, calls, warmups = [], [], []
    logits_of, hidden = Decoder.logits_of, Decoder.hidden
    monkeypatch.setattr(Decoder, "hidden", lambda self, state, ids, embd_rows=None: calls.append(len(ids)) or (
        warmups.append(1) if embd_rows is None else None) or hidden(self, state, ids, embd_rows))
    monkeypatch.setattr(Decoder, "logits_of", lambda self, *a, **kw: heads.append(1) or logits_of(self, *a, **kw))
    p = bench_prefill(TEXT, "int8", layers=1, longest_edge=896)
    assert p["prompt_tokens"] > 512 and p["kv_dtype"] == kv_kind("auto", "int8") and p["estimated"]
    assert len(heads) == 1  # one run, several chunks; the warm-up reads no head
    assert p["seconds_page"] > p["seconds_run"] > 0
    chunks = -(-p["prompt_tokens"] // p["prefill_chunk"])
    assert p["layer_s"] > 0 and len(warmups) == 1 and len(calls) == 1 + chunks  # the warm-up, then the run's chunks
