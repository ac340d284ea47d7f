"""The tiny GGUF writer produces what llama.cpp's converter would; fixtures match the weights.

No torch needed: reads files back with gguf.GGUFReader and checks names, shapes, types,
metadata, the Q/K permutation, and that the committed transformers fixtures were made from
exactly the weights ``tiny_models.make_tiny`` produces today.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from . import tiny_models as tm

gguf = pytest.importorskip("gguf")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def read(path: Path):
    r = gguf.GGUFReader(str(path))
    fields = {f.name: f.contents() for f in r.fields.values()}
    tensors = {t.name: t for t in r.tensors}
    return fields, tensors


def dequant(t) -> np.ndarray:
    shape = [int(n) for n in reversed(t.shape)]
    return np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)


def expected_names(arch: str, cfg: dict, experts: str = "merged") -> set[str]:
    names = {"token_embd.weight", "output_norm.weight"}
    if not cfg["tie_word_embeddings"]:
        names.add("output.weight")
    for i in range(cfg["num_hidden_layers"]):
        p = f"blk.{i}."
        names |= {p + "attn_norm.weight", p + "ffn_norm.weight", p + "attn_output.weight"}
        if arch == "phi3":
            names |= {p + "attn_qkv.weight", p + "ffn_up.weight", p + "ffn_down.weight"}
            continue
        names |= {p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"}
        if arch == "qwen2":
            names |= {p + "attn_q.bias", p + "attn_k.bias", p + "attn_v.bias"}
        if arch == "qwen3":
            names |= {p + "attn_q_norm.weight", p + "attn_k_norm.weight"}
        if arch == "mixtral":
            names.add(p + "ffn_gate_inp.weight")
            if experts == "merged":
                names |= {p + "ffn_gate_exps.weight", p + "ffn_up_exps.weight", p + "ffn_down_exps.weight"}
            else:
                for e in range(cfg["num_local_experts"]):
                    names |= {p + f"ffn_gate.{e}.weight", p + f"ffn_up.{e}.weight", p + f"ffn_down.{e}.weight"}
        else:
            names |= {p + "ffn_gate.weight", p + "ffn_up.weight", p + "ffn_down.weight"}
    return names


def expected_ne(name: str, cfg: dict) -> list[int]:
    """ggml shape (ne[0] first) of a tensor, from the HF config alone."""
    d, ff, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], tm.head_dim_of(cfg)
    E = cfg.get("num_local_experts")
    leaf = name.split(".", 2)[-1] if name.startswith("blk.") else name
    leaf = ".".join(p for p in leaf.split(".") if not p.isdigit())  # ffn_gate.3.weight -> ffn_gate.weight
    table = {
        "token_embd.weight": [d, V], "output.weight": [d, V], "output_norm.weight": [d],
        "attn_norm.weight": [d], "ffn_norm.weight": [d],
        "attn_q.weight": [d, nh * hd], "attn_k.weight": [d, nkv * hd], "attn_v.weight": [d, nkv * hd],
        "attn_q.bias": [nh * hd], "attn_k.bias": [nkv * hd], "attn_v.bias": [nkv * hd],
        "attn_q_norm.weight": [hd], "attn_k_norm.weight": [hd],
        "attn_output.weight": [nh * hd, d],
        "attn_qkv.weight": [d, nh * hd + 2 * nkv * hd],
        "ffn_gate.weight": [d, ff], "ffn_up.weight": [d, ff],
        "ffn_down.weight": [ff, d],
        "ffn_gate_inp.weight": [d, E], "ffn_gate_exps.weight": [d, ff, E], "ffn_up_exps.weight": [d, ff, E],
        "ffn_down_exps.weight": [ff, d, E],
    }
    if cfg["model_type"] == "phi3" and leaf == "ffn_up.weight":
        return [d, 2 * ff]
    return table[leaf]


@pytest.mark.parametrize("dtype", tm.DTYPES)
@pytest.mark.parametrize("arch", tm.ARCHS)
def test_names_shapes_types_values(tmp_path, arch, dtype):
    cfg, sd = tm.make_tiny(arch)
    path = tm.write_gguf(tmp_path / f"{arch}.gguf", arch, cfg, sd, dtype=dtype)
    fields, tensors = read(path)
    assert fields["general.architecture"] == tm.GGUF_ARCH[arch]
    assert set(tensors) == expected_names(arch, cfg)
    ref = tm.gguf_tensors(arch, cfg, sd)
    for name, t in tensors.items():
        assert [int(n) for n in t.shape] == expected_ne(name, cfg), name
        small = len(t.shape) <= 1 or name.endswith("_norm.weight") or "ffn_gate_inp" in name or name.endswith(".bias")
        want = "F32" if small else dtype
        assert t.tensor_type == gguf.GGMLQuantizationType[want], (name, t.tensor_type.name)
        # the weights are built to be exactly representable in every storage type
        np.testing.assert_array_equal(dequant(t), ref[name], err_msg=name)


def test_mixtral_split_experts(tmp_path):
    cfg, sd = tm.make_tiny("mixtral")
    path = tm.write_gguf(tmp_path / "m.gguf", "mixtral", cfg, sd, dtype="Q8_0", experts="split")
    _, tensors = read(path)
    assert set(tensors) == expected_names("mixtral", cfg, "split")
    for i in range(cfg["num_hidden_layers"]):
        for e in range(cfg["num_local_experts"]):
            for gg, hf in (("ffn_gate", "w1"), ("ffn_down", "w2"), ("ffn_up", "w3")):
                t = tensors[f"blk.{i}.{gg}.{e}.weight"]
                assert t.tensor_type == gguf.GGMLQuantizationType.Q8_0
                np.testing.assert_array_equal(
                    dequant(t), sd[f"model.layers.{i}.block_sparse_moe.experts.{e}.{hf}.weight"])


def test_mixtral_merged_experts_are_stacks(tmp_path):
    cfg, sd = tm.make_tiny("mixtral")
    _, tensors = read(tm.write_gguf(tmp_path / "m.gguf", "mixtral", cfg, sd))
    E = cfg["num_local_experts"]
    for i in range(cfg["num_hidden_layers"]):
        q = f"model.layers.{i}.block_sparse_moe."
        for gg, hf in (("ffn_gate_exps", "w1"), ("ffn_down_exps", "w2"), ("ffn_up_exps", "w3")):
            want = np.stack([sd[q + f"experts.{e}.{hf}.weight"] for e in range(E)])  # (E, out, in)
            np.testing.assert_array_equal(dequant(tensors[f"blk.{i}.{gg}.weight"]), want)
        np.testing.assert_array_equal(dequant(tensors[f"blk.{i}.ffn_gate_inp.weight"]), sd[q + "gate.weight"])


@pytest.mark.parametrize("arch", ["llama", "mistral", "mixtral"])
def test_llama_qk_unpermute_recovers_hf(tmp_path, arch):
    cfg, sd = tm.make_tiny(arch)
    _, tensors = read(tm.write_gguf(tmp_path / "x.gguf", arch, cfg, sd, dtype="Q8_0"))
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}.self_attn."
        q = dequant(tensors[f"blk.{i}.attn_q.weight"])
        k = dequant(tensors[f"blk.{i}.attn_k.weight"])
        assert not np.array_equal(q, sd[p + "q_proj.weight"])  # really permuted
        np.testing.assert_array_equal(tm.unpermute_qk(q, nh), sd[p + "q_proj.weight"])
        np.testing.assert_array_equal(tm.unpermute_qk(k, nkv), sd[p + "k_proj.weight"])
        np.testing.assert_array_equal(dequant(tensors[f"blk.{i}.attn_v.weight"]), sd[p + "v_proj.weight"])


def test_permutation_matches_converter_formula_and_biases():
    rng = np.random.default_rng(0)
    n_head, hd, n_in = 3, 8, 5
    w = rng.normal(size=(n_head * hd, n_in))
    b = rng.normal(size=(n_head * hd,))
    # row r of head h in the output = HF row h*hd + (r//2) + (r%2)*hd/2  (interleave the two halves)
    for x in (w, b):
        y = tm.permute_qk(x, n_head)
        for h in range(n_head):
            for r in range(hd):
                np.testing.assert_array_equal(y[h * hd + r], x[h * hd + r // 2 + (r % 2) * hd // 2])
        np.testing.assert_array_equal(tm.unpermute_qk(y, n_head), x)


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "phi3"])
def test_neox_archs_are_not_permuted(tmp_path, arch):
    cfg, sd = tm.make_tiny(arch)
    _, tensors = read(tm.write_gguf(tmp_path / "x.gguf", arch, cfg, sd))
    p = "model.layers.0."
    if arch == "phi3":
        # fused rows: Q, then K, then V (HF qkv_proj unchanged); ffn_up = gate rows then up rows
        np.testing.assert_array_equal(dequant(tensors["blk.0.attn_qkv.weight"]), sd[p + "self_attn.qkv_proj.weight"])
        np.testing.assert_array_equal(dequant(tensors["blk.0.ffn_up.weight"]), sd[p + "mlp.gate_up_proj.weight"])
        assert "blk.0.ffn_gate.weight" not in tensors
        return
    np.testing.assert_array_equal(dequant(tensors["blk.0.attn_q.weight"]), sd[p + "self_attn.q_proj.weight"])
    np.testing.assert_array_equal(dequant(tensors["blk.0.attn_k.weight"]), sd[p + "self_attn.k_proj.weight"])
    if arch == "qwen2":
        np.testing.assert_array_equal(dequant(tensors["blk.0.attn_q.bias"]), sd[p + "self_attn.q_proj.bias"])
        np.testing.assert_array_equal(dequant(tensors["blk.0.attn_k.bias"]), sd[p + "self_attn.k_proj.bias"])


def test_tied_output_head_for_llama(tmp_path):
    cfg, sd = tm.make_tiny("llama")
    assert cfg["tie_word_embeddings"] and "lm_head.weight" not in sd
    _, tensors = read(tm.write_gguf(tmp_path / "x.gguf", "llama", cfg, sd))
    assert "output.weight" not in tensors


@pytest.mark.parametrize("arch", tm.ARCHS)
def test_metadata(tmp_path, arch):
    cfg, sd = tm.make_tiny(arch)
    fields, _ = read(tm.write_gguf(tmp_path / "x.gguf", arch, cfg, sd, dtype="F16"))
    A = tm.GGUF_ARCH[arch]
    hd = tm.head_dim_of(cfg)
    assert fields[f"{A}.block_count"] == cfg["num_hidden_layers"]
    assert fields[f"{A}.context_length"] == cfg["max_position_embeddings"]
    assert fields[f"{A}.embedding_length"] == cfg["hidden_size"]
    assert fields[f"{A}.feed_forward_length"] == cfg["intermediate_size"]
    assert fields[f"{A}.attention.head_count"] == cfg["num_attention_heads"]
    assert fields[f"{A}.attention.head_count_kv"] == cfg["num_key_value_heads"]
    assert fields[f"{A}.rope.freq_base"] == pytest.approx(cfg["rope_theta"])
    assert fields[f"{A}.attention.layer_norm_rms_epsilon"] == pytest.approx(cfg["rms_norm_eps"])
    assert fields["general.file_type"] == 1
    if A == "llama":
        assert fields["llama.vocab_size"] == cfg["vocab_size"]
        assert fields["llama.rope.dimension_count"] == hd
    if A in ("qwen2", "qwen3"):
        assert f"{A}.vocab_size" not in fields and f"{A}.rope.dimension_count" not in fields
    # key_length only when the transformers config carries head_dim (llama, mistral, qwen3)
    if arch in ("llama", "mistral", "qwen3"):
        assert fields[f"{A}.attention.key_length"] == hd == fields[f"{A}.attention.value_length"]
    else:
        assert f"{A}.attention.key_length" not in fields
    if arch == "qwen3":
        assert hd == 32 != cfg["hidden_size"] // cfg["num_attention_heads"]
    if arch == "mixtral":
        assert fields["llama.expert_count"] == 4 and fields["llama.expert_used_count"] == 2
    if arch == "mistral":
        assert fields["llama.attention.sliding_window"] == 8  # our engine convention
    elif arch == "phi3":
        assert fields["phi3.attention.sliding_window"] == 0  # as the converter writes it
        assert fields["phi3.rope.dimension_count"] == 8 < hd
        assert fields["phi3.rope.scaling.original_context_length"] == cfg["original_max_position_embeddings"]
    else:
        assert f"{A}.attention.sliding_window" not in fields


def test_tokenizer_metadata(tmp_path):
    cfg, sd = tm.make_tiny("qwen3")
    fields, _ = read(tm.write_gguf(tmp_path / "x.gguf", "qwen3", cfg, sd))
    voc = tm.tiny_vocab()
    assert fields["tokenizer.ggml.model"] == "gpt2"
    assert fields["tokenizer.ggml.pre"] == "qwen2"
    tokens = fields["tokenizer.ggml.tokens"]
    types = fields["tokenizer.ggml.token_type"]
    assert len(tokens) == len(types) == cfg["vocab_size"]
    b2u = tm.bytes_to_unicode()
    assert tokens[:256] == [b2u[b] for b in range(256)]
    assert fields["tokenizer.ggml.merges"] == list(tm.TINY_MERGES)
    for i, merge in enumerate(tm.TINY_MERGES):
        assert tokens[256 + i] == merge.replace(" ", "")
    eos = fields["tokenizer.ggml.eos_token_id"]
    assert tokens[eos] == "<|im_end|>" and types[eos] == 3
    assert tokens[fields["tokenizer.ggml.bos_token_id"]] == "<|endoftext|>"
    assert fields["tokenizer.ggml.add_bos_token"] is False
    assert tokens[-1] == f"[PAD{cfg['vocab_size'] - 1}]" and types[-1] == 5
    assert types[voc["n_real"]] == 5 and types[voc["n_real"] - 1] == 3
    assert "<|im_start|>" in fields["tokenizer.chat_template"]


def test_tokenizer_builds_with_tokenizers():
    """The tiny vocab is a valid byte-level BPE: merges apply, special tokens stay whole."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    voc = tm.tiny_vocab()
    vocab = {t: i for i, t in enumerate(voc["tokens"])}
    bpe = models.BPE(vocab=vocab, merges=[tuple(m.split(" ")) for m in voc["merges"]])
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in tm.SPECIAL_TOKENS])
    enc = tok.encode("<|im_start|>hi the thing<|im_end|>")
    assert enc.ids[0] == voc["special_ids"]["<|im_start|>"] and enc.ids[-1] == voc["eos_token_id"]
    assert vocab["Ġthe"] in enc.ids and vocab["ing"] in enc.ids
    assert tok.decode(enc.ids, skip_special_tokens=False) == "<|im_start|>hi the thing<|im_end|>"
    assert tokenizers is not None


