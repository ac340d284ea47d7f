"""Shared kernels: norms, rotary embeddings, activations. All float32 in, float32 out."""

from __future__ import annotations

import math

import numpy as np

def rmsnorm(x: np.ndarray, weight: np.ndarray | None, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * weight over the last axis."""
    ms = np.mean(np.square(x, dtype=np.float32), axis=-1, keepdims=True)
    y = x * (1.0 / np.sqrt(ms + np.float32(eps)))
    return y * weight if weight is not None else y


def add_bias(y: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    """y + b for the optional biases a GGUF may carry (most projections have none)."""
    return y + b if b is not None else y


def silu(x: np.ndarray) -> np.ndarray:
    # exp of a large negative overflows to inf, giving x/inf = -0: the right limit, no NaN.
    with np.errstate(over="ignore"):
        return x / (1.0 + np.exp(-x))


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    return silu(gate) * up


def gelu_erf(x: np.ndarray) -> np.ndarray:
    """Exact (erf) GELU, 0.5 x (1 + erf(x / sqrt 2)), as the HF LightOnOCR projector uses."""
    return (0.5 * x * (1.0 + erf(x / np.float32(math.sqrt(2.0))))).astype(np.float32)


def erf(x: np.ndarray) -> np.ndarray:
    """erf to 1.2e-7 (Numerical Recipes' erfc Chebyshev fit in float64); numpy has no erf."""
    x64 = np.asarray(x, dtype=np.float64)
    z = np.abs(x64)
    t = 1.0 / (1.0 + 0.5 * z)
    poly = -z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (
        -0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))))
    erfc = t * np.exp(poly)
    return np.where(x64 >= 0, 1.0 - erfc, erfc - 1.0)


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


# -- rotary position embeddings --------------------------------------------------------------

def rope_freqs(n_rot: int, base: float, factors: np.ndarray | None = None) -> np.ndarray:
    """theta_i = base^(-2i/n_rot), i < n_rot/2, divided by optional per-frequency factors."""
    f = base ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
    return f / factors if factors is not None else f


def rope_angles(positions: np.ndarray, freqs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [T, n_rot/2] for 1-D positions (computed in float64, returned float32)."""
    ang = np.asarray(positions, dtype=np.float64)[:, None] * freqs[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, neox: bool) -> np.ndarray:
    """Rotate the first 2*cos.shape[-1] dims of x [T, H, D] by per-position angles [T, R].

    neox: pairs (i, i + R) (split halves, HF rotate_half); else adjacent pairs (2i, 2i+1), which
    is what llama.cpp's converter leaves for llama-arch and vision Q/K (rows permuted). The same
    code rotates torch tensors (the torch decode step), which copy by clone().
    """
    r = cos.shape[-1]
    c, s = cos[:, None, :], sin[:, None, :]  # [T, 1, R]
    out = x.copy() if isinstance(x, np.ndarray) else x.clone()
    if neox:
        x0, x1 = x[..., :r], x[..., r : 2 * r]
        out[..., :r] = x0 * c - x1 * s
        out[..., r : 2 * r] = x0 * s + x1 * c
    else:
        x0, x1 = x[..., 0 : 2 * r : 2], x[..., 1 : 2 * r : 2]
        out[..., 0 : 2 * r : 2] = x0 * c - x1 * s
        out[..., 1 : 2 * r : 2] = x0 * s + x1 * c
    return out


def rope_angles_2d(rows: np.ndarray, cols: np.ndarray, head_dim: int, base: float) -> tuple[np.ndarray, np.ndarray]:
    """Pixtral's axial 2-D RoPE: cos, sin [N, head_dim/2] for patches at (rows, cols).

    With f_m = base^(-2m/head_dim), m < head_dim/2, the angle vector is
    [row * f_0, row * f_2, ... (head_dim/4) | col * f_1, col * f_3, ... (head_dim/4)].
    Use with apply_rope(neox=False) on llama.cpp's permuted vision Q/K (adjacent pairs), or neox=True
    on Hugging Face's unpermuted weights. Computed in float32 exactly as transformers does.
    """
    if head_dim % 4:
        raise ValueError(f"2-D RoPE needs head_dim divisible by 4, got {head_dim}")
    f = np.float32(1.0) / (np.float32(base) ** (np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)))
    ang = np.concatenate([
        np.asarray(rows, np.float32)[:, None] * f[None, 0::2],  # [N, d/4] row angles
        np.asarray(cols, np.float32)[:, None] * f[None, 1::2],  # [N, d/4] column angles
    ], axis=1)  # [N, d/2]
    return np.cos(ang), np.sin(ang)


# -- bfloat16 as bits in numpy (numpy has no bfloat16): the KV pool's "bfloat16" storage -------

def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), rounded to nearest even as torch rounds."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)


def from_bf16_bits(b: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) -> float32, exactly."""
    return (np.asarray(b).astype(np.uint32) << np.uint32(16)).view(np.float32)
