"""`models pull` / `models list` / `--model NAME` against a local Hub (tests/hub_server.py) on
127.0.0.1: fresh pull, resume after a broken connection, a corrupted transfer, offline mode, an
unknown repo, a repo without an mmproj, a private repo and its token; then the pulled model by
name in transcribe, an archive job and bench. The command line runs in a subprocess where the
environment matters (HF_ENDPOINT, HF_HOME, HF_HUB_OFFLINE, HF_TOKEN are read at import)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hub_server import HubServer, sha256
from pantheon_ocr.modelfiles.resolve import resolve_model
from pantheon_ocr.errors import ModelError
from pantheon_ocr.modelfiles.hub import local_models, pull

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures" / "lightonocr-tiny"
TEXT, MMPROJ = (FIX / "text.gguf").read_bytes(), (FIX / "mmproj.gguf").read_bytes()
PAIR = {"tiny-Q8_0.gguf": TEXT, "mmproj-tiny-f16.gguf": MMPROJ, "README.md": b"# tiny\n"}
IMAGE = FIX / "images" / "c_rgba_90x60.png"


@pytest.fixture
def hub():
    with HubServer() as h:
        h.add("acme/tiny-GGUF", dict(PAIR))
        yield h


def cli(*args, env_extra: dict | None = None, hf_home: Path, endpoint: str = "http://127.0.0.1:9") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_") and k != "HUGGING_FACE_HUB_TOKEN"}
    env.update(HF_HOME=str(hf_home), HF_ENDPOINT=endpoint, HF_HUB_DISABLE_TELEMETRY="1", PYTHONPATH=str(ROOT))
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "pantheon_ocr.cli", *args], capture_output=True, text=True, env=env,
                          timeout=600, cwd=ROOT)


def blobs(cache: Path) -> list[Path]:
    return sorted((cache / "models--acme--tiny-GGUF" / "blobs").glob("*"))


# -- the library ----------------------------------------------------------------------------------
def test_fresh_pull_downloads_verifies_and_lists(hub, tmp_path):
    got = pull("acme/tiny-GGUF", endpoint=hub.endpoint, cache_dir=tmp_path, progress=False)
    assert got.text.name == "tiny-Q8_0.gguf" and got.mmproj.name == "mmproj-tiny-f16.gguf"
    assert got.text.read_bytes() == TEXT and got.mmproj.read_bytes() == MMPROJ
    assert got.revision == "0123456789abcdef0123456789abcdef01234567"
    # the files are the hub cache's own: blobs named by their sha256, linked from the snapshot
    assert [b.name for b in blobs(tmp_path)] == sorted([sha256(TEXT), sha256(MMPROJ)])
    assert not any(r[1].endswith("README.md") for r in hub.requests)  # only the pair is fetched
    [m] = local_models(tmp_path)
    assert m.name == "acme/tiny-GGUF" and [(f.name, f.size, f.quant, f.mmproj) for f in m.files] == [
        ("mmproj-tiny-f16.gguf", len(MMPROJ), "F16", True), ("tiny-Q8_0.gguf", len(TEXT), "Q8_0", False)]
    n = len(hub.requests)  # pulling again: up to date, nothing downloaded
    again = pull("acme/tiny-GGUF", endpoint=hub.endpoint, cache_dir=tmp_path, progress=False)
    assert again == got and not hub.gets("/blobs/")[2:] and all(r[1].startswith(("/api/", "/acme/"))
                                                                 for r in hub.requests[n:])


def test_resume_after_the_connection_breaks_mid_file(hub, tmp_path):
    hub.cut_once.add(sha256(TEXT))
    got = pull("acme/tiny-GGUF", endpoint=hub.endpoint, cache_dir=tmp_path, progress=False)
    assert got.text.read_bytes() == TEXT
    text_gets = hub.gets(f"/blobs/{sha256(TEXT)}")
    assert len(text_gets) == 2 and "range" not in text_gets[0][2]
    # the second GET asks only for the rest: from what was written (whole chunks of what came)
    start = int(text_gets[1][2]["range"].removeprefix("bytes=").rstrip("-"))
    assert 0 < start <= len(TEXT) // 2


def test_a_corrupted_transfer_is_detected_and_not_kept(hub, tmp_path):
    hub.corrupt.add(sha256(MMPROJ))  # the right size and ETag, the wrong bytes
    with pytest.raises(ModelError, match="corrupted transfer: .* the bad file was removed, run the pull again") as exc:
        pull("acme/tiny-GGUF", endpoint=hub.endpoint, cache_dir=tmp_path, progress=False)
    assert exc.value.path == "acme/tiny-GGUF/mmproj-tiny-f16.gguf" and exc.value.exit_code == 3
    assert [b.name for b in blobs(tmp_path)] == [sha256(TEXT)]  # the good file stays, the bad one is gone
    snap = tmp_path / "models--acme--tiny-GGUF" / "snapshots" / "0123456789abcdef0123456789abcdef01234567"
    assert not (snap / "mmproj-tiny-f16.gguf").exists() and not (snap / "mmproj-tiny-f16.gguf").is_symlink()
    hub.corrupt.clear()  # the next pull gets it right
    assert pull("acme/tiny-GGUF", endpoint=hub.endpoint, cache_dir=tmp_path, progress=False).mmproj.read_bytes() == MMPROJ


def test_unknown_repo_and_repo_without_mmproj(hub, tmp_path):
    with pytest.raises(ModelError, match="acme/nope: no such model repo on the Hub") as exc:
        pull("acme/nope", endpoint=hub.endpoint, cache_dir=tmp_path)
    assert exc.value.exit_code == 3 and "\n" not in str(exc.value)
    with pytest.raises(ModelError, match="acme/tiny-GGUF: the repo has no revision 'v9'"):
        pull("acme/tiny-GGUF", revision="v9", endpoint=hub.endpoint, cache_dir=tmp_path)
    hub.add("acme/text-only", {"t-Q8_0.gguf": TEXT})
    with pytest.raises(ModelError, match="acme/text-only: holds no mmproj GGUF"):
        pull("acme/text-only", endpoint=hub.endpoint, cache_dir=tmp_path)
    hub.add("acme/two-texts", {"t-Q8_0.gguf": TEXT, "mmproj-F16.gguf": TEXT})
    with pytest.raises(ModelError, match="two text files"):  # checked when pulled, not at the first page
        pull("acme/two-texts", endpoint=hub.endpoint, cache_dir=tmp_path, progress=False)
    assert not hub.gets("/blobs/")[4:]  # nothing but the two-texts pair was downloaded
    commit = hub.repos["acme/tiny-GGUF"].commit  # a commit as --revision
    assert pull("acme/tiny-GGUF", revision=commit, endpoint=hub.endpoint, cache_dir=tmp_path,
                progress=False).text.parent.name == commit


def test_the_loader_resolves_a_pulled_name(hub, tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ModelError, match="not pulled .* run `pantheon-ocr models pull acme/tiny-GGUF`"):
        resolve_model("acme/tiny-GGUF", None)
    # owner/repo is also a relative folder's spelling: a mistyped one is said as one, the pull too
    with pytest.raises(ModelError, match="^models/lightonocr: not pulled .*, and no file or folder of that name "
                                         "here: run `pantheon-ocr models pull models/lightonocr`$"):
        resolve_model("models/lightonocr", None)
    with pytest.raises(ModelError, match="^lightonocr-2: not pulled"):  # a short name is no path
        resolve_model("lightonocr-2", None)
    got = pull("acme/tiny-GGUF", endpoint=hub.endpoint, cache_dir=tmp_path, progress=False)
    assert resolve_model("acme/tiny-GGUF", None) == (got.text, got.mmproj)
    assert resolve_model("acme/tiny-GGUF:Q8_0", "other-mmproj.gguf") == (got.text, Path("other-mmproj.gguf"))


# -- the command line --------------------------------------------------------------------------------
def test_cli_pull_list_and_transcribe_by_name(hub, tmp_path):
    home = tmp_path / "hf"
    r = cli("models", "pull", "acme/tiny-GGUF", "--no-progress", hf_home=home, endpoint=hub.endpoint)
    assert r.returncode == 0, r.stderr
    assert str(home / "hub" / "models--acme--tiny-GGUF" / "snapshots") in r.stdout  # HF_HOME is where files go
    r = cli("models", "list", hf_home=home)
    assert r.returncode == 0 and "acme/tiny-GGUF" in r.stdout and "tiny-Q8_0.gguf" in r.stdout and "MB" in r.stdout
    out = tmp_path / "out"
    r = cli("transcribe", str(IMAGE), "--model", "acme/tiny-GGUF", "-o", str(out), "--max-tokens", "2", "--no-progress",
            hf_home=home, env_extra={"HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr
    assert (out / "c_rgba_90x60.md").is_file()


def test_cli_not_pulled_is_one_line_naming_the_pull_command(tmp_path):
    img = tmp_path / "p.png"
    img.write_bytes(IMAGE.read_bytes())
    r = cli("transcribe", str(img), "--model", "lightonocr-2", "-o", str(tmp_path / "o"), hf_home=tmp_path / "hf")
    assert r.returncode == 3
    assert r.stderr.count("\n") == 1 and "run `pantheon-ocr models pull lightonocr-2`" in r.stderr


def test_cli_offline_with_and_without_a_cached_copy(hub, tmp_path):
    home = tmp_path / "hf"
    r = cli("models", "pull", "acme/tiny-GGUF", hf_home=home, endpoint=hub.endpoint, env_extra={"HF_HUB_OFFLINE": "1"})
    assert r.returncode == 3 and "offline (HF_HUB_OFFLINE is set) and not in the cache" in r.stderr
    assert "unset HF_HUB_OFFLINE to download it" in r.stderr
    assert r.stderr.count("\n") == 1 and not hub.requests  # offline: not one request
    assert cli("models", "pull", "acme/tiny-GGUF", "--no-progress", hf_home=home, endpoint=hub.endpoint).returncode == 0
    n = len(hub.requests)
    r = cli("models", "pull", "acme/tiny-GGUF", hf_home=home, endpoint=hub.endpoint, env_extra={"HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr
    assert "tiny-Q8_0.gguf" in r.stdout and "not checked against the Hub" in r.stderr and len(hub.requests) == n


def test_cli_private_repo_needs_the_token(hub, tmp_path):
    hub.add("acme/private-GGUF", dict(PAIR), token="hf_secret")
    home = tmp_path / "hf"
    r = cli("models", "pull", "acme/private-GGUF", hf_home=home, endpoint=hub.endpoint)
    assert r.returncode == 3 and "no such model repo on the Hub (or it is private: log in or set HF_TOKEN)" in r.stderr
    r = cli("models", "pull", "acme/private-GGUF", "--no-progress", hf_home=home, endpoint=hub.endpoint,
            env_extra={"HF_TOKEN": "hf_secret"})
    assert r.returncode == 0, r.stderr
    assert all(req[2].get("authorization") == "Bearer hf_secret" for req in hub.requests[-5:] if "/blobs/" not in req[1])
    assert not any("authorization" in req[2] for req in hub.gets("/blobs/"))  # never sent to the CDN


def test_archive_job_names_a_pulled_model(hub, tmp_path):
    home = tmp_path / "hf"
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "p.png").write_bytes(IMAGE.read_bytes())
    job = tmp_path / "job.toml"
    job.write_text('inputs = ["in"]\noutput = "out"\n[model]\nname = "acme/tiny-GGUF"\n[ocr]\nmax_tokens = 2\n')
    r = cli("archive", "run", str(job), "--no-progress", hf_home=home)
    assert r.returncode == 3 and "run `pantheon-ocr models pull acme/tiny-GGUF` (model.name in job.toml)" in r.stderr
    assert not (tmp_path / "out").exists()  # a nightly job never downloads
    assert cli("models", "pull", "acme/tiny-GGUF", "--no-progress", hf_home=home, endpoint=hub.endpoint).returncode == 0
    job.write_text(job.read_text().replace('name = "acme/tiny-GGUF"', 'text = "acme/tiny-GGUF"'))  # `text = NAME` too
    r = cli("archive", "run", str(job), "--no-progress", hf_home=home, env_extra={"HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "out" / "p.md").is_file()


def test_bench_takes_a_pulled_name(hub, tmp_path, monkeypatch):
    from huggingface_hub import constants

    from pantheon_ocr.cli import main

    pull("acme/tiny-GGUF", endpoint=hub.endpoint, cache_dir=tmp_path, progress=False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    code = main(["bench", "pages", "--model", "acme/tiny-GGUF", "--synthetic", "1", "--max-tokens", "1", "--ignore-eos",
                 "--longest-edge", "112", "--render-workers", "1", "--json", str(tmp_path / "b.json")])
    assert code == 0 and (tmp_path / "b.json").is_file()


def test_settings_and_caches_that_are_broken_are_said_not_internal_errors(hub, tmp_path):
    """HF_ENDPOINT that is no URL: a setting to fix (2), not 'try again later'; a ref file of the
    cache that is no text: the list goes on; an answer huggingface_hub trips over (its own cache
    file of another shape, say) is a passing fault (69), not a bad model (3)."""
    from pantheon_ocr.errors import ExitCode, NetworkError
    from pantheon_ocr.modelfiles import catalog, hub as hub_module

    for endpoint, words in (("http://[::1", "not a URL"), ("ftp://x", "not an http(s) URL"), ("not a url", "not an")):
        r = cli("models", "pull", "acme/tiny-GGUF", "--no-progress", hf_home=tmp_path / "hf", endpoint=endpoint)
        assert r.returncode == ExitCode.BAD_ARGUMENTS and r.stderr.startswith(f"error: HF_ENDPOINT {endpoint!r}: {words}")
    home = tmp_path / "hf2"
    assert cli("models", "pull", "acme/tiny-GGUF", "--no-progress", hf_home=home, endpoint=hub.endpoint).returncode == 0
    (home / "hub" / "models--acme--tiny-GGUF" / "refs" / "main").write_bytes(b"\xff\xfe")
    r = cli("models", "list", hf_home=home)
    assert r.returncode == 0 and "acme/tiny-GGUF" in r.stdout, r.stderr
    error = hub_module._hub_error(catalog.parse_name("acme/tiny-GGUF"), None,
                                  AttributeError("'list' object has no attribute 'get'"))
    assert isinstance(error, NetworkError) and error.exit_code == ExitCode.NETWORK
    assert "could not be used: AttributeError: 'list' object has no attribute 'get'; try again later" in str(error)


# -- the cache as users leave it: another pull under way, files deleted or cut ------------------------
def test_a_pull_waiting_for_another_says_so_and_takes_what_it_brought(hub, tmp_path):
    """A second pull of the same file waited in silence for up to the deadline, then downloaded
    the file again."""
    import threading

    from huggingface_hub.utils import WeakFileLock

    lock = tmp_path / ".locks" / "models--acme--tiny-GGUF" / f"{sha256(TEXT)}.lock"
    lock.parent.mkdir(parents=True)
    said: list[str] = []
    result: list = []
    with WeakFileLock(lock):  # the other pull, downloading the text GGUF
        worker = threading.Thread(target=lambda: result.append(pull(
            "acme/tiny-GGUF", endpoint=hub.endpoint, cache_dir=tmp_path, progress=False, log=said.append)))
        worker.start()
        for _ in range(100):
            if any("waiting" in line for line in said):
                break
            worker.join(0.1)
        assert f"acme/tiny-GGUF/tiny-Q8_0.gguf: another pull is downloading it ({lock}); waiting" in said
        blob = tmp_path / "models--acme--tiny-GGUF" / "blobs" / sha256(TEXT)
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(TEXT)  # what the other pull brings before it lets go
    worker.join(30)
    assert result and result[0].text.read_bytes() == TEXT
    assert "acme/tiny-GGUF/tiny-Q8_0.gguf: brought by the other pull, checksum verified" in said
    assert hub.gets(f"/blobs/{sha256(TEXT)}") == []  # not downloaded twice


def test_a_deleted_or_cut_file_in_the_cache_is_said_with_the_pull_that_mends_it(hub, tmp_path):
    home = tmp_path / "hf"
    assert cli("models", "pull", "acme/tiny-GGUF:Q8_0", "--quant", "q8_0", "--no-progress", hf_home=home,
               endpoint=hub.endpoint).stderr.endswith("ready: pantheon-ocr transcribe DOCS --model acme/tiny-GGUF:Q8_0\n")
    r = cli("models", "pull", "acme/tiny-GGUF:Q8_0", "--quant", "Q4_K_M", hf_home=home, endpoint=hub.endpoint)
    assert r.returncode == 2 and "names the quantization Q8_0 and quant says Q4_K_M: give one" in r.stderr
    cache = home / "hub" / "models--acme--tiny-GGUF"
    text_blob, mmproj_blob = cache / "blobs" / sha256(TEXT), cache / "blobs" / sha256(MMPROJ)
    text_blob.write_bytes(TEXT[: len(TEXT) // 2])  # a copy cut short
    img = tmp_path / "p.png"
    img.write_bytes(IMAGE.read_bytes())
    r = cli("transcribe", str(img), "--model", "acme/tiny-GGUF", "-o", str(tmp_path / "o"), hf_home=home)
    assert r.returncode == 3 and r.stderr.count("\n") == 1, r.stderr
    assert ("the Hugging Face cache's copy is damaged: `pantheon-ocr models pull acme/tiny-GGUF --quant Q8_0` fetches it "
            "again") in r.stderr
    mmproj_blob.unlink()  # deleted by hand: half a model
    r = cli("models", "list", hf_home=home)
    assert "acme/tiny-GGUF" in r.stdout and ("deleted from the cache: mmproj-tiny-f16.gguf; "
                                             "`pantheon-ocr models pull acme/tiny-GGUF` fetches it again") in r.stdout
    r = cli("transcribe", str(img), "--model", "acme/tiny-GGUF", "-o", str(tmp_path / "o"), hf_home=home)
    assert r.returncode == 3 and "mmproj-tiny-f16.gguf missing from the Hugging Face cache" in r.stderr
    assert r.stderr.rstrip().endswith("run `pantheon-ocr models pull acme/tiny-GGUF --quant Q8_0`")


def test_a_deleted_file_outside_the_pair_asked_for_stands_in_no_way(hub, tmp_path):
    """With two quantizations pulled and one of them deleted, the other (asked for by name) was
    refused for the deleted one, and the pull it advised could not bring it back."""
    from pantheon_ocr.modelfiles.catalog import local_pair

    hub.add("acme/two-GGUF", {"ocr-Q8_0.gguf": TEXT, "ocr-Q4_K_M.gguf": TEXT + b"\0", "mmproj-ocr-f16.gguf": MMPROJ})
    for quant in ("Q8_0", "Q4_K_M"):
        pull("acme/two-GGUF", quant, endpoint=hub.endpoint, cache_dir=tmp_path, progress=False)
    (tmp_path / "models--acme--two-GGUF" / "blobs" / sha256(TEXT)).unlink()  # ocr-Q8_0.gguf's
    text, mmproj = local_pair("acme/two-GGUF:Q4_K_M", tmp_path)
    assert text.name == "ocr-Q4_K_M.gguf" and mmproj.name == "mmproj-ocr-f16.gguf"
    with pytest.raises(ModelError, match=r"ocr-Q8_0.gguf missing from the Hugging Face cache .*: run "
                                         r"`pantheon-ocr models pull acme/two-GGUF --quant Q8_0`$"):
        local_pair("acme/two-GGUF:Q8_0", tmp_path)


def test_a_disk_without_room_is_said_before_a_byte_comes(hub, tmp_path, monkeypatch):
    """A full disk was found as the file was written (exit 73), the partial file left on it."""
    import shutil as _shutil

    from pantheon_ocr.errors import WriteError
    from pantheon_ocr.modelfiles import hub as hub_module

    real = _shutil.disk_usage
    monkeypatch.setattr(hub_module.shutil, "disk_usage", lambda p: real(p)._replace(free=len(TEXT) // 2))
    with pytest.raises(WriteError, match=r"^acme/tiny-GGUF/tiny-Q8_0.gguf: [\d.,]+ MB to download but [\d.,]+ MB free in "):
        pull("acme/tiny-GGUF", endpoint=hub.endpoint, cache_dir=tmp_path, progress=False)
    assert hub.gets("/blobs/") == [] and not list(tmp_path.rglob("*.incomplete"))
