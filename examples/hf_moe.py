"""Train a HuggingFace mixture-of-experts model (Qwen2-MoE) with pipeoffload, router loss included.

    .venv/bin/python examples/hf_moe.py                       # ZB-V with offload, p = 2
    .venv/bin/python examples/hf_moe.py --schedule 1f1b --p 4

A tiny ``Qwen2MoeConfig`` (4 experts, 2 per token, a shared expert; random init, no
downloads), cut with :func:`pipeoffload.models.hf.split_causal_lm` and trained by
:class:`~pipeoffload.runtime.PipelineRunner` under :func:`~pipeoffload.runtime.launch`
(gloo on CPU). With ``output_router_logits=True`` the HF model adds
``router_aux_loss_coef`` × its load-balancing loss to ``loss``; the pipeline does the
same: each stage adds its layers' routing statistics to running sums that cross the stage
boundaries (the probabilities' sum with its gradient), and the last stage returns
``{"logits", "aux_loss"}``, which :func:`~pipeoffload.models.hf.causal_lm_loss` adds.
The script prints the pipeline's losses next to the unsplit model's on the same batches
(they agree to float rounding).

Needs ``pip install 'pipeoffload[hf]'`` (``transformers``).
"""

from __future__ import annotations

import argparse

import torch

from pipeoffload.models.hf import causal_lm_loss, split_causal_lm
from pipeoffload.passes.offload import plan_offload
from pipeoffload.runtime import PipelineRunner, launch
from pipeoffload.runtime.offload_store import OffloadStore
from pipeoffload.schedules import generate

VOCAB = 128


def build_model(layers: int) -> torch.nn.Module:
    """A tiny Qwen2-MoE, the same weights on every rank (seeded)."""
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    cfg = Qwen2MoeConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
                         moe_intermediate_size=32, shared_expert_intermediate_size=64,
                         output_router_logits=True, router_aux_loss_coef=0.1, attn_implementation="sdpa")
    torch.manual_seed(0)
    return Qwen2MoeForCausalLM(cfg)


def make_batch(step: int, batch: int, seq: int) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """Right-padded ids with their mask, next-token targets (-100 at padding and at the
    last position) and the unshifted labels that give HF's own loss the same tokens."""
    g = torch.Generator().manual_seed(step)
    ids = torch.randint(0, VOCAB, (batch, seq), generator=g)
    lengths = torch.randint(seq // 2, seq + 1, (batch,), generator=g)
    mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
    labels = ids.masked_fill(mask == 0, -100)
    targets = torch.cat([labels[:, 1:], torch.full((batch, 1), -100)], dim=1)
    return {"input_ids": ids, "attention_mask": mask}, targets, labels


def worker(ctx, args: argparse.Namespace) -> None:
    sched = generate(args.schedule, p=ctx.world_size, m=args.m)
    store = None
    if args.offload:
        sched, store = plan_offload(sched, offload_chunks=sched.chunks).schedule, OffloadStore()
    layers = max(4, sched.num_stages)
    runner = PipelineRunner(split_causal_lm(build_model(layers), sched.num_stages), causal_lm_loss, sched,
                            activation_store=store)
    opt = torch.optim.AdamW(runner.parameters(), lr=3e-3)
    ref = build_model(layers) if runner.has_last_stage else None  # the unsplit model, trained alongside
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=3e-3) if ref is not None else None
    for step in range(args.steps):
        x, y, labels = make_batch(step % 2, args.batch, args.seq)
        res = runner.step(x, y)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if ref is not None:  # HF's own loss (cross-entropy + coef x load balancing), microbatch by microbatch
            total = 0.0
            for xs, ls in zip(*(_split(v, args.m) for v in (x, labels))):
                loss = ref(**xs, labels=ls).loss / args.m
                loss.backward()
                total += loss.item()
            ref_opt.step()
            ref_opt.zero_grad(set_to_none=True)
        if res.loss is not None:
            print(f"step {step}: pipeline loss {res.loss:.6f}" + (f", unsplit model {total:.6f}" if ref else ""))
    runner.close()


def _split(v, m):
    from pipeoffload.runtime.boundary import split_batch

    return split_batch(v, m, "inputs")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--p", type=int, default=2, help="pipeline ranks")
    ap.add_argument("--m", type=int, default=4, help="microbatches per step")
    ap.add_argument("--schedule", default="zb-v", help="any schedule of the registry (pipeoffload simulate --list)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=24)
    ap.add_argument("--no-offload", dest="offload", action="store_false", help="keep activations on the device")
    args = ap.parse_args()
    launch(worker, args.p, (args,), backend="gloo")


if __name__ == "__main__":
    main()
