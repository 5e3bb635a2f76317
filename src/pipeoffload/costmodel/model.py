"""Analytic transformer cost model: FLOPs, saved-activation bytes, parameter bytes, and the
simulator's inputs (``Costs``/``MemoryDeltas``) for a split into layer groups. Pure Python.

API
---
``ModelSpec(layers, hidden, heads, seq, vocab, ffn=None, kv_groups=None, microbatch=1, dtype="bf16",
activation="gelu", flash_attention=True, dropout=False, recompute_elementwise=False,
tie_embeddings=True, name="custom")``
    A decoder-only transformer (pre-norm). ``ffn`` defaults to 4·hidden, ``kv_groups`` to ``heads``
    (multi-head attention; fewer = grouped-query attention). ``dtype`` is ``"bf16"``, ``"fp16"`` or
    ``"fp32"`` (activations and weights). ``activation`` is ``"gelu"`` (2 FFN matrices, GPT-3) or
    ``"swiglu"`` (3 FFN matrices, Llama). ``recompute_elementwise``: norms, the FFN activation and dropout
    are recomputed in B instead of saved (PipeOffload's runtime). ``recompute`` (a
    :class:`~pipeoffload.recompute.Recompute`; names and bools accepted, "elementwise" = none with
    ``recompute_elementwise``; :attr:`ModelSpec.recompute_level` is the one level): "none", "selective"
    (the core attention's s×s tensors re-run in B; nothing to drop under flash attention) or "full"
    (only each layer's input is saved; B re-runs the forward, counted in ``BlockCost.recompute_flops``).
    ``fp32_logits`` (default true): the loss keeps the vocab-sized tensor in fp32. ``kernels``:
    ``"fused"`` (default; Megatron-LM's fused kernels) or ``"eager"`` (plain PyTorch ops, as the
    reference transformer: more saved tensors, see ``layer_saved_breakdown``). Methods:

    - ``layer()``, ``embedding()``, ``head()`` → :class:`BlockCost` for one microbatch;
    - ``layer_saved_breakdown()`` → ``{tensor: bytes}`` of one layer, one microbatch;
    - ``params()`` (unique parameters), ``boundary_bytes()`` (one stage-to-stage activation);
    - ``replace(**changes)``.

``BlockCost(f_flops, b_flops, w_flops, saved_bytes, w_bytes, params)``: one microbatch. ``saved_bytes`` is
what F leaves for B (what an offload moves); ``w_bytes`` what stays from B until W. Supports ``+`` and
``* int``.

``layer_split(layers, groups, trim_edges=False) -> tuple[int, ...]``: layers per layer group.

``pipeline_costs(model, hardware, p, v=1, split=None, trim_edges=False) -> PipelineCosts``
    ``p·v`` layer groups in forward order (group 0 carries the embedding, the last one the output head
    and loss). Result fields: ``costs`` (a :class:`~pipeoffload.costs.Costs` with ``group_costs``, **times
    in milliseconds**), ``memory`` (a :class:`~pipeoffload.costs.MemoryDeltas` with ``group_deltas``, **in
    bytes**), ``groups`` (per-group :class:`GroupCost`: layers, FLOPs, ms, bytes, offload time and ratio,
    parameter/gradient/optimizer bytes), ``comm_ms``, ``split``.

``state_bytes_per_param(dtype, dp=1, sharding="none") -> (param, grad, optimizer)`` bytes per device:
mixed-precision Adam, optionally sharded over ``dp`` replicas (``DP_SHARDING``: none, optimizer = ZeRO-1 /
Megatron's distributed optimizer, 6 + 12/d; full = ZeRO-3 / FSDP, 18/d).
``k_closed_form(hidden, seq, compute_rate, host_bw) -> float``: PipeOffload's ``10/(3(6h+s)) · B_c/B_o``.
``k_from_model(model, hardware) -> float``: ``(D2H + H2D) / (F + B + W)`` time of one layer's saved
activations, from this model's own bytes and op times (FLOPs at the shape's GEMM rate, elementwise passes).

Conventions (docs/cost-model.md explains them): FLOPs are *model* FLOPs of the matmuls (2 per
multiply-add), attention counted over the full ``s×s`` score matrix (ZB Table 1: F = bsh(24h+4s),
B = bsh(24h+8s), W = bsh·24h for a GPT-3 layer); elementwise ops, norms and recomputation are not
counted (the hardware's achieved rate absorbs them). A time is FLOPs / ``hardware.compute_rate``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence

from ..costs import Costs, MemoryDeltas
from ..errors import ParameterError
from ..recompute import Recompute
from .hardware import Hardware

DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp32": 4}
ACTIVATIONS = ("gelu", "swiglu")
#: How the layer's ops are implemented, which decides what F saves (``ModelSpec.kernels``).
KERNELS = ("fused", "eager")
#: Recompute of a layer in B (besides ``recompute_elementwise``): "none"; "selective" (Megatron's
#: selective recompute: the core attention's s×s tensors are recomputed, not saved); "full" (only the
#: layer's input is saved, the whole forward re-runs in B).
RECOMPUTE = ("none", "selective", "full")
#: bytes of one token id (int64) kept by the embedding for its weight gradient.
TOKEN_ID_BYTES = 8
#: flash attention keeps the softmax log-sum-exp, fp32, one per head per token.
LSE_BYTES = 4
#: ms: the shortest F, B or W (an embedding-only chunk of the L = v·p − 2 setting has no matmuls).
MIN_OP_MS = 1e-3


#: Data-parallel sharding of the training state: "none" (every replica holds everything),
#: "optimizer" (ZeRO-1, Megatron's distributed optimizer: optimizer state and fp32 master weights
#: split over the DP group), "full" (ZeRO-3 / FSDP: parameters and gradients split as well).
DP_SHARDING = ("none", "optimizer", "full")


def shard_factors(sharding: str, dp: int) -> tuple[float, float, float]:
    """Fractions of (parameter, gradient, optimizer) bytes one DP replica keeps under ``sharding``."""
    if sharding not in DP_SHARDING:
        raise ParameterError("dp_sharding", f"unknown sharding {sharding!r}; valid: {', '.join(DP_SHARDING)}")
    _positive_int("dp", dp)
    if sharding == "none":
        return (1.0, 1.0, 1.0)
    if sharding == "optimizer":
        return (1.0, 1.0, 1.0 / dp)
    return (1.0 / dp, 1.0 / dp, 1.0 / dp)


def state_bytes_per_param(dtype: str, dp: int = 1, sharding: str = "none") -> tuple[float, float, float]:
    """``(param, grad, optimizer)`` bytes per parameter on one device for mixed-precision Adam.

    16-bit training (Megatron's default): 16-bit weights (2), fp32 main-gradient buffer (4, Megatron
    accumulates and reduces gradients in fp32 for bf16), fp32 master weights + Adam m + Adam v (12)
    → 18 B/param unsharded. With the distributed optimizer (``sharding="optimizer"``, ZeRO-1 over
    ``dp`` replicas) the 12 are split: **6 + 12/d**, Megatron's own accounting for bf16 parameters
    with fp32 gradients. ``"full"`` (ZeRO-3/FSDP): 18/d. fp32 training: 4 + 4 + 8 (m, v).
    """
    if dtype not in DTYPE_BYTES:
        raise ParameterError("dtype", f"unknown dtype {dtype!r}; valid: {', '.join(DTYPE_BYTES)}")
    base = (4, 4, 8) if dtype == "fp32" else (2, 4, 12)
    if sharding == "none" and dp == 1:
        return base
    fp, fg, fo = shard_factors(sharding, dp)
    return (base[0] * fp, base[1] * fg, base[2] * fo)


@dataclass(frozen=True)
class BlockCost:
    """Costs of one block (a transformer layer, the embedding, the head + loss) for one microbatch."""

    f_flops: float = 0.0
    b_flops: float = 0.0  # input-gradient backward (attention backward belongs here)
    w_flops: float = 0.0  # weight-gradient backward
    saved_bytes: int = 0  # kept from F until B: what an offload moves
    w_bytes: int = 0  # kept from B until W: inputs of the linears + gradients of their outputs
    params: int = 0  # parameters stored with the block
    recompute_flops: float = 0.0  # forward work B repeats (selective/full recompute); not model FLOPs
    traffic_bytes: int = 0  # what the memory-bound ops (norms, softmax, dropout, activation) write in F

    def __add__(self, other: "BlockCost") -> "BlockCost":
        return BlockCost(*(a + b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other))))

    def __mul__(self, count: int) -> "BlockCost":
        return BlockCost(*(a * count for a in dataclasses.astuple(self)))

    __rmul__ = __mul__

    @property
    def flops(self) -> float:
        return self.f_flops + self.b_flops + self.w_flops


def _positive_int(name: str, x: Any) -> None:
    if not isinstance(x, int) or isinstance(x, bool) or x < 1:
        raise ParameterError(name, f"must be a positive integer, got {x!r}")


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer and its training microbatch (see the module docstring)."""

    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    ffn: int | None = None
    kv_groups: int | None = None
    microbatch: int = 1
    dtype: str = "bf16"
    activation: str = "gelu"
    flash_attention: bool = True
    dropout: bool = False
    recompute_elementwise: bool = False
    tie_embeddings: bool = True
    recompute: Recompute | str = Recompute.NONE
    fp32_logits: bool = True
    name: str = "custom"
    kernels: str = "fused"

    def __post_init__(self) -> None:
        for f in ("layers", "hidden", "heads", "seq", "vocab", "microbatch"):
            _positive_int(f, getattr(self, f))
        if self.ffn is None:
            object.__setattr__(self, "ffn", 4 * self.hidden)
        if self.kv_groups is None:
            object.__setattr__(self, "kv_groups", self.heads)
        _positive_int("ffn", self.ffn)
        _positive_int("kv_groups", self.kv_groups)
        if self.hidden % self.heads:
            raise ParameterError("heads", f"hidden size {self.hidden} is not divisible by {self.heads} heads")
        if self.heads % self.kv_groups:  # type: ignore[operator]
            raise ParameterError("kv_groups", f"{self.heads} heads are not divisible into {self.kv_groups} groups")
        if not isinstance(self.dtype, str) or self.dtype not in DTYPE_BYTES:
            raise ParameterError("dtype", f"unknown dtype {self.dtype!r}; valid: {', '.join(DTYPE_BYTES)}")
        if not isinstance(self.activation, str) or self.activation not in ACTIVATIONS:
            raise ParameterError("activation", f"unknown activation {self.activation!r}; valid: {', '.join(ACTIVATIONS)}")
        level = Recompute.of(self.recompute, "recompute")  # bools and names in any case accepted
        if level is Recompute.ELEMENTWISE:  # stored as its two knobs: nothing more than the elementwise ops
            object.__setattr__(self, "recompute_elementwise", True)
            level = Recompute.NONE
        object.__setattr__(self, "recompute", level)
        for f in ("flash_attention", "dropout", "recompute_elementwise", "tie_embeddings", "fp32_logits"):
            if not isinstance(getattr(self, f), bool):
                raise ParameterError(f, f"must be true or false, got {getattr(self, f)!r}")
        if not isinstance(self.name, str) or not self.name:
            raise ParameterError("name", f"must be a non-empty string, got {self.name!r}")
        if not isinstance(self.kernels, str) or self.kernels not in KERNELS:
            raise ParameterError("kernels", f"unknown kernels {self.kernels!r}; valid: {', '.join(KERNELS)}")

    # -- shapes ---------------------------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        """Width of K (and of V): kv_groups · head_dim."""
        return self.kv_groups * self.head_dim  # type: ignore[operator]

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def logits_bytes(self) -> int:
        """Bytes per saved logit: 4 with ``fp32_logits``, else the dtype's."""
        return 4 if self.fp32_logits else self.dtype_bytes

    @property
    def tokens(self) -> int:
        """Tokens in one microbatch: b·s."""
        return self.microbatch * self.seq

    @property
    def ffn_matrices(self) -> int:
        return 3 if self.activation == "swiglu" else 2

    @property
    def recompute_level(self) -> Recompute:
        """The one :class:`~pipeoffload.recompute.Recompute` these settings are: ``recompute``
        when selective or full, else elementwise or none as ``recompute_elementwise`` says."""
        if self.recompute is not Recompute.NONE:
            return Recompute(self.recompute)
        return Recompute.ELEMENTWISE if self.recompute_elementwise else Recompute.NONE

    def with_recompute(self, level: Recompute | str | bool) -> "ModelSpec":
        """A copy recomputing ``level`` (a :class:`~pipeoffload.recompute.Recompute`, a name or a
        bool): none, elementwise, selective (the elementwise ops and the core attention) or full
        (the whole layer). Raises ParameterError naming ``recompute`` for anything else."""
        level = Recompute.of(level, "recompute")
        if level is Recompute.FULL:
            return self.replace(recompute_elementwise=False, recompute=Recompute.FULL)
        if level is Recompute.SELECTIVE:
            return self.replace(recompute_elementwise=True, recompute=Recompute.SELECTIVE)
        return self.replace(recompute_elementwise=level is Recompute.ELEMENTWISE, recompute=Recompute.NONE)

    def replace(self, **changes: Any) -> "ModelSpec":
        """A copy with ``changes``. ``ffn``/``kv_groups`` were resolved at construction: changing
        ``hidden`` or ``heads`` keeps them unless they are given too."""
        return dataclasses.replace(self, **changes)

    # -- parameters -----------------------------------------------------------------------------
    def layer_matmul_params(self) -> int:
        """Weights of the layer's linears: QKV, attention output, FFN (biases ignored)."""
        h, f = self.hidden, self.ffn
        return h * (h + 2 * self.kv_dim) + h * h + self.ffn_matrices * h * f  # type: ignore[operator]

    def layer_params(self) -> int:
        """Linears + two norm weight vectors."""
        return self.layer_matmul_params() + 2 * self.hidden

    def params(self) -> int:
        """Unique parameters: layers, word embedding, final norm, and an untied output head."""
        emb = self.vocab * self.hidden
        return self.layers * self.layer_params() + emb + self.hidden + (0 if self.tie_embeddings else emb)

    # -- activations ----------------------------------------------------------------------------
    def layer_saved_breakdown(self) -> dict[str, int]:
        """Bytes F saves for B, per tensor, for one layer and one microbatch.

        Pre-norm layer: norm1 → QKV → attention → out-proj (+dropout) → residual → norm2 → fc1 →
        activation → fc2 (+dropout) → residual. With ``fp16``, no flash attention, dropout on and no
        recompute, GPT-3 shapes, the sum is exactly ZB's ``b·s·(34h + 5as)``.

        ``kernels="fused"`` (Megatron-LM's fused norm and SwiGLU, attention on un-expanded K/V whose
        output is the out-projection's input) saves the above. ``"eager"`` — the same ops in plain
        PyTorch, as the reference transformer (``models/transformer.py``) runs them — also keeps
        what autograd saves between them: each norm's ``x·rsqrt`` and ``rsqrt`` (``norm_scaled``,
        ``norm_rsqrt``, unless recomputed), K and V repeated to every query head (grouped-query
        attention), flash attention's own output before the heads are merged into the
        out-projection's input (``attn_core_output``) and SwiGLU's ``silu(gate)``
        (``silu_output``, unless recomputed). Measured: the sum equals the bytes autograd keeps
        for a reference ``Block`` (tests/test_cost_model.py) and, on an H200 in bf16, the
        reference model's activation peak within a few percent (docs/gpu.md).
        """
        d, h, a, s, f, T = self.dtype_bytes, self.hidden, self.heads, self.seq, self.ffn, self.tokens
        rc, drop = self.recompute_elementwise, self.dropout
        if self.recompute == "full":  # only the layer's input; B re-runs the forward
            return {"layer_input": d * h * T}
        eager = self.kernels == "eager"
        per_token: dict[str, int] = {
            "norm1_input": d * h,
            "qkv_input": 0 if rc else d * h,  # norm1 output
            "q": d * h,
            "k_v": 2 * d * (h if eager else self.kv_dim),  # eager: repeated to every query head
        }
        if eager and not rc:  # each norm's x·rsqrt and rsqrt, for the weight's and the input's gradient
            per_token["norm_scaled"] = 2 * d * h
            per_token["norm_rsqrt"] = 2 * d
        if self.flash_attention:
            per_token["softmax_lse"] = LSE_BYTES * a
            if eager:  # flash's output (b, heads, s, d) before the head merge copies it
                per_token["attn_core_output"] = d * h
        elif self.recompute == "selective":  # the core attention re-runs in B from q, k, v
            pass
        else:
            per_token["softmax_output"] = d * a * s
            if drop and not rc:
                per_token["attn_dropout_mask"] = a * s
                per_token["attn_dropout_output"] = d * a * s
        per_token["attn_output"] = d * h  # out-proj input
        if drop and not rc:
            per_token["attn_out_dropout_mask"] = h
        per_token["norm2_input"] = d * h
        per_token["fc1_input"] = 0 if rc else d * h  # norm2 output
        if self.activation == "swiglu":
            per_token["gate_up"] = 2 * d * f  # type: ignore[operator]
            if eager and not rc:
                per_token["silu_output"] = d * f  # type: ignore[operator]
        else:
            per_token["fc1_output"] = d * f  # type: ignore[operator]
        per_token["fc2_input"] = 0 if rc else d * f  # type: ignore[operator]  # activation output
        if drop and not rc:
            per_token["mlp_dropout_mask"] = h
        return {k: v * T for k, v in per_token.items() if v}

    def layer_w_bytes(self) -> int:
        """Bytes held from B until W: every linear's input and its output gradient (ZB's 32h)."""
        d, h, f, T = self.dtype_bytes, self.hidden, self.ffn, self.tokens
        inputs = 3 * h + f  # type: ignore[operator]  # qkv, out-proj, fc1, fc2 inputs
        out_grads = (h + 2 * self.kv_dim) + h + (self.ffn_matrices - 1) * f + h  # type: ignore[operator]
        return d * T * (inputs + out_grads)

    def layer_replicated_bytes(self) -> tuple[int, int]:
        """(saved, B→W) bytes of one layer, one microbatch, that lie *outside* Megatron's
        tensor-parallel region: the norms' inputs and outputs, the dropout masks of the residual
        branch (saved), and the QKV/FC1 inputs and the out-projection/FC2 output gradients (B→W).
        Without sequence parallelism every TP rank keeps them whole; with it they are split too."""
        d, h, T = self.dtype_bytes, self.hidden, self.tokens
        bd = self.layer_saved_breakdown()
        saved = sum(bd.get(k, 0) for k in ("layer_input", "norm1_input", "qkv_input", "norm2_input", "fc1_input",
                                           "norm_scaled", "norm_rsqrt", "attn_out_dropout_mask", "mlp_dropout_mask"))
        return saved, 4 * d * h * T

    def boundary_bytes(self) -> int:
        """One activation crossing a stage boundary: b·s·h·dtype bytes (also its gradient)."""
        return self.tokens * self.hidden * self.dtype_bytes

    # -- blocks ---------------------------------------------------------------------------------
    def layer(self) -> BlockCost:
        """One transformer layer, one microbatch."""
        T, b, s, h = self.tokens, self.microbatch, self.seq, self.hidden
        mm = 2 * T * self.layer_matmul_params()
        attn = 4 * b * s * s * h  # QK^T and A·V over the full s×s scores (ZB's convention)
        again = {"none": 0, "full": mm + attn, "selective": 0 if self.flash_attention else attn}[self.recompute]
        # The elementwise ops run whatever is recomputed: their traffic is the layer's bytes as saved
        # without any recompute (flash attention fuses the s×s ones away).
        # The fused description in both settings: the profiles' elementwise passes were fitted to it.
        plain = self if self.recompute == "none" and not self.recompute_elementwise and self.kernels == "fused" \
            else self.replace(recompute="none", recompute_elementwise=False, kernels="fused")
        return BlockCost(
            f_flops=mm + attn,
            b_flops=mm + 2 * attn,  # dQ, dK, dA, dV
            w_flops=mm,
            saved_bytes=sum(self.layer_saved_breakdown().values()),
            w_bytes=self.layer_w_bytes(),
            params=self.layer_params(),
            recompute_flops=again,
            traffic_bytes=sum(plain.layer_saved_breakdown().values()),
        )

    def embedding(self) -> BlockCost:
        """Word embedding (a lookup: no matmul FLOPs). Keeps the token ids; W scatters the output grad."""
        T = self.tokens
        return BlockCost(
            saved_bytes=TOKEN_ID_BYTES * T,
            w_bytes=TOKEN_ID_BYTES * T + self.dtype_bytes * T * self.hidden,
            params=self.vocab * self.hidden,
            traffic_bytes=self.dtype_bytes * T * self.hidden,
        )

    def head(self) -> BlockCost:
        """Final norm + output head + cross-entropy loss.

        Saves the final-norm input, the head input (unless recomputed) and one vocab-sized tensor per
        token (the softmax, turned into the logits' gradient in place, as fused cross-entropy does),
        in fp32 with ``fp32_logits`` (Megatron's cross-entropy casts the logits to fp32).
        The last group always stores the head matrix (a copy when tied to the embedding).
        """
        T, h, V, d = self.tokens, self.hidden, self.vocab, self.dtype_bytes
        mm = 2 * T * h * V
        # eager: the final norm's x·rsqrt and rsqrt too (layer_saved_breakdown)
        norm = d * T * (h + 1) if self.kernels == "eager" and not self.recompute_elementwise else 0
        return BlockCost(
            f_flops=mm,
            b_flops=mm,
            w_flops=mm,
            saved_bytes=d * T * (h + (0 if self.recompute_elementwise else h)) + self.logits_bytes * T * V + norm,
            w_bytes=d * T * (h + V),
            params=h + V * h,
            traffic_bytes=2 * d * T * h,  # the fused cross-entropy's one pass over the logits: not counted
        )

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "layers": self.layers,
            "hidden": self.hidden,
            "ffn": self.ffn,
            "heads": self.heads,
            "kv_groups": self.kv_groups,
            "seq": self.seq,
            "microbatch": self.microbatch,
            "vocab": self.vocab,
            "dtype": self.dtype,
            "activation": self.activation,
            "flash_attention": self.flash_attention,
            "dropout": self.dropout,
            "recompute_elementwise": self.recompute_elementwise,
            "tie_embeddings": self.tie_embeddings,
            "recompute": self.recompute.value,  # type: ignore[union-attr]
            "fp32_logits": self.fp32_logits,
            "kernels": self.kernels,
            "params": self.params(),
            "layer_saved_bytes": self.layer().saved_bytes,
        }


