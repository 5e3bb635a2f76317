"""The former Llama-only splitter, now an alias of :mod:`pipeoffload.models.hf`.

``split_llama(model, num_stages)`` is :func:`~pipeoffload.models.hf.split_causal_lm`
(every family it knows, Llama included; a Llama-like model of another family is split by
its own recipe, never as a Llama), ``causal_lm_loss`` the same loss and ``LlamaStage``
the stage class. :func:`causal_mask` is kept for stages written by hand.
"""

from __future__ import annotations

import torch

from .hf import CausalLMStage as LlamaStage
from .hf import causal_lm_loss, split_causal_lm

split_llama = split_causal_lm

__all__ = ["LlamaStage", "causal_lm_loss", "causal_mask", "split_llama"]


def causal_mask(attention_mask: torch.Tensor | None, batch: int, seq: int, device: torch.device,
                dtype: torch.dtype | None = None) -> torch.Tensor:
    """``(b, 1, s, s)``: query ``i`` may attend key ``k`` when ``k <= i`` and key ``k`` is
    not padding (``attention_mask[b, k] == 1``).

    Args:
        attention_mask: ``(b, s)`` 0/1, or ``None`` (no padding).
        batch, seq, device: the mask's batch size, sequence length and device.
        dtype: ``None``: a bool mask (True = may attend), for ``sdpa`` and
            ``flex_attention``; a float dtype: the additive mask ``eager`` attention adds
            to its scores (0 where allowed, the dtype's minimum elsewhere). A bool mask
            given to eager attention would be *added* as 0/1: prefer transformers' own
            ``create_causal_mask``, which picks the form from the model's config.

    Returns:
        The mask, contiguous.
    """
    causal = torch.ones(seq, seq, dtype=torch.bool, device=device).tril()
    mask = causal.expand(batch, 1, seq, seq)
    if attention_mask is not None:
        mask = mask & attention_mask.to(device=device, dtype=torch.bool)[:, None, None, :]
    if dtype is not None:
        return torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill_(~mask, torch.finfo(dtype).min)
    return mask.contiguous()
