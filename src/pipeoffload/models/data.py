"""A deterministic byte-level corpus: the Python documentation topics that ship with
the standard library (``pydoc_data.topics``), or a text file the user names. No downloads.

Batches are drawn by position from a generator seeded with ``(seed, step)``, so every
rank builds exactly the same microbatches without communicating, and a
single-process reference sees the same data.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch

from ..errors import ParameterError, read_input


def load_corpus(path: str | Path | None = None) -> bytes:
    """The bytes of ``path``, or of the stdlib documentation topics (~466 KB) when None."""
    if path is None:
        from pydoc_data.topics import topics

        return "\n\n".join(topics[k] for k in sorted(topics)).encode("utf-8")
    return read_input(path, "training.corpus", binary=True)


class ByteCorpus:
    """Windows of ``seq_len + 1`` bytes: inputs are the first ``seq_len``, targets the
    next-byte shift. Deterministic in ``(seed, step, microbatch)``.

    ``holdout``: the fraction of the corpus, at its end, kept out of this corpus
    (``part="train"``, the default) or that is this corpus (``part="validation"``);
    the two parts share no byte. 0 (the default) uses all of it."""

    def __init__(self, data: bytes, seq_len: int, seed: int = 0, *, holdout: float = 0.0,
                 part: str = "train") -> None:
        if part not in ("train", "validation"):
            raise ParameterError("part", f"must be train or validation, got {part!r}")
        if not 0.0 <= holdout < 1.0:
            raise ParameterError("training.holdout", f"must be in [0, 1), got {holdout}")
        cut = len(data) - int(len(data) * holdout)
        data = data[:cut] if part == "train" else data[cut:]
        if len(data) < seq_len + 2:
            raise ParameterError("training.holdout" if holdout else "training.corpus",
                                 f"the {part} part of the corpus has {len(data)} bytes; need more than "
                                 f"seq_len+1 = {seq_len + 1}")
        self.tokens = torch.frombuffer(bytearray(data), dtype=torch.uint8).long()
        self.seq_len = seq_len
        self.seed = seed

    def __len__(self) -> int:
        return self.tokens.numel()

    def batch(self, step: int, microbatch: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(inputs, targets)`` of shape (size, seq_len), int64."""
        rng = random.Random((self.seed * 1_000_003 + step) * 1_009 + microbatch)
        hi = self.tokens.numel() - self.seq_len - 1
        starts = [rng.randrange(hi) for _ in range(size)]
        win = torch.stack([self.tokens[s : s + self.seq_len + 1] for s in starts])
        return win[:, :-1].contiguous(), win[:, 1:].contiguous()

    def microbatches(self, step: int, m: int, size: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The ``m`` microbatches of one training step: (inputs list, targets list)."""
        pairs = [self.batch(step, j, size) for j in range(m)]
        return [x for x, _ in pairs], [y for _, y in pairs]