# ---------------------------------------------------------------------------------------------
# Layer groups and the simulator's inputs


def _spread(total: int, n: int) -> list[int]:
    """``total`` over ``n`` bins as evenly as possible; extras go to the middle bins first
    (the edges already carry the embedding and the head)."""
    base, extra = divmod(total, n)
    counts = [base] * n
    order = list(range(1, n - 1)) + [0, n - 1] if n > 2 else list(range(n))
    for i in order[:extra]:
        counts[i] += 1
    return counts


def layer_split(layers: int, groups: int, trim_edges: bool = False) -> tuple[int, ...]:
    """Layers per layer group, in forward order, summing to ``layers``.

    ``trim_edges``: PipeOffload's balancing — split ``layers + 2`` evenly, then remove one layer from
    the first group (embedding) and from the last group (head + loss). Every group keeps ≥ 1 layer,
    except that with ``trim_edges`` the first and last may keep 0 (the authors' ``L = v·p − 2``
    setting: one layer per chunk, the edge chunks holding only the embedding and the head).
    """
    _positive_int("layers", layers)
    _positive_int("groups", groups)
    if groups > layers + (2 if trim_edges and groups > 2 else 0):
        raise ParameterError("p/v", f"{groups} layer groups (p·v) exceed the model's {layers} layers")
    if trim_edges and groups > 1:
        counts = _spread(layers + 2, groups)
        counts[0] -= 1
        counts[-1] -= 1
        if min(counts[1:-1] or [1]) < 1 or min(counts) < 0 or (groups == 2 and min(counts) < 1):
            raise ParameterError(
                "trim_edges", f"removing a layer from the first and last of {groups} groups of a "
                f"{layers}-layer model leaves a group empty: {counts}",
            )
        return tuple(counts)
    return tuple(_spread(layers, groups))


