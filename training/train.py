"""Train the reader (see training/README.md for the recipe and the command that made the shipped one).

    python -m training.train RUN_DIR --ctc-steps 5000 --joint-steps 15000   # from scratch, then export
    python -m training.train RUN_DIR ... --resume                             # after a stop or a crash
    python -m training.train RUN_DIR2 ... --init-gguf pantheon_ocr/bundled/reader   # from shipped weights

Stage `ctc` trains the vision tower and the projector through a CTC head on the projector output
(plain joint training collapses: the decoder learns a language model and the projector a constant).
Stage `joint` adds the decoder's cross-entropy on the text, with the vision side frozen for the
first `--freeze` steps and CTC kept as an auxiliary loss. Progress (losses, steps/s, held-out CER)
goes to stdout and RUN_DIR/log.jsonl; RUN_DIR/last.pt is rewritten atomically every
`--save-every` steps and on SIGTERM/SIGINT. When the last stage ends, the GGUF pair is exported.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
import torch

from . import tokenizer as tok
from .data import LineStream, pixels
from .lines import fixed_set
from .metrics import error_rates
from .model import Reader, ReaderConfig
from .steps import Prompt, ce_loss, ctc_loss, ctc_read, greedy_read


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--ctc-steps", type=int, default=5000, help="stage 1: vision + projector + CTC head")
    ap.add_argument("--joint-steps", type=int, default=15000, help="stage 2: everything, decoder cross-entropy")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--freeze", type=int, default=300, help="joint: steps with vision + projector frozen")
    ap.add_argument("--freeze-vision", action="store_true",
                    help="joint: keep the vision tower frozen throughout (about twice as fast a step; the "
                         "projector and the decoder still learn)")
    ap.add_argument("--vision-lr", type=float, default=1.0,
                    help="joint: the vision tower's and projector's learning rate as a share of --lr (a low rate "
                         "adapts them to new faces without undoing what stage 1 taught)")
    ap.add_argument("--ctc-weight", type=float, default=0.3, help="joint: weight of the auxiliary CTC loss")
    ap.add_argument("--corrupt", type=float, default=0.2,
                    help="joint: share of fed text tokens replaced by random ones (forces reading the image)")
    ap.add_argument("--shuffle", type=float, default=0.15, help="share of lines whose words are shuffled")
    ap.add_argument("--typeset", type=float, default=0.15,
                    help="share of lines that are pieces of groff-typeset pages, cut as the pipeline cuts pages "
                         "(training/typeset.py; needs groff, else drawn lines); at the --line-width, --line-stretch")
    ap.add_argument("--max-chars", type=int, default=100,
                    help="characters per training line; below 45, short pieces cut at words (the pieces a "
                         "reader with pantheon.reader.line_width reads long lines in)")
    ap.add_argument("--line-width", type=int, default=0, help="export: pantheon.reader.line_width (px; 0: none)")
    ap.add_argument("--line-stretch", type=float, default=1.0, help="export: pantheon.reader.line_stretch (1: none)")
    ap.add_argument("--resume", action="store_true", help="continue RUN_DIR/last.pt (weights, optimizer, stage, step)")
    ap.add_argument("--init-gguf", type=Path, help="start from an exported pair's weights (a directory)")
    ap.add_argument("--export", type=Path, help="write the GGUF pair here at the end (default RUN_DIR/gguf)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--eval-lines", type=int, default=192)
    ap.add_argument("--save-every", type=int, default=100)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--config", type=json.loads, default={}, help="ReaderConfig overrides, JSON")
    return ap.parse_args(argv)


def save(path: Path, **state) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def lr_at(step: int, total: int, base: float, warmup: int) -> float:
    if step < warmup:
        return base * (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return base * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


def evaluate(model, prompt, vocab, stage, lines, batch=48) -> dict:
    model.eval()
    ctc_pairs, dec_pairs = [], []
    with torch.no_grad():
        for i in range(0, len(lines), batch):
            chunk = sorted(lines[i: i + batch], key=lambda ln: ln.image.shape[1])
            x, widths = pixels([ln.image for ln in chunk])
            tokens = model.image_tokens(x, widths)
            refs = [ln.text for ln in chunk]
            ctc_pairs += list(zip(refs, ctc_read(model, tokens, widths)))
            if stage == "joint":
                dec_pairs += list(zip(refs, [vocab.decode(s) for s in greedy_read(model, prompt, tokens, widths)]))
    model.train()
    out = {"ctc_cer": error_rates(ctc_pairs)["cer"]}
    if dec_pairs:
        r = error_rates(dec_pairs)
        out.update(cer=r["cer"], wer=r["wer"], example=dec_pairs[len(dec_pairs) // 2])
    else:
        out["example"] = ctc_pairs[len(ctc_pairs) // 2]
    return out


def grounding(model, prompt, batch) -> tuple[float, float]:
    """Cross-entropy with each line's own image, and with its neighbour's (shuffled)."""
    with torch.no_grad():
        tokens = model.image_tokens(batch["pixels"], batch["widths"])
        real = ce_loss(model, prompt, tokens, batch["widths"], batch["ids"]).item()
        shuffled = torch.zeros_like(tokens)
        rolled, rw = tokens.roll(1, 0), batch["widths"].roll(1, 0)
        for i in range(tokens.shape[0]):
            n = min(int(rw[i]), int(batch["widths"][i])) // 2
            shuffled[i, :, :n] = rolled[i, :, :n]
        fake = ce_loss(model, prompt, shuffled, batch["widths"], batch["ids"]).item()
    return real, fake


class Trainer:
    """One run: the model, its vocabulary, the optimizer of the current stage, and the step."""

    def __init__(self, a):
        self.a = a
        a.run_dir.mkdir(parents=True, exist_ok=True)
        self.ckpt = a.run_dir / "last.pt"
        state = torch.load(self.ckpt, weights_only=False) if a.resume else None
        if a.resume and state is None:
            raise SystemExit(f"{self.ckpt}: nothing to resume")
        if state is not None:
            self.cfg, vocab_json = ReaderConfig(**state["config"]), state["tokenizer"]
        elif a.init_gguf:
            from .gguf_import import load_pair

            model, vocab_json = load_pair(a.init_gguf)
            self.cfg = model.c
        else:
            self.cfg, vocab_json = ReaderConfig(vocab=a.vocab, **a.config), None
        vocab_path = a.run_dir / "tokenizer.json"
        if vocab_json is None:
            tok.save(tok.train_vocab(self.cfg.vocab, seed=a.seed), vocab_path)
            vocab_json = vocab_path.read_text()
        vocab_path.write_text(vocab_json)
        self.vocab_json, self.vocab = vocab_json, tok.load(vocab_path)
        self.prompt = Prompt(self.vocab)
        self.model = Reader(self.cfg)
        if state is not None:
            self.model.load_state_dict(state["model"])
        elif a.init_gguf:
            self.model.load_state_dict(model.state_dict(), strict=False)  # the CTC head starts fresh
        self.stage, self.step = (state["stage"], state["step"]) if state else ("ctc", 0)
        self.rng = np.random.default_rng([a.seed, self.step, 7])  # token corruption
        self.opt = self._optimizer()
        if state is not None:
            self.opt.load_state_dict(state["opt"])

    @property
    def vision_side(self):
        m = self.model
        return list(m.vision.parameters()) + list(m.projector.parameters()) + list(m.ctc_head.parameters())

    @property
    def encoder(self):
        """The vision tower and the projector (what --freeze and --vision-lr apply to)."""
        return list(self.model.vision.parameters()) + list(self.model.projector.parameters())

    def _optimizer(self):
        self.params = self.vision_side if self.stage == "ctc" else list(self.model.parameters())
        slow = {id(p) for p in self.encoder} if self.stage == "joint" else set()
        groups = []
        for scale, members in ((self.a.vision_lr, [p for p in self.params if id(p) in slow]),
                               (1.0, [p for p in self.params if id(p) not in slow])):
            for decay in (True, False):
                ps = [p for p in members if (p.ndim >= 2) == decay]
                if ps:
                    groups.append({"params": ps, "weight_decay": 0.01 if decay else 0.0, "scale": scale})
        return torch.optim.AdamW(groups, lr=self.a.lr, betas=(0.9, 0.98))

    def save(self) -> None:
        save(self.ckpt, model=self.model.state_dict(), opt=self.opt.state_dict(), step=self.step, stage=self.stage,
             config=self.cfg.to_dict(), tokenizer=self.vocab_json, args={k: str(v) for k, v in vars(self.a).items()})

    def run_stage(self, total: int, batches, stop, log) -> None:
        a, model, stage = self.a, self.model, self.stage
        eval_lines = fixed_set(a.eval_lines, "heldout", 1234, self.cfg.line_height, self.cfg.max_width,
                               max_chars=a.max_chars)
        t_last, n_last, losses = time.perf_counter(), self.step, []
        model.train()
        while self.step < total and not stop["now"]:
            batch = next(batches)
            frozen = stage == "joint" and self.step < a.freeze
            for p in self.encoder:  # the CTC head keeps learning while the encoder is frozen
                p.requires_grad_(not frozen)
            if stage == "joint" and a.freeze_vision:
                for p in model.vision.parameters():
                    p.requires_grad_(False)
            for g in self.opt.param_groups:
                g["lr"] = lr_at(self.step, total, a.lr, a.warmup) * g.get("scale", 1.0)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
                tokens = model.image_tokens(batch["pixels"], batch["widths"])
                l_ctc = ctc_loss(model, tokens, batch["widths"], batch["ctc"])
                if stage == "joint":
                    l_ce = ce_loss(model, self.prompt, tokens, batch["widths"], batch["ids"], a.corrupt, self.rng)
                    loss = l_ce + a.ctc_weight * l_ctc
                else:
                    l_ce, loss = torch.zeros(()), l_ctc
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.params, 1.0)
            self.opt.step()
            self.step += 1
            losses.append((l_ctc.item(), l_ce.item()))
            if self.step % 25 == 0:
                now = time.perf_counter()
                rate = (self.step - n_last) / (now - t_last)
                ctc_m, ce_m = np.mean(losses, axis=0)
                print(f"{stage} step {self.step}/{total} ctc {ctc_m:.3f} ce {ce_m:.3f} lr {self.opt.param_groups[0]['lr']:.2e} "
                      f"{rate:.2f} steps/s {rate * a.batch:.0f} lines/s{' (vision frozen)' if frozen else ''}", flush=True)
                log.write(json.dumps({"stage": stage, "step": self.step, "ctc": float(ctc_m), "ce": float(ce_m),
                                      "steps_per_s": rate}) + "\n")
                t_last, n_last, losses = now, self.step, []
            if self.step % a.save_every == 0:
                self.save()
            if self.step % a.eval_every == 0 or self.step == total:
                r = evaluate(model, self.prompt, self.vocab, stage, eval_lines)
                if stage == "joint":
                    r.update(zip(("ce_real", "ce_shuffled"), grounding(model, self.prompt, batch)))
                print(f"eval {stage} step {self.step}: " + json.dumps(r, ensure_ascii=False), flush=True)
                log.write(json.dumps({"stage": stage, "step": self.step, "eval": r}, ensure_ascii=False) + "\n")
                log.flush()


def main(argv=None) -> int:
    a = parse(argv)
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    t = Trainer(a)
    n_params = sum(p.numel() for n, p in t.model.named_parameters() if not n.startswith("ctc_head"))
    print(f"reader: {n_params / 1e6:.2f} M parameters (+ CTC head "
          f"{sum(p.numel() for p in t.model.ctc_head.parameters()) / 1e6:.2f} M, training only); "
          f"stage {t.stage} step {t.step}", flush=True)
    stream = LineStream(a.seed * 1_000_003 + t.step + (10**9 if t.stage == "joint" else 0), a.batch,
                        t.cfg.line_height, t.cfg.max_width, t.vocab.encode, shuffle=a.shuffle, max_chars=a.max_chars,
                        typeset=a.typeset, piece_width=a.line_width, stretch=a.line_stretch)
    loader = torch.utils.data.DataLoader(stream, batch_size=None, num_workers=a.workers,
                                         persistent_workers=a.workers > 0, prefetch_factor=4 if a.workers else None)
    batches = iter(loader)
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    signal.signal(signal.SIGINT, lambda *_: stop.update(now=True))
    with (a.run_dir / "log.jsonl").open("a") as log:
        if t.stage == "ctc":
            t.run_stage(a.ctc_steps, batches, stop, log)
            if not stop["now"]:
                t.stage, t.step = "joint", 0
                t.opt = t._optimizer()
        if t.stage == "joint" and not stop["now"]:
            t.run_stage(a.joint_steps, batches, stop, log)
    t.save()
    print(f"saved {t.ckpt} ({t.stage} step {t.step})", flush=True)
    if t.stage == "joint" and t.step >= a.joint_steps:
        from .export import export

        for p in export(t.model.eval(), t.vocab, a.export or a.run_dir / "gguf", line_width=a.line_width,
                        line_stretch=a.line_stretch):
            print(f"wrote {p} ({p.stat().st_size / 1e6:.1f} MB)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
