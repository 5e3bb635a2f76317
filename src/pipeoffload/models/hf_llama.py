"""A HuggingFace ``LlamaForCausalLM`` split into pipeline stages.

Needs the optional ``transformers`` package (``pip install 'pipeoffload[hf]'``); works
with transformers 4.48+ and 5.x.

:func:`split_llama` cuts a model into :class:`LlamaStage` modules that *share* the
model's submodules (no copy): parameter names stay the model's own
(``model.layers.3.self_attn.q_proj.weight``, ``lm_head.weight``), a checkpoint of the
pipeline loads into the whole model, and a head tied to the embedding
(``tie_word_embeddings=True``) is the same tensor in the first and the last stage — give
the runner the list of all stages and it finds the tie (or declare it with
``tie=[("model.embed_tokens.weight", "lm_head.weight")]`` when each rank builds only
its own stages).

What crosses each boundary (``runtime/boundary.py``):

- into the first stage: ``{"input_ids": (b, s) int64, "attention_mask": (b, s) 0/1}``
  (the mask optional; right padding);
- between stages: ``(hidden (b, s, h), mask (b, 1, s, s) bool, position_ids (b, s))`` —
  the mask (True = may attend: causal and not padding) and the positions are built
  once, in the first stage, and travel without gradients;
- out of the last stage: the logits ``(b, s, vocab)``; :func:`causal_lm_loss` is the
  next-token loss with ``-100`` targets ignored.

The attention runs through the model's own attention implementation with an explicit
boolean mask: ``sdpa`` (transformers' default) or ``flex_attention``; ``eager`` needs an
additive mask and is refused.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ParameterError
from .config import layer_ranges


def causal_mask(attention_mask: torch.Tensor | None, batch: int, seq: int, device: torch.device) -> torch.Tensor:
    """``(b, 1, s, s)`` bool: query ``i`` may attend key ``k`` when ``k <= i`` and key ``k``
    is not padding (``attention_mask[b, k] == 1``)."""
    causal = torch.ones(seq, seq, dtype=torch.bool, device=device).tril()
    mask = causal.expand(batch, 1, seq, seq)
    if attention_mask is not None:
        mask = mask & attention_mask.to(device=device, dtype=torch.bool)[:, None, None, :]
    return mask.contiguous()


class LlamaStage(nn.Module):
    """Decoder layers ``layer_ids`` of a ``LlamaForCausalLM`` (+ the embedding in the
    first stage, + the final norm and the head in the last), sharing the model's
    submodules and keeping its structure, hence its parameter names (module docstring)."""

    def __init__(self, model: nn.Module, layer_ids: range, first: bool, last: bool) -> None:
        super().__init__()
        impl = getattr(model.config, "_attn_implementation", "sdpa")
        if impl == "eager":
            raise ParameterError("model", "LlamaStage passes a boolean attention mask, which the eager attention "
                                 "cannot take; build the model with attn_implementation=\"sdpa\"")
        self.first, self.last = first, last
        self.model = nn.Module()
        if first:
            self.model.embed_tokens = model.model.embed_tokens
        self.model.layers = nn.ModuleDict({str(i): model.model.layers[i] for i in layer_ids})
        if last:
            self.model.norm = model.model.norm
            self.lm_head = model.lm_head
        self.model.rotary_emb = model.model.rotary_emb

    def forward(self, x: Any) -> Any:
        if self.first:
            ids = x["input_ids"]
            hidden = self.model.embed_tokens(ids)
            b, s = ids.shape
            position_ids = torch.arange(s, device=ids.device).unsqueeze(0).expand(b, s)
            mask = causal_mask(x.get("attention_mask"), b, s, ids.device)
        else:
            hidden, mask, position_ids = x
        pos = self.model.rotary_emb(hidden, position_ids)
        for layer in self.model.layers.values():
            out = layer(hidden, attention_mask=mask, position_ids=position_ids, position_embeddings=pos)
            hidden = out[0] if isinstance(out, tuple) else out  # transformers 4.x returns a tuple
        if self.last:
            return self.lm_head(self.model.norm(hidden))
        return hidden, mask, position_ids


def split_llama(model: nn.Module, num_stages: int) -> list[LlamaStage]:
    """``num_stages`` stages of ``model`` (a ``LlamaForCausalLM``): contiguous decoder
    layers, balanced as :func:`~pipeoffload.models.config.layer_ranges` does."""
    layers = len(model.model.layers)
    if layers < num_stages:
        raise ParameterError("num_stages", f"{layers} decoder layers cannot fill {num_stages} stages (p·v)")
    ranges = layer_ranges(layers, num_stages)
    return [LlamaStage(model, ranges[s], s == 0, s == num_stages - 1) for s in range(num_stages)]


def causal_lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of next-token ``targets`` (already shifted), ``-100`` ignored."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), ignore_index=-100)
