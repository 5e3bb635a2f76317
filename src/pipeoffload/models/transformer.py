"""The reference decoder-only transformer, built as layer groups.

A *layer group* (``LayerGroup``) is the part of the model one pipeline chunk runs:
some consecutive transformer layers, plus the token embedding if it is the first
group, plus the final norm and output head if it is the last. Each rank builds only
its own groups (``build_stage``); ``build_reference`` builds the whole model as one
group with identical weights and identical parameter names, for checking.

Components (nanoGPT-sized, modern style): RMSNorm, rotary position embeddings,
grouped-query causal attention (``F.scaled_dot_product_attention``), SwiGLU MLP.
Linear layers have no bias. Nothing draws random numbers (no dropout; attention with
``dropout_p = 0``): every class is declared :func:`~pipeoffload.runtime.rng.never_draws`,
so the runner's keyed random streams put no hook on this model.

Recompute hints: the norms' outputs (and their ``x·rsqrt`` intermediate) and SwiGLU's
``silu(w1 x)`` and ``silu(w1 x)·w3 x`` are declared
:func:`~pipeoffload.runtime.activations.recomputable`: an activation store that
honours hints (``OffloadStore(recompute=True)``) recomputes them bit for bit in
backward instead of moving them to the host. The forward math is the same either way.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..runtime.activations import recompute_active, recomputable
from ..runtime.rng import never_draws
from .config import ModelConfig, layer_ranges

#: Seed offsets of the non-layer parts, far from any layer index.
_EMBED_SEED, _HEAD_SEED = 1_000_000, 1_000_001


@never_draws
class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        # Declared right after each op, before a consumer saves it; recomputed with the
        # same ops in backward, so the bits are identical.
        hint = recompute_active()
        r = _rms_inverse(hidden, self.eps)
        if hint:
            recomputable(r, _rms_inverse, hidden, self.eps)
        xr = hidden * r
        if hint:
            recomputable(xr, torch.mul, hidden, r)
        out = xr * self.weight
        if hint:
            recomputable(out, torch.mul, xr, self.weight)
        return out


def _rms_inverse(x: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def rotary_tables(cfg: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of shape (seq_len, head_dim/2) for rotary embeddings."""
    hd = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    ang = torch.outer(torch.arange(cfg.seq_len, dtype=torch.float32), inv)
    return ang.cos(), ang.sin()


def apply_rotary(qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (first half, second half) pairs of the queries or keys ``qk`` (b, heads, s, hd)."""
    s = qk.shape[-2]
    c, sn = cos[:s], sin[:s]
    x1, x2 = qk.chunk(2, dim=-1)
    return torch.cat((x1 * c - x2 * sn, x1 * sn + x2 * c), dim=-1)


@never_draws
class Attention(nn.Module):
    """Causal grouped-query attention: ``kv_heads`` key/value heads shared by groups of query heads."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        h, hd = cfg.hidden, cfg.head_dim
        self.heads, self.kv_heads, self.head_dim = cfg.heads, cfg.kv_heads, hd
        self.wq = nn.Linear(h, cfg.heads * hd, bias=False)
        self.wk = nn.Linear(h, cfg.kv_heads * hd, bias=False)
        self.wv = nn.Linear(h, cfg.kv_heads * hd, bias=False)
        self.wo = nn.Linear(cfg.heads * hd, h, bias=False)

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = hidden.shape
        # Head counts from the projections' widths, not the config: under tensor
        # parallelism (runtime/tensor_parallel.py) a rank holds heads/tp of them.
        q = self.wq(hidden).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.wk(hidden).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.wv(hidden).view(b, s, -1, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        rep = q.shape[1] // k.shape[1]
        if rep > 1:
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, s, q.shape[1] * self.head_dim))


