"""Chat prompts without a jinja engine: ChatML rendered from facts read off the file's template."""

from __future__ import annotations

import re

from ...errors import ModelError

_JINJA_STRING = r"""(?:'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")"""


def _jinja_literals(template: str) -> list[str]:
    """All string literals of a jinja template, unescaped (\\n -> newline, \\' -> ')."""
    escapes = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "'": "'", '"': '"'}
    return [re.sub(r"\\(.)", lambda m: escapes.get(m.group(1), m.group(0)), lit[1:-1])
            for lit in re.findall(_JINJA_STRING, template, flags=re.S)]


def render_chatml(template: str | None, path: str, messages: list[dict], add_generation_prompt: bool) -> str:
    """ChatML without a jinja engine, reading three facts off the file's template (`path` names
    the file in errors):

    - a complete literal "<|im_start|>system...<|im_end|>\\n" is the system turn the template emits
      when the first message is not a system message (Qwen2/2.5, SmolLM2, LightOnOCR's empty one);
    - an image part of a message renders as the literal holding "<|image_pad|>" (once; the caller
      expands it to one token per image embedding);
    - `c['text'] + '...'` gives the suffix of a text part (LightOnOCR adds "\\n").
    """
    if template is None:
        raise ModelError(path, "no tokenizer.chat_template in the file; cannot build a chat prompt")
    if "<|im_start|>" not in template:
        raise ModelError(path, f"chat template is not ChatML (no <|im_start|>): {template[:80]!r}...; "
                                   "only ChatML templates are supported")
    literals = _jinja_literals(template)
    default_system = next((s for s in literals if s.startswith("<|im_start|>system")
                           and s.endswith("<|im_end|>\n")), None)
    image = next((s for s in literals if "<|image_pad|>" in s), None)
    suffix = re.search(r"""\[\s*['"]text['"]\s*\]\s*\+\s*(""" + _JINJA_STRING + ")", template)
    text_suffix = _jinja_literals(suffix.group(1))[0] if suffix else ""

    out = []
    if messages and messages[0].get("role") != "system" and default_system is not None:
        out.append(default_system)
    for i, msg in enumerate(messages):
        role, content = msg.get("role"), msg.get("content", "")
        if not isinstance(role, str):
            raise ValueError(f"message {i} has no 'role'")
        if isinstance(content, str):
            body = content
        else:
            body = ""
            for part in content:
                if part.get("type") == "image" or "image" in part or "image_url" in part:
                    if image is None:
                        raise ModelError(path, "the chat template has no image placeholder")
                    body += image
                elif "text" in part:
                    body += part["text"] + text_suffix
        out.append(f"<|im_start|>{role}\n{body}<|im_end|>\n")
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
    return "".join(out)
