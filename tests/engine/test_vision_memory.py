"""The torch vision tower's memory on the CPU, over the mmproj's memory map (MappedLinear): the
same bits as resident copies for every float type the file may store, copies for quantized
types, and each block's pages out of the resident set once it has run."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from pantheon_ocr.engine.backends.common import openmp_env

openmp_env()
torch = pytest.importorskip("torch")

from pantheon_ocr.engine import load_vlm  # noqa: E402
from pantheon_ocr.engine.backends.torch_vision import LightOnOCRVision, MappedLinear, TorchVisionBackend  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
# matrices of 256 x 1024 and more: whole pages inside every tensor, so dropping them shows in smaps
VISION = dict(n_embd=256, n_ff=1024, n_head=4, image_size=224)
TEXT = dict(n_embd=128, n_ff=256, n_head=4, n_head_kv=2, head_dim=32, n_ctx=4096)
FLOAT_TYPES = ("F32", "F16", "BF16")


def _make_random():
    path = ROOT / "scripts" / "make_random_lightonocr.py"
    spec = importlib.util.spec_from_file_location("make_random_lightonocr", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, mod)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """mmproj type -> (text, mmproj) paths: 2 vision layers at VISION's shapes."""
    make_random = _make_random()
    folder = tmp_path_factory.mktemp("mapped")
    return {t: make_random.make_pair(folder, 2, 1, "F32", seed=5, log=None, text=TEXT, vision=VISION, n_vocab=4096,
                                     mmproj_dtype=t, tag=f"mapped-{t}")
            for t in FLOAT_TYPES + ("Q8_0",)}


def _vlm(pair):
    return load_vlm(*pair, weights="f32", vision_weights="quantized")


def _pixels(seed=0):
    rng = np.random.default_rng(seed)
    return rng.uniform(-1.5, 1.5, size=(1, 3, 14 * 12, 14 * 9)).astype(np.float32)


def _mapped_count(module) -> int:
    return sum(isinstance(m, MappedLinear) for m in module.modules())


@pytest.mark.parametrize("mmproj_type", FLOAT_TYPES + ("Q8_0",))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mapped_tower_equals_resident_copies_bit_for_bit(pairs, mmproj_type, dtype):
    vlm = _vlm(pairs[mmproj_type])
    mapped = LightOnOCRVision(vlm.vision, vlm.projector, dtype, vlm.mmproj).eval()
    copies = LightOnOCRVision(vlm.vision, vlm.projector, dtype).eval()
    # each matrix of the blocks and the projector is a view where the file stores it as floats (a Q8_0
    # file keeps mm.patch_merger F32, as the converter writes it), a copy where quantized
    floats = [n for n, t in vlm.mmproj.tensors.items()
              if len(t.shape) == 2 and n != "v.patch_embd.weight" and t.qtype.name in FLOAT_TYPES]
    assert len(floats) == (7 * 2 + 3 if mmproj_type in FLOAT_TYPES else 1)
    assert _mapped_count(mapped) == len(floats)
    assert _mapped_count(copies) == 0
    px = torch.from_numpy(_pixels())
    with torch.inference_mode():
        a, b = mapped(px), copies(px)
        again = mapped(px)  # its pages dropped after the first run: faulted back in, same bits
    assert a.shape == b.shape and torch.isfinite(a).all()
    assert torch.equal(a, b)
    assert torch.equal(again, b)


def test_mapped_weights_are_the_files_bytes(pairs):
    vlm = _vlm(pairs["BF16"])
    module = LightOnOCRVision(vlm.vision, vlm.projector, torch.bfloat16, vlm.mmproj)
    down = module.layers[0].feed_forward.down_proj
    assert isinstance(down, MappedLinear) and down.stored.dtype == torch.bfloat16
    raw = vlm.mmproj.raw("v.blk.0.ffn_down.weight")
    assert down.stored.data_ptr() == raw.ctypes.data  # a view of the map, not a copy
    q = module.layers[0].q_proj
    assert q.rows is not None and sorted(q.rows.tolist()) == list(range(VISION["n_embd"]))  # un-permuted per call


def _mapped_rss_kb(path: Path) -> int:
    """Resident kB of every mapping of `path` in this process (/proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5 and ":" not in head[0]:  # a mapping's header line
            inside = len(head) >= 6 and head[-1] == str(path)
        elif inside and head[0] == "Rss:":
            total += int(head[1])
    return total


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux's /proc/self/smaps")
@pytest.mark.parametrize("mmproj_type", ["BF16", "F16"])
def test_each_blocks_pages_leave_the_resident_set_once_it_has_run(pairs, mmproj_type):
    path = pairs[mmproj_type][1]
    vlm = _vlm(pairs[mmproj_type])
    backend = TorchVisionBackend(vlm, "cpu", "bfloat16")
    matrix_kb = sum(t.n_bytes for n, t in vlm.mmproj.tensors.items() if len(t.shape) == 2) // 1024
    assert matrix_kb > 4000  # enough pages for the test to mean something
    assert _mapped_rss_kb(path) < matrix_kb / 10  # after the build: nothing read stays resident

    seen = []  # resident kB of the map when each block starts: its predecessors' pages are gone
    hooks = [block.register_forward_pre_hook(lambda *_: seen.append(_mapped_rss_kb(path)))
             for block in backend.module.layers]
    out = backend.encode(_pixels()[0])
    for h in hooks:
        h.remove()
    assert np.isfinite(out).all()
    block_kb = matrix_kb / 2  # two layers hold nearly all of the matrices (the projector is small)
    assert len(seen) == 2 and seen[1] < 0.5 * block_kb  # block 0's weights left before block 1 ran
    assert _mapped_rss_kb(path) < matrix_kb / 10  # and after the page, every block's

    # the same tower from copies holds its weights resident (what the test is measuring is real)
    copies = LightOnOCRVision(vlm.vision, vlm.projector, torch.bfloat16)
    held = sum(p.numel() * p.element_size() for p in copies.parameters()) // 1024
    assert held > 0.9 * matrix_kb  # bfloat16 copies of 2-byte matrices

