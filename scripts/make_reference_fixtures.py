#!/usr/bin/env python
"""Write the transformers reference fixtures the decoder engine tests compare against.

Needs the ``ref`` extra (torch==2.13.0, transformers, accelerate) and, for the real models, the
PyPI model packages (tests/requirements-models.txt, located by tests/pypi_models.py). Runs offline.

    python scripts/make_reference_fixtures.py                 # everything
    python scripts/make_reference_fixtures.py --only tiny     # tiny | smollm2 | qwen05b (repeatable)

Outputs in tests/fixtures/:

ref_tiny_<arch>.npz (arch in llama, mistral, mixtral, qwen2, qwen3, phi3), from transformers' own
<Arch>ForCausalLM built from ``tiny_models.make_tiny(arch)`` (float32, eager attention):
    input_ids   int64 [T]        T = 24 (> the mistral window 8)
    logits      f32   [T, V]     one forward over the whole prompt (no cache)
    gen_ids     int64 [10]       greedy continuation, KV cache (generate, do_sample=False, EOS ignored)
    gen_logits  f32   [10, V]    logits that chose each gen_ids[i] (step 0 = last prompt row)
    logits_nowindow f32 [T, V]   mistral only: same weights with sliding_window=None
    meta        str (JSON)       versions, hf_config, weights digest, notes

ref_smollm2.npz / ref_qwen05b.npz, from the real GGUF files loaded by transformers
(``from_pretrained(dir, gguf_file=...)``, dequantized to float32, eager attention):
    prompt_ids        int64 [T]      chat-template prompt (tokenizer's own template)
    subset_ids        int64 [2048]   sorted vocab ids whose logits are stored (includes every argmax)
    logits_subset     f32   [T, 2048]
    argmax            int64 [T]      full-vocab argmax per prompt position
    logsumexp         f64   [T]      full-vocab logsumexp per position (computed in float64)
    last_logits       f32   [V]      full row at the last prompt position
    gen_ids           int64 [20]     greedy continuation with KV cache (EOS not ignored: it stops there)
    gen_logits_subset f32   [20, 2048], gen_logsumexp f64 [20]   per decode step
    meta              str (JSON)

tokenizer_refs_<model>.json: test strings and the ids transformers' GGUF tokenizer gives
(add_special_tokens=False).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "engine"))

import tiny_models  # noqa: E402

FIXTURES = REPO / "tests" / "fixtures"
TINY_T = 24
TINY_GEN = 10
REAL_GEN = 20
N_SUBSET = 2048
MIN_MARGIN = 1e-2

CHAT_MESSAGES = [
    {"role": "user", "content": "Write a Python function that returns the sum of the squares of a list of integers."}
]

# Test strings for the tokenizer references.
TOKENIZER_STRINGS = [
    "Hello world",
    "Hello, world! How are you today?",
    " leading space",
    "trailing space ",
    "  two leading spaces",
    "1234567",
    " 123 456",
    "x1y22z333",
    "3.14159 and 2024-11-29, 1,000,000",
    "a   b\n\n\t c",
    "\n\n\n",
    "line1\r\nline2",
    "tabs\t\tand  spaces   end   ",
    "café naïve résumé Ærøskøbing",
    "cafe\u0301 (decomposed accent)",
    "Straße Œuvre ĳ ﬁ",
    "我想在apple工作1314151天～",
    "日本語のテキストです。",
    "한국어 텍스트",
    "Здравствуй, мир",
    "مرحبا بالعالم",
    "कान्तिपुर",
    "def f(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    '<div class="x">&amp;</div>',
    "SELECT * FROM t WHERE id=42;",
    "emoji 🚀🦙 😶\u200d🌫️ ✅ 👍🏽",
    "<|im_start|>user\nhi<|im_end|>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>",
    "text<|im_end|>more<|im_start|>",
    "I've been 'told he's there, 'RE you sure? We'Ve a'lL",
    "''''''```````\"\"\"\"......!!!!!!??????",
    # llama.cpp's pre-tokenizer fingerprint text (conversion/base.py get_vocab_base_pre)
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ (multiple emojis concatenated) ✅ 🦙🦙 "
    "3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ "
    "------======= нещо на Български ''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, "
    "'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL",
]


def versions() -> dict[str, str]:
    import gguf  # noqa: F401
    import tokenizers
    import torch
    import transformers
    from importlib.metadata import version

    return {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "gguf": version("gguf"),
        "accelerate": version("accelerate"),
    }


def save_npz(path: Path, **arrays) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez_compressed(tmp, **arrays)
    os.replace(tmp, path)
    print(f"  wrote {path.relative_to(REPO)} ({path.stat().st_size / 1e6:.2f} MB)")


def save_json(path: Path, obj) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    print(f"  wrote {path.relative_to(REPO)} ({path.stat().st_size / 1e3:.1f} kB)")


# ---------------------------------------------------------------------------------------------
# tiny models
# ---------------------------------------------------------------------------------------------


def to_transformers_state_dict(arch: str, cfg: dict, sd: dict[str, np.ndarray]) -> dict:
    """Hub-checkpoint names -> the parameter names of transformers' module tree (v5)."""
    import torch

    out = {}
    n_exp = cfg.get("num_local_experts")
    for name, arr in sd.items():
        if ".block_sparse_moe." in name:
            continue
        out[name] = torch.from_numpy(np.array(arr, dtype=np.float32))
    if arch == "mixtral":
        # transformers 5 keeps experts fused: gate_up_proj [E, 2*ff, d] (gate rows first, matching
        # `gate, up = linear(x, gate_up_proj[e]).chunk(2)`), down_proj [E, d, ff]; router = mlp.gate
        for i in range(cfg["num_hidden_layers"]):
            p = f"model.layers.{i}."
            q = p + "block_sparse_moe."
            out[p + "mlp.gate.weight"] = torch.from_numpy(sd[q + "gate.weight"].copy())
            gate_up = [np.concatenate([sd[q + f"experts.{e}.w1.weight"], sd[q + f"experts.{e}.w3.weight"]], 0)
                       for e in range(n_exp)]
            out[p + "mlp.experts.gate_up_proj"] = torch.from_numpy(np.stack(gate_up))
            out[p + "mlp.experts.down_proj"] = torch.from_numpy(
                np.stack([sd[q + f"experts.{e}.w2.weight"] for e in range(n_exp)]))
    if cfg.get("tie_word_embeddings"):
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
    return out


