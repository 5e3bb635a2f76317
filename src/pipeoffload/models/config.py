"""ModelConfig: the reference transformer's shape. Pure Python (no torch), so the
CLI can parse and check a configuration without importing torch."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import require


@dataclass
class ModelConfig:
    """A decoder-only transformer in the modern style (RMSNorm, rotary embeddings,
    grouped-query attention, SwiGLU MLP). Byte-level by default (``vocab_size`` 256).
    It is the ``[model]`` section of ``pipeoffload train``'s configuration, so errors
    name the configuration key (``model.heads``).

    ``seed`` fixes the initial weights; each layer draws from its own generator
    (seeded by ``seed`` and the layer index), so the weights do not depend on how
    the layers are split into layer groups.
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
