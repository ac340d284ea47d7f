"""Model names and which files of a repo make the pair (modelfiles/catalog.py): no network."""

from __future__ import annotations

import pytest

from pantheon_ocr.modelfiles.catalog import (KNOWN, ModelRef, is_digest, local_files, local_pair, parse_name, pick_pair,
                                             quant_of, safe_repo_path, safe_revision, snapshot_dir)
from pantheon_ocr.errors import ModelError, UsageError

# The files the LightOnOCR-2-1B GGUF repos list (their model cards; see engine/catalog.py)
WANGJAZZ = ["README.md", ".gitattributes", "LightOnOCR-2-1B-f16.gguf", "LightOnOCR-2-1B-Q8_0.gguf",
            "LightOnOCR-2-1B-Q4_K_M.gguf", "LightOnOCR-2-1B-mmproj-f16.gguf"]
MRADERMACHER = ["LightOnOCR-2-1B-bbox.Q4_K_M.gguf", "LightOnOCR-2-1B-bbox.Q6_K.gguf", "LightOnOCR-2-1B-bbox.Q8_0.gguf",
                "LightOnOCR-2-1B-bbox.f16.gguf", "LightOnOCR-2-1B-bbox.mmproj-Q8_0.gguf",
                "LightOnOCR-2-1B-bbox.mmproj-f16.gguf"]


@pytest.mark.parametrize("name,quant", [
    ("LightOnOCR-2-1B-Q4_K_M.gguf", "Q4_K_M"), ("LightOnOCR-2-1B-f16.gguf", "F16"), ("mmproj-F32.gguf", "F32"),
    ("LightOnOCR-2-1B-bbox.mmproj-Q8_0.gguf", "Q8_0"), ("x.Q4_K_S.gguf", "Q4_K_S"), ("lightonocr-1b-q4_k.gguf", "Q4_K"),
    ("model-BF16.gguf", "BF16"), ("LightOnOCR-2-1B-IQ3_M.gguf", "IQ3_M"), ("model.gguf", None), ("F16-1B.gguf", "F16"),
])
def test_quant_of_file_names(name, quant):
    assert quant_of(name) == quant


def test_parse_names():
    assert parse_name("lightonocr-2") == ModelRef(KNOWN["lightonocr-2"].repo, None, "lightonocr-2")
    assert parse_name("LightOnOCR-2:q4_k_m") == ModelRef(KNOWN["lightonocr-2"].repo, "Q4_K_M", "lightonocr-2")
    assert parse_name("acme/Some-Model.GGUF-repo:Q8_0") == ModelRef("acme/Some-Model.GGUF-repo", "Q8_0")
    assert parse_name("acme/x", quant="f16").quant == "F16"
    for not_a_name in ("book.pdf", "models/text.gguf", "/abs/path", "a/b/c", "../up/x", "./x/y", "x"):
        assert parse_name(not_a_name) is None, not_a_name
    with pytest.raises(UsageError, match="not a GGUF quantization"):
        parse_name("lightonocr-2:best")


def test_known_names_point_at_repos():
    assert {"lightonocr-1", "lightonocr-2", "lightonocr-2-bbox"} <= set(KNOWN)
    assert KNOWN["lightonocr-1"].repo == "ggml-org/LightOnOCR-1B-1025-GGUF"
    for v in KNOWN.values():
        assert parse_name(v.repo).repo == v.repo and v.quants


def test_pick_pair_defaults_and_choices():
    ref = parse_name("lightonocr-2")
    assert pick_pair(WANGJAZZ, ref, "r") == ("LightOnOCR-2-1B-Q8_0.gguf", "LightOnOCR-2-1B-mmproj-f16.gguf")
    assert pick_pair(WANGJAZZ, parse_name("lightonocr-2:Q4_K_M"), "r")[0] == "LightOnOCR-2-1B-Q4_K_M.gguf"
    assert pick_pair(WANGJAZZ, parse_name("lightonocr-2:F16"), "r")[0] == "LightOnOCR-2-1B-f16.gguf"
    # mmproj: F16 preferred over a quantized one (and over F32)
    assert pick_pair(MRADERMACHER, parse_name("lightonocr-2-bbox"), "r") == (
        "LightOnOCR-2-1B-bbox.Q8_0.gguf", "LightOnOCR-2-1B-bbox.mmproj-f16.gguf")
    assert pick_pair(["m-Q6_K.gguf", "mmproj-F32.gguf", "mmproj-F16.gguf"], parse_name("a/b"), "r")[1] == "mmproj-F16.gguf"
    # an owner/repo without the default quants: its only text file
    assert pick_pair(["t-Q5_K_S.gguf", "mmproj.gguf"], parse_name("a/b"), "r") == ("t-Q5_K_S.gguf", "mmproj.gguf")