def build_tiny(arch: str, cfg: dict, sd: dict[str, np.ndarray]):
    import torch
    import transformers

    cls = getattr(transformers, tiny_models.HF_ARCHITECTURE[arch])
    config_cls = cls.config_class
    kwargs = {k: v for k, v in cfg.items() if k not in ("model_type",)}
    config = config_cls(**kwargs)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = cls(config).to(torch.float32).eval()
    assert model.config._attn_implementation == "eager", model.config._attn_implementation
    tsd = to_transformers_state_dict(arch, cfg, sd)
    missing, unexpected = model.load_state_dict(tsd, strict=True)
    assert not missing and not unexpected
    if cfg.get("tie_word_embeddings"):
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    # loaded exactly?
    msd = model.state_dict()
    for k, v in tsd.items():
        assert torch.equal(msd[k], v), k
    return model


def greedy_generate(model, input_ids, n_new: int, eos_stops: bool):
    """generate() with KV cache, greedy; returns (gen_ids [n], step_logits [n, V]) as numpy."""
    import torch
    from transformers import GenerationConfig

    if not eos_stops:
        # generate() merges in model.generation_config, so clear EOS there too. (min_new_tokens
        # would not do: it bans EOS from the argmax instead of letting it through.)
        model.generation_config.eos_token_id = None
    gc = GenerationConfig(
        max_new_tokens=n_new,
        do_sample=False,
        use_cache=True,
        output_logits=True,
        return_dict_in_generate=True,
        eos_token_id=model.config.eos_token_id if eos_stops else None,
        pad_token_id=model.config.pad_token_id if model.config.pad_token_id is not None else 0,
        temperature=None,
        top_p=None,
        top_k=None,
    )
    x = torch.tensor(np.asarray(input_ids)[None], dtype=torch.long)
    with torch.no_grad():
        out = model.generate(x, attention_mask=torch.ones_like(x), generation_config=gc)
    gen = out.sequences[0, x.shape[1]:].numpy().astype(np.int64)
    logits = torch.stack([s[0] for s in out.logits]).float().numpy()
    return gen, logits