@never_draws
class SwiGLU(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        h, f = cfg.hidden, cfg.ffn_dim
        self.w1 = nn.Linear(h, f, bias=False)
        self.w3 = nn.Linear(h, f, bias=False)
        self.w2 = nn.Linear(f, h, bias=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        hint = recompute_active()
        h1 = self.w1(hidden)
        a = F.silu(h1)
        if hint:
            recomputable(a, F.silu, h1)
        h3 = self.w3(hidden)
        gated = a * h3
        if hint:
            recomputable(gated, torch.mul, a, h3)
        return self.w2(gated)


@never_draws
class Block(nn.Module):
    """Pre-norm transformer layer: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.mlp = SwiGLU(cfg)

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        hidden = hidden + self.attn(self.attn_norm(hidden), cos, sin)
        return hidden + self.mlp(self.mlp_norm(hidden))


@never_draws
class LayerGroup(nn.Module):
    """Consecutive layers ``layer_ids`` (+ embedding if ``first``, + norm/head if ``last``).

    Input: token ids (b, s) for the first group, else hidden states (b, s, h).
    Output: logits (b, s, vocab) for the last group, else hidden states.
    Layers are kept in a ``ModuleDict`` keyed by their global index, so parameter
    names (``layers.5.attn.wq.weight``) are the same however the model is split.
    """

    def __init__(self, cfg: ModelConfig, layer_ids: range, first: bool, last: bool) -> None:
        super().__init__()
        self.cfg = cfg
        self.layer_ids = layer_ids
        self.first, self.last = first, last
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden) if first else None
        self.layers = nn.ModuleDict({str(i): Block(cfg) for i in layer_ids})
        self.norm = RMSNorm(cfg.hidden, cfg.norm_eps) if last else None
        self.head = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False) if last else None
        cos, sin = rotary_tables(cfg)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self._init_weights()

    @torch.no_grad()
    def _init_weights(self) -> None:
        cfg = self.cfg
        std, out_std = cfg.init_std, cfg.init_std / math.sqrt(2 * cfg.layers)

        def fill(t: torch.Tensor, sd: float, gen: torch.Generator) -> None:
            t.copy_(torch.randn(t.shape, generator=gen, dtype=torch.float32) * sd)

        if self.embed is not None:
            fill(self.embed.weight, std, _gen(cfg.seed, _EMBED_SEED))
        for i, block in self.layers.items():
            gen = _gen(cfg.seed, int(i))
            # Fixed traversal order (named_parameters is deterministic) → same draws per layer.
            for name, prm in block.named_parameters():
                if name.endswith("norm.weight"):
                    prm.fill_(1.0)
                else:
                    fill(prm, out_std if name.endswith(("wo.weight", "w2.weight")) else std, gen)
        if self.head is not None:
            self.norm.weight.fill_(1.0)
            fill(self.head.weight, std, _gen(cfg.seed, _HEAD_SEED))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """Token ids (first group) or hidden states in; hidden states or logits (last group) out."""
        hidden = self.embed(inputs) if self.embed is not None else inputs
        for block in self.layers.values():
            hidden = block(hidden, self.rope_cos, self.rope_sin)
        if self.head is not None:
            return self.head(self.norm(hidden))
        return hidden


def _gen(seed: int, index: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed * 1_000_003 + index)
    return g


def build_stage(cfg: ModelConfig, stage: int, num_stages: int) -> LayerGroup:
    """Layer group ``stage`` of a ``num_stages``-group split. Builds only its own layers."""
    cfg.check_split(num_stages)
    ranges = layer_ranges(cfg.layers, num_stages)
    return LayerGroup(cfg, ranges[stage], first=stage == 0, last=stage == num_stages - 1)


def build_stages(cfg: ModelConfig, stages: list[int] | tuple[int, ...], num_stages: int) -> dict[int, LayerGroup]:
    """The layer groups one rank holds, by global index."""
    return {s: build_stage(cfg, s, num_stages) for s in stages}


def build_reference(cfg: ModelConfig) -> LayerGroup:
    """The whole model as one layer group: same weights and names as any split."""
    return LayerGroup(cfg, range(cfg.layers), first=True, last=True)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy, mean over tokens."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
