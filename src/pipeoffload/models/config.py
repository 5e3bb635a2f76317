"""ModelConfig: the reference transformer's shape. Pure Python (no torch), so the
CLI can parse and check a configuration without importing torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import require

if TYPE_CHECKING:
    from ..costmodel.model import ModelSpec


@dataclass
class ModelConfig:
    """A decoder-only transformer in the modern style (RMSNorm, rotary embeddings,
    grouped-query attention, SwiGLU MLP). Byte-level by default (``vocab_size`` 256).
    It is the ``[model]`` section of ``pipeoffload train``'s configuration, so errors
    name the configuration key (``model.heads``).

    ``seed`` fixes the initial weights; each layer draws from its own generator
    (seeded by ``seed`` and the layer index), so the weights do not depend on how
    the layers are split into layer groups.

    One model, two descriptions: this is the runnable reference model's (the training
    configuration's keys); the cost model's is :class:`~pipeoffload.costmodel.model.ModelSpec`.
    :meth:`spec` derives the one from the other and :meth:`from_spec` goes back, so code that
    needs both builds one and derives the other (names: ``kv_heads`` = ModelSpec's
    ``kv_groups``, ``seq_len`` = ``seq``, ``vocab_size`` = ``vocab``, ``ffn_dim`` = ``ffn``).
    """

    layers: int = 8
    hidden: int = 128
    heads: int = 4
    kv_heads: int = 2
    ffn: int | None = None  #: SwiGLU width; default ≈ 8/3·hidden rounded up to 16
    vocab_size: int = 256
    seq_len: int = 128
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    init_std: float = 0.02
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "kv_heads", "vocab_size", "seq_len"):
            val = getattr(self, name)
            require(isinstance(val, int) and not isinstance(val, bool) and val >= 1,
                    f"model.{name}", f"must be an integer >= 1, got {val!r}")
        require(self.hidden % self.heads == 0, "model.heads",
                f"hidden size {self.hidden} must be divisible by heads {self.heads}")
        require((self.hidden // self.heads) % 2 == 0, "model.heads",
                f"head dimension {self.hidden // self.heads} must be even for rotary embeddings")
        require(self.heads % self.kv_heads == 0, "model.kv_heads",
                f"heads {self.heads} must be a multiple of kv_heads {self.kv_heads} (grouped-query attention)")
        if self.ffn is not None:
            require(isinstance(self.ffn, int) and self.ffn >= 1, "model.ffn", f"must be an integer >= 1, got {self.ffn!r}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def ffn_dim(self) -> int:
        if self.ffn is not None:
            return self.ffn
        return -(-(8 * self.hidden // 3) // 16) * 16

    def check_split(self, num_stages: int) -> None:
        """Every layer group needs at least one transformer layer."""
        require(self.layers >= num_stages, "model.layers",
                f"{self.layers} layers cannot fill {num_stages} layer groups (p·v); "
                f"use at least {num_stages} layers or fewer stages/chunks")

    def spec(self, microbatch: int = 1, dtype: str = "fp32", **settings: Any) -> "ModelSpec":
        """This model as the cost model describes it: shapes as here, SwiGLU, untied head, no
        dropout, plain PyTorch ops (``kernels="eager"``: what autograd saves between them); ``microbatch`` sequences per microbatch, ``dtype`` of activations and weights
        (the runtime trains in fp32), other :class:`~pipeoffload.costmodel.model.ModelSpec`
        fields (``flash_attention``, ``recompute``, ...) from ``settings``.

        Guarantees: ``ModelConfig.from_spec(cfg.spec()) == cfg`` for the shape fields (the
        runtime-only ones, ``rope_theta``, ``norm_eps``, ``init_std`` and ``seed``, are not in a
        ModelSpec and come back as their defaults), and ``spec().params() == num_parameters()``.
        """
        from ..costmodel.model import ModelSpec

        return ModelSpec(layers=self.layers, hidden=self.hidden, heads=self.heads, seq=self.seq_len,
                         vocab=self.vocab_size, ffn=self.ffn_dim, kv_groups=self.kv_heads, microbatch=microbatch,
                         dtype=dtype, **{"activation": "swiglu", "tie_embeddings": False, "dropout": False,
                                         "name": "reference", "kernels": "eager", **settings})

    @classmethod
    def from_spec(cls, spec: "ModelSpec", **runtime: Any) -> "ModelConfig":
        """The reference model of the cost model's ``spec``: its shapes (the runtime-only fields
        from ``runtime``, default otherwise). The reference MLP is SwiGLU whatever
        ``spec.activation`` says, with ``spec.ffn`` as its width (a GELU model's FFN becomes a
        SwiGLU one of the same width, as ``pipeoffload plan --emit-config`` has always written
        it). Raises ParameterError naming ``model.*`` when the reference model cannot take the
        shape (e.g. an odd head dimension)."""
        return cls(layers=spec.layers, hidden=spec.hidden, heads=spec.heads, kv_heads=spec.kv_groups or spec.heads,
                   ffn=spec.ffn, vocab_size=spec.vocab, seq_len=spec.seq, **runtime)

    def num_parameters(self) -> int:
        h, f, hd = self.hidden, self.ffn_dim, self.head_dim
        attn = h * self.heads * hd * 2 + h * self.kv_heads * hd * 2
        per_layer = attn + 3 * h * f + 2 * h
        return self.layers * per_layer + 2 * self.vocab_size * h + h


def layer_ranges(layers: int, num_stages: int) -> list[range]:
    """Contiguous transformer layers of each layer group.

    Balanced; when the layers do not divide evenly the extra ones go to the middle
    groups first, since the first and last groups also carry the embedding and the
    output head (PipeOffload removes a layer from those stages for the same reason).
    """
    require(num_stages >= 1, "num_stages", f"need at least one layer group, got {num_stages}")
    require(layers >= num_stages, "layers", f"{layers} layers cannot fill {num_stages} layer groups")
    base, extra = divmod(layers, num_stages)
    sizes = [base] * num_stages
    order = list(range(1, num_stages - 1)) + [0, num_stages - 1] if num_stages > 2 else list(range(num_stages))
    for s in order[:extra]:
        sizes[s] += 1
    out, start = [], 0
    for n in sizes:
        out.append(range(start, start + n))
        start += n
    return out


def balanced_ranges(layer_costs: list[float], num_stages: int, first: float = 0.0,
                    last: float = 0.0) -> list[range]:
    """Contiguous layers of each layer group, minimising the largest group cost.

    Args:
        layer_costs: the cost of each layer, in order (any unit; non-negative).
        num_stages: the number of layer groups (p·v).
        first: the extra cost of the first group (the embedding).
        last: the extra cost of the last group (the final norm and the output head).

    Returns:
        ``num_stages`` ranges covering ``range(len(layer_costs))`` in order, each with at
        least one layer.

    Raises:
        ParameterError: ``num_stages`` < 1, fewer layers than groups, or a negative cost.

    Guarantees: no other contiguous split with at least one layer per group has a
    smaller maximum of (layers' costs + the group's extra); among the optimal splits,
    one with evenly spread costs (a small sum of squares). With ``first``/``last`` as large
    as a layer, the first and last groups take a layer fewer than the others, as
    PipeOffload's partition does.
    """
    n = len(layer_costs)
    require(num_stages >= 1, "num_stages", f"need at least one layer group, got {num_stages}")
    require(n >= num_stages, "num_stages", f"{n} layers cannot fill {num_stages} layer groups (p·v)")
    require(all(c >= 0 for c in layer_costs) and first >= 0 and last >= 0, "layer_costs",
            "costs must be non-negative")
    prefix = [0.0]
    for c in layer_costs:
        prefix.append(prefix[-1] + c)

    def cost(s: int, a: int, b: int) -> float:  # group s holding layers a..b-1
        return prefix[b] - prefix[a] + (first if s == 0 else 0.0) + (last if s == num_stages - 1 else 0.0)

    # best[s][j]: (the smallest max cost, then the smallest sum of squared costs) of
    # groups 0..s covering layers 0..j-1; the max is exact, the squares spread the rest
    inf = (float("inf"), float("inf"))
    best = [[inf] * (n + 1) for _ in range(num_stages)]
    cut = [[0] * (n + 1) for _ in range(num_stages)]
    for j in range(1, n + 1):
        best[0][j] = (cost(0, 0, j), cost(0, 0, j) ** 2)
    for s in range(1, num_stages):
        for j in range(s + 1, n + 1):
            for i in range(s, j):  # the group's first layer
                c = cost(s, i, j)
                v = (max(best[s - 1][i][0], c), best[s - 1][i][1] + c * c)
                if v < best[s][j]:
                    best[s][j], cut[s][j] = v, i
    ends, j = [n], n
    for s in range(num_stages - 1, 0, -1):
        j = cut[s][j]
        ends.append(j)
    ends.append(0)
    ends.reverse()
    return [range(ends[s], ends[s + 1]) for s in range(num_stages)]