def margins(logits: np.ndarray) -> np.ndarray:
    """top-1 minus top-2 logit per row."""
    part = np.sort(logits, axis=-1)[..., -2:]
    return (part[..., 1] - part[..., 0]).astype(np.float32)


def forward_logits(model, ids) -> np.ndarray:
    import torch

    with torch.no_grad():
        x = torch.tensor(np.asarray(ids)[None], dtype=torch.long)
        return model(x, use_cache=False).logits[0].float().numpy()


def make_tiny_fixture(arch: str, vers: dict) -> None:
    t0 = time.time()
    cfg, sd = tiny_models.make_tiny(arch)
    model = build_tiny(arch, cfg, sd)
    # Random weights make near-ties likely; pick the first prompt seed whose greedy continuation
    # has a top-1/top-2 margin >= MIN_MARGIN at every step, so engines can compare ids exactly.
    for ids_seed in range(7, 100):
        ids = tiny_models.make_input_ids(arch, TINY_T, seed=ids_seed)
        gen, gen_logits = greedy_generate(model, ids, TINY_GEN, eos_stops=False)
        if margins(gen_logits).min() >= MIN_MARGIN:
            break
    else:
        raise RuntimeError(f"{arch}: no prompt seed with greedy margins >= {MIN_MARGIN}")
    assert gen.shape == (TINY_GEN,)
    logits = forward_logits(model, ids)

    # Self-checks: cached decoding == a fresh full forward over prompt + continuation.
    full = forward_logits(model, np.concatenate([ids, gen[:-1]]))
    assert np.array_equal(full[TINY_T - 1:].argmax(-1), gen), "cached greedy != uncached argmax"
    dec_err = float(np.abs(full[TINY_T - 1:] - gen_logits).max())
    assert dec_err < 1e-4, dec_err
    assert np.abs(gen_logits[0] - logits[-1]).max() < 1e-4

    arrays = dict(input_ids=ids, logits=logits.astype(np.float32), gen_ids=gen,
                  gen_logits=gen_logits.astype(np.float32), gen_margin=margins(gen_logits))
    notes = []
    if arch == "mistral":
        W = cfg["sliding_window"]
        cfg_nw = dict(cfg, sliding_window=None)
        nowin = forward_logits(build_tiny(arch, cfg_nw, sd), ids)
        # transformers' sliding-window mask (masking_utils.sliding_window_overlay) is
        # kv_idx > q_idx - W: the query at p sees keys p-W+1 .. p (W keys, itself included).
        # So rows 0..W-1 match full causal attention exactly and rows >= W must differ.
        assert np.abs(nowin[:W] - logits[:W]).max() < 1e-5
        diff = np.abs(nowin[W:] - logits[W:]).max(axis=-1)
        assert (diff > 1e-3).all(), f"sliding window not applied? {diff}"
        arrays["logits_nowindow"] = nowin.astype(np.float32)
        notes.append(
            f"sliding_window={W}: query at position p attends keys max(0, p-{W - 1})..p; verified: rows < {W} "
            f"equal the no-window run, rows >= {W} differ (min max|diff| {diff.min():.3g}); the cached "
            "generate() continuation matches an uncached forward, so decode uses the same window"
        )
    meta = dict(
        kind="tiny", arch=arch, gguf_arch=tiny_models.GGUF_ARCH[arch], hf_class=type(model).__name__,
        hf_config=cfg, weights_sha256=tiny_models.state_dict_digest(sd), seed=tiny_models.SEEDS[arch],
        input_ids_call=f"tiny_models.make_input_ids({arch!r}, {TINY_T}, seed={ids_seed})",
        attn_implementation="eager", dtype="float32", T=TINY_T, n_gen=TINY_GEN,
        generate="greedy, KV cache, EOS does not stop generation (pure argmax for 10 steps)",
        decode_vs_full_max_abs=dec_err, versions=vers, notes=notes,
    )
    arrays["meta"] = np.array(json.dumps(meta))
    save_npz(FIXTURES / f"ref_tiny_{arch}.npz", **arrays)
    print(f"  {arch}: {time.time() - t0:.1f}s, gen {gen.tolist()}")