@pytest.mark.parametrize("files,name,match", [
    (WANGJAZZ, "lightonocr-2:Q6_K", "has no Q6_K text GGUF \\(quantizations here: F16, Q4_K_M, Q8_0\\)"),
    (["t-Q8_0.gguf", "README.md"], "a/b", "holds no mmproj GGUF"),
    (["mmproj-f16.gguf"], "a/b", "holds no text GGUF"),
    (["t-Q5_K_S.gguf", "t-Q3_K_M.gguf", "mmproj.gguf"], "a/b", "several text GGUFs"),
])
def test_pick_pair_errors_say_what_is_there(files, name, match):
    with pytest.raises(ModelError, match=match) as exc:
        pick_pair(files, parse_name(name), "acme/repo")
    assert exc.value.path == "acme/repo" and exc.value.exit_code == 3 and "\n" not in str(exc.value)


def _snapshot(cache, repo, files, commit="c0ffee", ref="main"):
    root = cache / ("models--" + repo.replace("/", "--"))
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / ref).write_text(commit)
    snap = root / "snapshots" / commit
    snap.mkdir(parents=True, exist_ok=True)
    for f in files:
        (snap / f).parent.mkdir(parents=True, exist_ok=True)
        (snap / f).write_bytes(b"x")
    return snap


def test_local_pair_reads_the_cache_and_never_downloads(tmp_path):
    with pytest.raises(ModelError, match="not pulled .*run `pantheon-ocr models pull lightonocr-2`") as exc:
        local_pair("lightonocr-2", tmp_path)
    assert exc.value.exit_code == 3 and "\n" not in str(exc.value)
    snap = _snapshot(tmp_path, KNOWN["lightonocr-2"].repo, WANGJAZZ[2:])
    assert local_pair("lightonocr-2", tmp_path) == (snap / "LightOnOCR-2-1B-Q8_0.gguf", snap / "LightOnOCR-2-1B-mmproj-f16.gguf")
    assert local_pair("lightonocr-2:Q4_K_M", tmp_path)[0].name == "LightOnOCR-2-1B-Q4_K_M.gguf"
    with pytest.raises(ModelError, match="has no Q6_K .*models pull lightonocr-2 --quant Q6_K"):
        local_pair("lightonocr-2:Q6_K", tmp_path)
    (snap / "LightOnOCR-2-1B-Q8_0.gguf").unlink()  # what is there decides: the next preferred one
    assert local_pair("lightonocr-2", tmp_path)[0].name == "LightOnOCR-2-1B-Q4_K_M.gguf"


def test_names_from_the_hub_become_paths_only_when_safe():
    for ok in ("LightOnOCR-2-1B-Q8_0.gguf", "gguf/mmproj-f16.gguf", "a/b/c.gguf", "x...gguf"):
        assert safe_repo_path(ok), ok
    for bad in ("../x.gguf", "a/../../x.gguf", "/etc/x.gguf", "a//b.gguf", "./x.gguf", "a\\..\\x.gguf", "x\0.gguf",
                "", "..", "a/", 3, None):
        assert not safe_repo_path(bad), bad
    assert safe_revision("main") and safe_revision("refs/pr/3") and not safe_revision("../../x")
    assert is_digest("0" * 40) and is_digest("a" * 64) and not is_digest("A" * 64) and not is_digest("../escaped-blob")
    assert not is_digest("d41d8cd98f00b204e9800998ecf8427e")  # an md5 names no blob


def test_a_pair_in_a_folder_and_a_ref_that_leads_out(tmp_path):
    snap = _snapshot(tmp_path, "acme/folder", ["gguf/m-Q8_0.gguf", "gguf/mmproj-f16.gguf"])
    assert local_files(snap) == ["gguf/m-Q8_0.gguf", "gguf/mmproj-f16.gguf"]
    assert local_pair("acme/folder", tmp_path) == (snap / "gguf/m-Q8_0.gguf", snap / "gguf/mmproj-f16.gguf")
    root = tmp_path / "models--acme--folder"
    (root / "refs" / "main").write_text("..")  # a ref must name a snapshot, not its parent
    assert snapshot_dir("acme/folder", "main", tmp_path) is None
    assert snapshot_dir("acme/folder", "../../x", tmp_path) is None
