"""The two losses and greedy reading, shared by training and evaluation.

The decoder sees exactly the engine's prompt: `<|im_start|>system<|im_end|>\\n<|im_start|>user\\n`,
the image tokens, `<|im_end|>\\n<|im_start|>assistant\\n`, then the text and `<|im_end|>`.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from .charset import CHARS, CTC_BLANK
from .model import Reader


class Prompt:
    def __init__(self, vocab):
        t = vocab.id
        self.prefix = [t("<|im_start|>"), t("system"), t("<|im_end|>"), t("Ċ"), t("<|im_start|>"), t("user"), t("Ċ")]
        self.suffix = [t("<|im_end|>"), t("Ċ"), t("<|im_start|>"), t("assistant"), t("Ċ")]
        self.image = t("<|image_pad|>")
        self.stop = t("<|im_end|>")


def image_token_counts(tokens: torch.Tensor, widths: torch.Tensor) -> torch.Tensor:
    """Merged tokens per line: rows x (width in patches // 2) (an odd last column is dropped)."""
    return tokens.shape[1] * (widths // 2)


def sequences(model: Reader, prompt: Prompt, tokens: torch.Tensor, widths: torch.Tensor, targets: list[list[int]],
              inputs: list[list[int]] | None = None):
    """Decoder inputs for a batch: embeds [B, T, dim], lengths [B], labels [B, T] (-100 = no loss).
    `inputs` (same lengths as targets) replaces the text the decoder is fed, not what it must say."""
    b = tokens.shape[0]
    m = image_token_counts(tokens, widths).tolist()
    fed = inputs if inputs is not None else targets
    seqs = [prompt.prefix + [prompt.image] * m[i] + prompt.suffix + fed[i] for i in range(b)]
    t = max(len(s) for s in seqs)
    ids = torch.zeros(b, t, dtype=torch.long)
    labels = torch.full((b, t), -100, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        start = len(prompt.prefix) + m[i] + len(prompt.suffix)  # first target token
        labels[i, start - 1: len(s) - 1] = torch.tensor(targets[i])
    embeds = model.decoder.embed_tokens(ids)  # [B, T, dim]
    image_rows = torch.cat([tokens[i, :, : widths[i] // 2].reshape(-1, tokens.shape[-1]) for i in range(b)])
    embeds = embeds.masked_scatter((ids == prompt.image)[..., None], image_rows.to(embeds.dtype))
    lengths = torch.tensor([len(s) for s in seqs])
    return embeds, lengths, labels


def ctc_loss(model: Reader, tokens: torch.Tensor, widths: torch.Tensor, ctc: list[list[int]]) -> torch.Tensor:
    logp = model.ctc_logits(tokens)  # [B, F, C]
    frames = (widths // 2) * model.c.ctc_frames
    targets = torch.tensor([c for seq in ctc for c in seq], dtype=torch.long)
    lengths = torch.tensor([len(seq) for seq in ctc])
    return F.ctc_loss(logp.transpose(0, 1), targets, frames, lengths, blank=CTC_BLANK, zero_infinity=True)


def ce_loss(model: Reader, prompt: Prompt, tokens, widths, ids: list[list[int]], corrupt: float = 0.0,
            rng: np.random.Generator | None = None) -> torch.Tensor:
    """Next-token cross-entropy on the text. `corrupt`: the share of fed text tokens replaced by
    random ones, so the decoder cannot read on from its own last words and must look at the image
    (a decoder this small otherwise settles for a language model that guesses)."""
    targets = [s + [prompt.stop] for s in ids]
    inputs = None
    if corrupt:
        n = model.c.vocab - 4  # the normal tokens (the chat control tokens are last)
        inputs = [[int(rng.integers(n)) if rng.random() < corrupt else t for t in s] for s in targets]
    embeds, lengths, labels = sequences(model, prompt, tokens, widths, targets, inputs)
    logits = model.decoder(embeds, lengths)
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=-100)


def ctc_read(model: Reader, tokens: torch.Tensor, widths: torch.Tensor) -> list[str]:
    """Greedy CTC: best class per frame, repeats merged, blanks dropped."""
    best = model.ctc_logits(tokens).argmax(-1)  # [B, F]
    out = []
    for i in range(best.shape[0]):
        seq = best[i, : int(widths[i] // 2) * model.c.ctc_frames].tolist()
        chars, prev = [], CTC_BLANK
        for c in seq:
            if c != prev and c != CTC_BLANK:
                chars.append(CHARS[c - 1])
            prev = c
        out.append("".join(chars))
    return out


@torch.no_grad()
def greedy_read(model: Reader, prompt: Prompt, tokens, widths, max_tokens: int = 96) -> list[list[int]]:
    """Greedy decoding of every line of the batch (full recompute per step: lines are short)."""
    b = tokens.shape[0]
    out: list[list[int]] = [[] for _ in range(b)]
    done = [False] * b
    budget = (4 * image_token_counts(tokens, widths) + 16).tolist()  # as the pipeline caps a line
    for _ in range(min(max_tokens, max(budget))):
        embeds, lengths, _ = sequences(model, prompt, tokens, widths, out)
        logits = model.decoder(embeds, lengths)  # [B, T, V]
        nxt = logits[torch.arange(b), lengths - 1].argmax(-1).tolist()
        for i, tok in enumerate(nxt):
            if done[i]:
                continue
            if tok == prompt.stop or len(out[i]) >= budget[i]:
                done[i] = True
            else:
                out[i].append(tok)
        if all(done):
            break
    return out