# ---------------------------------------------------------------------------------------------
# real models
# ---------------------------------------------------------------------------------------------


def _smollm_llamacpp_tokenizer(tok):
    """transformers' GGUF tokenizer with llama.cpp's `smollm` pre-tokenizer (digits split first).

    transformers has no split regex for pre `smollm` and falls back to plain GPT-2 ByteLevel.
    llama.cpp (and SmolLM2's original tokenizer.json: Digits(individual) + ByteLevel) split
    every digit out first.
    """
    import copy

    from tokenizers import pre_tokenizers

    backend = copy.deepcopy(tok.backend_tokenizer)
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    return backend


def tokenizer_refs(name: str, tok, path: Path, vers: dict) -> None:
    cases = []
    alt = _smollm_llamacpp_tokenizer(tok) if name == "smollm2" else None
    n_diff = 0
    for text in TOKENIZER_STRINGS:
        ids = [int(i) for i in tok.encode(text, add_special_tokens=False)]
        case = {"text": text, "ids": ids, "decoded_roundtrip": tok.decode(ids) == text}
        if alt is not None:
            alt_ids = [int(i) for i in alt.encode(text, add_special_tokens=False).ids]
            case["ids_llamacpp_pretok"] = alt_ids
            n_diff += alt_ids != ids
        cases.append(case)
    notes = [
        "ids from transformers' tokenizer built from the GGUF metadata (AutoTokenizer.from_pretrained(dir, "
        "gguf_file=...)), add_special_tokens=False; control tokens (<|im_start|> ...) are matched whole.",
    ]
    if name.startswith("qwen"):
        notes.append("no Unicode normalisation is applied, as in llama.cpp (Qwen's original tokenizer.json applies "
                     "NFC, so decomposed accents tokenize differently there).")
    if alt is not None:
        notes.append(
            "transformers has no regex for tokenizer.ggml.pre='smollm' and uses GPT-2 ByteLevel splitting; "
            "'ids_llamacpp_pretok' re-encodes with llama.cpp's smollm rule (Digits(individual) then GPT-2 "
            f"ByteLevel, like SmolLM2's tokenizer.json); they differ on {n_diff} of {len(cases)} strings."
        )
    obj = {
        "model": name,
        "gguf_file": path.name,
        "tokenizer_class": type(tok).__name__,
        "pre_tokenizer": str(tok.backend_tokenizer.pre_tokenizer),
        "add_special_tokens": False,
        "versions": vers,
        "notes": notes,
        "cases": cases,
    }
    save_json(FIXTURES / f"tokenizer_refs_{name}.json", obj)


