"""Auxiliary loss terms from any stage (MoE load balancing, z-loss), with exact gradients.

A stage adds its term to a running sum that travels with its output, and the last stage's
loss adds the sum::

    def forward(self, x):                        # any stage
        h = self.layer(x["hidden"])
        return {"hidden": h, "aux_loss": add_aux_loss(x, 1e-4 * z_loss(h))}

    runner = PipelineRunner(stages, with_aux_loss(my_loss), sched)

The sum is a tensor that requires grad, so it crosses each boundary like the hidden
states and its gradient (1/m, like the main loss's) comes back through every stage that
added to it: the gradients are those of ``my_loss + Σ terms`` in single-process training.
The first stage may start the sum (``x`` without ``"aux_loss"``); a stage that adds
nothing passes it on. :func:`pipeoffload.models.hf.split_causal_lm` carries the MoE
router statistics the same way (the load-balancing loss is not a sum of per-layer terms,
so it carries the sums it is made of).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

KEY = "aux_loss"


def add_aux_loss(x: Any, term: torch.Tensor) -> torch.Tensor:
    """The running sum of ``x`` (a stage's input dict; none yet: 0) plus ``term`` (a scalar)."""
    prev = x.get(KEY) if isinstance(x, dict) else None
    return term if prev is None else prev + term


def with_aux_loss(loss_fn: Callable[[Any, Any], torch.Tensor]) -> Callable[[Any, Any], torch.Tensor]:
    """``loss_fn`` for a last stage that returns a dict with ``"aux_loss"``: calls
    ``loss_fn`` on the dict without it (its one other value when there is just one) and
    adds the sum.

    Args:
        loss_fn: ``(output, target) -> scalar``, the main loss.

    Returns:
        ``(output, target) -> scalar``: ``loss_fn(...) + output["aux_loss"]``; outputs
        that are not such dicts go to ``loss_fn`` unchanged.
    """

    def loss(output: Any, target: Any) -> torch.Tensor:
        if not (isinstance(output, dict) and KEY in output):
            return loss_fn(output, target)
        rest = {k: v for k, v in output.items() if k != KEY}
        main = loss_fn(next(iter(rest.values())) if len(rest) == 1 else rest, target)
        return main + output[KEY].to(main.device)

    loss.__name__ = f"with_aux_loss({getattr(loss_fn, '__name__', 'loss')})"
    return loss