@dataclass(frozen=True)
class GroupCost:
    """One layer group (chunk) for one microbatch: blocks, times (ms), bytes, offload, state."""

    index: int
    layers: int
    has_embedding: bool
    has_head: bool
    block: BlockCost
    F_ms: float
    B_ms: float
    W_ms: float
    offload_ms: float  # one-way transfer of the saved activations (bytes / host bandwidth)
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int

    @property
    def saved_bytes(self) -> int:
        return self.block.saved_bytes

    @property
    def offload_ratio(self) -> float:
        """One-way transfer / (F+B+W) of this group: the reference code's ``offload_time``."""
        return self.offload_ms / (self.F_ms + self.B_ms + self.W_ms)

    @property
    def deltas(self) -> tuple[float, float, float]:
        """Memory change (bytes) of F, B, W: +saved, w_bytes − saved, −w_bytes (sums to 0)."""
        b = self.block
        return (float(b.saved_bytes), float(b.w_bytes - b.saved_bytes), float(-b.w_bytes))

    @property
    def state_bytes(self) -> int:
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            "group": self.index, "layers": self.layers, "embedding": self.has_embedding, "head": self.has_head,
            "F": self.F_ms, "B": self.B_ms, "W": self.W_ms,
            "f_flops": self.block.f_flops, "b_flops": self.block.b_flops, "w_flops": self.block.w_flops,
            "saved_bytes": self.block.saved_bytes, "w_bytes": self.block.w_bytes,
            "offload_ms": self.offload_ms, "offload_ratio": self.offload_ratio,
            "params": self.block.params, "param_bytes": self.param_bytes, "grad_bytes": self.grad_bytes,
            "optimizer_bytes": self.optimizer_bytes,
        }