def test_exact_blocks_survive_every_storage_type():
    x = tm.exact_blocks(np.random.default_rng(3).normal(0, 0.1, size=(4, 64)))
    for name in ("F16", "BF16", "Q8_0"):
        qt = gguf.GGMLQuantizationType[name]
        back = gguf.quants.dequantize(gguf.quants.quantize(x, qt), qt).reshape(x.shape)
        np.testing.assert_array_equal(back, x, err_msg=name)


def test_make_tiny_is_deterministic():
    (c1, s1), (c2, s2) = tm.make_tiny("phi3"), tm.make_tiny("phi3")
    assert c1 == c2 and tm.state_dict_digest(s1) == tm.state_dict_digest(s2)
    assert all(v.dtype == np.float32 for v in s1.values())


# --- the committed transformers fixtures belong to these weights --------------------------------


@pytest.mark.parametrize("arch", tm.ARCHS)
def test_tiny_fixture_matches_weights(arch):
    path = FIXTURES / f"ref_tiny_{arch}.npz"
    if not path.exists():
        pytest.skip(f"{path.name} not generated (scripts/make_reference_fixtures.py)")
    z = np.load(path)
    meta = json.loads(str(z["meta"]))
    cfg, sd = tm.make_tiny(arch)
    assert meta["weights_sha256"] == tm.state_dict_digest(sd), "tiny_models changed: regenerate the fixtures"
    assert meta["hf_config"] == json.loads(json.dumps(cfg))
    ids = z["input_ids"]
    T, V = len(ids), cfg["vocab_size"]
    assert T > (cfg.get("sliding_window") or 0)
    assert z["logits"].shape == (T, V) and z["logits"].dtype == np.float32
    assert z["gen_ids"].shape == (10,) and z["gen_logits"].shape == (10, V)
    np.testing.assert_array_equal(z["gen_logits"].argmax(-1), z["gen_ids"])
    assert (z["gen_margin"] >= 1e-2).all()
    seed = int(meta["input_ids_call"].split("seed=")[1].rstrip(")"))
    np.testing.assert_array_equal(tm.make_input_ids(arch, T, seed=seed), ids)
    if arch == "mistral":
        W = cfg["sliding_window"]
        np.testing.assert_allclose(z["logits_nowindow"][:W], z["logits"][:W], atol=1e-5)
        assert np.abs(z["logits_nowindow"][W:] - z["logits"][W:]).max(-1).min() > 1e-3


