"""Post N page images at once to a running llama-server's chat endpoint (the peer for
`pantheon-ocr bench pages`; docs/benchmarks.md "Whole pages"), each asking for --tokens tokens with
EOS ignored; print each request's server timings and the pages per minute of the whole batch.

    llama-server -m TEXT.gguf --mmproj MMPROJ.gguf -np 4 -c 16384 -t 2 --port 8088 &
    python scripts/llama_server_pages.py page.png page.png page.png page.png --url http://127.0.0.1:8088
"""

from __future__ import annotations

import argparse
import base64
import json
import threading
import time
import urllib.request
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("images", nargs="+", type=Path)
    ap.add_argument("--url", default="http://127.0.0.1:8088")
    ap.add_argument("--tokens", type=int, default=1000)
    a = ap.parse_args(argv)

    def body(path: Path) -> bytes:
        url = "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()
        msg = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]
        return json.dumps({"messages": msg, "max_tokens": a.tokens, "temperature": 0, "ignore_eos": True}).encode()

    results: list = [None] * len(a.images)

    def post(i: int, data: bytes) -> None:
        t = time.perf_counter()
        req = urllib.request.Request(a.url + "/v1/chat/completions", data, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=6 * 3600) as r:
            reply = json.loads(r.read())
        results[i] = {"seconds": round(time.perf_counter() - t, 1), "usage": reply.get("usage"),
                      "timings": reply.get("timings")}

    bodies = [body(p) for p in a.images]
    t0 = time.perf_counter()
    threads = [threading.Thread(target=post, args=(i, b)) for i, b in enumerate(bodies)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    for r in results:
        print(json.dumps(r))
    print(f"{len(a.images)} pages in {wall:.1f} s = {len(a.images) / wall * 60:.3f} pages/min")
    return 0 if all(results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