@dataclass(frozen=True)
class PipelineCosts:
    """The simulator's inputs for one model split into ``p·v`` layer groups on one hardware.

    ``costs``: times in **ms**; ``group_costs[g]`` is group g's (F, B, W); ``F/B/W`` are a rank's
    mean (v groups). ``memory``: **bytes**; ``group_deltas[g]`` per group; ``F/B/W`` a rank's mean.
    """

    model: ModelSpec
    hardware: Hardware
    p: int
    v: int
    split: tuple[int, ...]
    groups: tuple[GroupCost, ...]
    comm_ms: float
    costs: Costs
    memory: MemoryDeltas
    time_unit: str = "ms"
    memory_unit: str = "bytes"

    @property
    def offload_ratio(self) -> float:
        """The largest per-group one-way offload ratio (the binding one for a shared transfer slot)."""
        return max(g.offload_ratio for g in self.groups)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; ``layer_groups`` is also accepted by ``--rank-costs``."""
        return {
            "model": self.model.name, "hardware": self.hardware.name, "p": self.p, "v": self.v,
            "time_unit": self.time_unit, "memory_unit": self.memory_unit, "split": list(self.split),
            "comm": self.comm_ms, "boundary_bytes": self.model.boundary_bytes(),
            "layer_groups": [g.to_dict() for g in self.groups],
        }


def pipeline_costs(
    model: ModelSpec,
    hardware: Hardware,
    p: int,
    v: int = 1,
    split: Sequence[int] | None = None,
    trim_edges: bool = False,
) -> PipelineCosts:
    """Per-layer-group costs of ``model`` on ``hardware`` split into ``p·v`` groups (see PipelineCosts).

    ``split`` gives the layers per group explicitly (length p·v, each ≥ 1, summing to the model's
    layers); otherwise :func:`layer_split` with ``trim_edges``. Comm latency per hop is
    ``boundary_bytes / link_bw + link_latency``. Guarantees: each group's memory deltas sum to 0; each
    group's F, B, W times are > 0.
    """
    _positive_int("p", p)
    _positive_int("v", v)
    counts = _check_split(model, p * v, split) if split is not None else layer_split(model.layers, p * v, trim_edges)
    blocks = (model.layer(), model.embedding(), model.head())
    groups = tuple(_group_cost(model, hardware, blocks, index, layers, len(counts))
                   for index, layers in enumerate(counts))
    comm_ms = (model.boundary_bytes() / hardware.link_bw + hardware.link_latency) * 1e3
    costs, memory = _simulator_inputs(groups, v, comm_ms)
    return PipelineCosts(model, hardware, p, v, counts, groups, comm_ms, costs, memory)


def _check_split(model: ModelSpec, num_groups: int, split: Sequence[int]) -> tuple[int, ...]:
    counts = tuple(split)
    if len(counts) != num_groups:
        raise ParameterError("split", f"gives {len(counts)} layer groups but p·v = {num_groups}")
    inner = counts[1:-1] if len(counts) > 2 else counts
    if any(not isinstance(c, int) or isinstance(c, bool) or c < 0 for c in counts) or any(c < 1 for c in inner):
        raise ParameterError("split", f"every group needs a positive integer number of layers (the first and "
                                      f"last may hold 0 when p·v > 2), got {list(counts)}")
    if sum(counts) != model.layers:
        raise ParameterError("split", f"sums to {sum(counts)} layers but the model has {model.layers}")
    return counts


def _group_cost(model: ModelSpec, hardware: Hardware, blocks: tuple[BlockCost, BlockCost, BlockCost],
                index: int, layers: int, num_groups: int) -> GroupCost:
    """Layer group ``index`` of ``num_groups``: ``layers`` transformer layers, the embedding on
    the first group, the head and loss on the last (``blocks``: a layer, the embedding, the head)."""
    rate_ms = hardware.compute_rate / 1e3 * gemm_shape_efficiency(model, hardware)  # FLOP per ms
    param_b, grad_b, optim_b = state_bytes_per_param(model.dtype)
    layer, embedding, head = blocks
    blk = layer * layers
    if index == 0:
        blk = blk + embedding
    if index == num_groups - 1:
        blk = blk + head
    # An embedding-only edge chunk has no matmul FLOPs; its lookup and scatter still take time:
    # floor each pass at MIN_OP_MS so every op has a positive duration.
    # Memory-bound elementwise work (docs/cost-model.md §2): F and B touch what F writes a few times
    # over; W is GEMMs only. A full recompute re-runs the forward's share in B.
    ew_f, ew_b = (elementwise_ms(blk.traffic_bytes, hardware, hardware.elementwise_f),
                  elementwise_ms(blk.traffic_bytes, hardware, hardware.elementwise_b))
    if model.recompute == "full":
        ew_b += ew_f
    return GroupCost(
        index=index, layers=layers, has_embedding=index == 0, has_head=index == num_groups - 1, block=blk,
        F_ms=_op_ms(blk.f_flops, rate_ms, layers) + ew_f,
        B_ms=_op_ms(blk.b_flops + blk.recompute_flops, rate_ms, layers) + ew_b,
        W_ms=_op_ms(blk.w_flops, rate_ms, layers),
        offload_ms=blk.saved_bytes / hardware.host_bw * 1e3,
        param_bytes=param_b * blk.params, grad_bytes=grad_b * blk.params, optimizer_bytes=optim_b * blk.params,
    )


def gemm_shape_efficiency(model: ModelSpec, hardware: Hardware) -> float:
    """Fraction of ``hardware.compute_rate`` (a large GEMM's rate) the layer's GEMMs reach: with
    ``shape_efficiency``, ``w / (w + gemm_half_width)`` at their smallest dimension ``w`` = min(tokens
    of a microbatch, hidden) — a thin GEMM fills fewer tiles per wave of the SMs; 1 otherwise (the
    rate is then already an achieved one for the profile's typical shapes)."""
    if not hardware.shape_efficiency or hardware.gemm_half_width <= 0:
        return 1.0
    w = min(model.tokens, model.hidden)
    return w / (w + hardware.gemm_half_width)


def elementwise_ms(traffic_bytes: float, hardware: Hardware, passes: float) -> float:
    """ms of memory-bound work moving ``passes`` × ``traffic_bytes`` at the HBM bandwidth (0 when
    the profile has no such term)."""
    if passes <= 0 or not traffic_bytes:
        return 0.0
    assert hardware.hbm_bw is not None  # Hardware checks it when passes > 0
    return passes * traffic_bytes / hardware.hbm_bw * 1e3


def _op_ms(flops: float, rate_ms: float, layers: int) -> float:
    """ms of one pass; a group without layers (embedding or head alone) gets at least MIN_OP_MS."""
    t = flops / rate_ms
    return max(t, MIN_OP_MS) if layers == 0 else t


def _simulator_inputs(groups: Sequence[GroupCost], v: int, comm_ms: float) -> tuple[Costs, MemoryDeltas]:
    """``Costs`` (ms) and ``MemoryDeltas`` (bytes) with per-group values; the uniform fields are a
    rank's mean (``v`` groups)."""
    n = len(groups)
    mean = [v * sum(x) / n for x in zip(*((g.F_ms, g.B_ms, g.W_ms) for g in groups))]
    costs = Costs(F=mean[0], B=mean[1], W=mean[2], comm=comm_ms,
                  group_costs=tuple((g.F_ms, g.B_ms, g.W_ms) for g in groups))
    dmean = [v * sum(x) / n for x in zip(*(g.deltas for g in groups))]
    dmean[2] = -(dmean[0] + dmean[1])  # exact zero sum despite rounding
    memory = MemoryDeltas(F=dmean[0], B=dmean[1], W=dmean[2], group_deltas=tuple(g.deltas for g in groups))
    return costs, memory


def state_bytes_per_rank(pc: PipelineCosts, placement: Any) -> list[int]:
    """Parameter + gradient + optimizer bytes of each rank for a :class:`~pipeoffload.ir.Placement`."""
    if placement.num_stages != len(pc.groups):
        raise ParameterError("placement", f"has {placement.num_stages} layer groups, the costs {len(pc.groups)}")
    out = [0] * placement.num_ranks
    for g in pc.groups:
        out[placement.rank_of(g.index)] += g.state_bytes
    return out


# ---------------------------------------------------------------------------------------------
# The offload ratio k (docs/algorithms.md#51-the-offload-ratio-k)


def k_closed_form(hidden: int, seq: int, compute_rate: float, host_bw: float) -> float:
    """PipeOffload's ``k = 10 / (3(6h + s)) · B_c / B_o`` with ``h`` = ``hidden``, ``s`` = ``seq``
    (``B_c`` = ``compute_rate`` FLOP/s, ``B_o`` = ``host_bw`` bytes/s).

    It is ``2 · 20h / (72h² + 12hs) · B_c/B_o``: 20h bytes per token and layer (16-bit, flash attention,
    no dropout, norms and GELU recomputed, multi-head attention, FFN 4h) moved twice, over the per-token
    F + B + W FLOPs of a GPT-3 layer.
    """
    for name, x in (("hidden", hidden), ("seq", seq), ("compute_rate", compute_rate), ("host_bw", host_bw)):
        if not x > 0:
            raise ParameterError(name, f"must be positive, got {x!r}")
    return 10.0 / (3.0 * (6 * hidden + seq)) * compute_rate / host_bw


def k_from_model(model: ModelSpec, hardware: Hardware) -> float:
    """``(D2H + H2D) / (F + B + W)`` time of one layer's saved activations (one microbatch; independent
    of the microbatch size and of the number of layers)."""
    lay = model.layer()
    transfer = 2 * lay.saved_bytes / hardware.host_bw
    # The layer's F + B + W as the cost model times them: GEMMs at the shape's rate, the
    # memory-bound elementwise passes (a full recompute repeats the forward's).
    gemm = (lay.flops + lay.recompute_flops) / (hardware.compute_rate * gemm_shape_efficiency(model, hardware))
    passes = hardware.elementwise_f * (2 if model.recompute == "full" else 1) + hardware.elementwise_b
    return transfer / (gemm + elementwise_ms(lay.traffic_bytes, hardware, passes) / 1e3)