def make_real_fixture(name: str, path: Path, sha256: str, vers: dict) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    tokenizer_refs(name, tok, path, vers)
    prompt_text = tok.apply_chat_template(CHAT_MESSAGES, add_generation_prompt=True, tokenize=False)
    enc = tok.apply_chat_template(CHAT_MESSAGES, add_generation_prompt=True, tokenize=True)
    ids = enc["input_ids"] if hasattr(enc, "keys") else enc
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    assert ids.tolist() == tok.encode(prompt_text, add_special_tokens=False), "template ids != encode(text)"
    t1 = time.time()
    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    t_load = time.time() - t1
    logits = forward_logits(model, ids)  # [T, V]
    V = logits.shape[1]
    gen, gen_logits = greedy_generate(model, ids, REAL_GEN, eos_stops=True)
    if len(gen):
        full = forward_logits(model, np.concatenate([ids, gen[:-1]]))
        assert np.array_equal(full[len(ids) - 1:].argmax(-1), gen), "cached greedy != uncached argmax"
        dec_err = float(np.abs(full[len(ids) - 1:] - gen_logits).max())
    else:
        dec_err = 0.0

    argmax = logits.argmax(-1).astype(np.int64)
    rng = np.random.default_rng(20240601)
    must = np.unique(np.concatenate([argmax, gen, gen_logits.argmax(-1), ids]))
    rest = np.setdiff1d(np.arange(V), must)
    subset = np.sort(np.concatenate([must, rng.choice(rest, N_SUBSET - len(must), replace=False)])).astype(np.int64)

    def lse(x):
        x = x.astype(np.float64)
        m = x.max(-1, keepdims=True)
        return (m + np.log(np.exp(x - m).sum(-1, keepdims=True)))[..., 0]

    meta = dict(
        kind="real", model=name, gguf_file=path.name, gguf_sha256=sha256, gguf_arch=model.config.model_type,
        hf_class=type(model).__name__, dtype="float32", attn_implementation="eager",
        messages=CHAT_MESSAGES, prompt_text=prompt_text, T=int(len(ids)), n_vocab=int(V),
        n_gen=int(len(gen)), generate="greedy, KV cache, stops at EOS", decode_vs_full_max_abs=dec_err,
        gen_text=tok.decode(gen), load_seconds=round(t_load, 1), versions=vers,
        tokenizer_class=type(tok).__name__,
    )
    save_npz(
        FIXTURES / f"ref_{name}.npz",
        prompt_ids=ids,
        subset_ids=subset,
        logits_subset=logits[:, subset].astype(np.float32),
        argmax=argmax,
        logsumexp=lse(logits),
        last_logits=logits[-1].astype(np.float32),
        gen_ids=gen.astype(np.int64),
        gen_logits_subset=gen_logits[:, subset].astype(np.float32),
        gen_logsumexp=lse(gen_logits),
        gen_margin=margins(gen_logits),
        prompt_margin=margins(logits),
        meta=np.array(json.dumps(meta)),
    )
    print(f"  {name}: T={len(ids)} V={V} load {t_load:.1f}s total {time.time() - t0:.1f}s; "
          f"continuation {tok.decode(gen)!r}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", action="append", choices=["tiny", "smollm2", "qwen05b"],
                    help="produce only these (repeatable); default: all")
    ap.add_argument("--arch", action="append", choices=list(tiny_models.ARCHS), help="tiny archs (default: all)")
    args = ap.parse_args(argv)
    only = set(args.only or ["tiny", "smollm2", "qwen05b"])

    import torch

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    vers = versions()
    print("versions:", vers)
    t0 = time.time()
    if "tiny" in only:
        for arch in args.arch or tiny_models.ARCHS:
            make_tiny_fixture(arch, vers)
    from tests import pypi_models

    if "smollm2" in only:
        make_real_fixture("smollm2", pypi_models.smollm2_path(verify=True), pypi_models.SMOLLM2.sha256, vers)
    if "qwen05b" in only:
        make_real_fixture("qwen05b", pypi_models.qwen05b_path(verify=True), pypi_models.QWEN05B.sha256, vers)
    print(f"done in {time.time() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