# --- pypi_models (with fake packages, so no model download is needed) ----------------------------


@pytest.fixture
def fake_parts(tmp_path, monkeypatch):
    import pypi_models as pm

    site = tmp_path / "site"
    blobs = [os.urandom(1000 + 7 * i) for i in range(3)]
    for i, blob in enumerate(blobs):
        pkg = site / f"fakepart_{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("raise RuntimeError('must not be imported')\n")
        (pkg / "data" / "p.bin").write_bytes(blob)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PANTHEON_CACHE", str(tmp_path / "cache"))
    whole = b"".join(blobs)
    import hashlib

    model = pm.PypiModel(
        name="fake.gguf", parts=tuple((f"fakepart_{i}", "data/p.bin") for i in range(3)),
        size=len(whole), sha256=hashlib.sha256(whole).hexdigest(), pip="pip install fakepart",
    )
    return pm, model, whole


def test_pypi_assemble_and_reuse(fake_parts):
    pm, model, whole = fake_parts
    path = pm.model_path(model)
    assert path.parent == pm.cache_dir() and path.read_bytes() == whole
    mtime = path.stat().st_mtime_ns
    assert pm.model_path(model, verify=True) == path and path.stat().st_mtime_ns == mtime  # reused
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


def test_pypi_sha_mismatch_and_missing_package(fake_parts):
    from pantheon_ocr.errors import ModelError

    pm, model, whole = fake_parts
    bad = pm.PypiModel(model.name, model.parts, model.size, "0" * 64, model.pip)
    with pytest.raises(ModelError, match="SHA-256"):
        pm.model_path(bad)
    assert not list(pm.cache_dir().iterdir())  # nothing half-written left behind
    missing = pm.PypiModel("m.gguf", (("no_such_pkg_xyz", "a.bin"),), 1, None, "pip install no-such-pkg")
    with pytest.raises(ModelError, match="pip install no-such-pkg"):
        pm.model_path(missing)
