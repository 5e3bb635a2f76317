"""Train a HuggingFace ``transformers`` Llama with pipeoffload (random init, no downloads).

    .venv/bin/python examples/hf_llama.py                 # untied embeddings, ZB-V with offload
    .venv/bin/python examples/hf_llama.py --tie           # head tied to the embedding
    .venv/bin/python examples/hf_llama.py --schedule zb-h1 --p 4 --steps 5

A small ``LlamaConfig`` (grouped-query attention: 4 query heads share 2 key/value
heads) is built on every rank with the same seed, cut into ``p·v`` stages with
:func:`pipeoffload.models.hf.split_causal_lm` (the stages *share* the model's modules,
so parameter names stay the model's own), and trained for a few AdamW steps by
:class:`~pipeoffload.runtime.PipelineRunner` under :func:`~pipeoffload.runtime.launch`
(gloo on CPU). The batch is right-padded: its 0/1 mask and the position ids cross every
boundary with the hidden states, without gradients, and each stage builds its attention
mask from them with transformers' own mask function. With ``--tie`` the head and the
embedding are one tensor held by the first and the last stage: the stages declare the tie
(from the model's tied-weight list), the runner lists it once and sums its two gradients
among the ranks that hold it.

Needs ``pip install 'pipeoffload[hf]'`` (``transformers``).
"""

from __future__ import annotations

import argparse
import time

import torch

from pipeoffload.models.hf import causal_lm_loss, split_causal_lm
from pipeoffload.passes.offload import plan_offload
from pipeoffload.runtime import PipelineRunner, launch
from pipeoffload.runtime.offload_store import OffloadStore
from pipeoffload.schedules import generate


def build_model(tie: bool, layers: int) -> torch.nn.Module:
    """A tiny Llama with GQA, the same weights on every rank (seeded)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=tie, attn_implementation="sdpa")
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg)


def make_batch(step: int, batch: int, seq: int, vocab: int = 256) -> tuple[dict, torch.Tensor]:
    """Random token ids, right-padded to ``seq`` (every sequence a different length),
    and next-token targets with padding ignored (-100)."""
    g = torch.Generator().manual_seed(step)
    ids = torch.randint(0, vocab, (batch, seq + 1), generator=g)
    lengths = torch.randint(seq // 2, seq + 1, (batch,), generator=g)
    mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
    targets = ids[:, 1:].clone()
    targets[mask == 0] = -100
    return {"input_ids": ids[:, :-1], "attention_mask": mask}, targets


def worker(ctx, args: argparse.Namespace) -> None:
    kw = {"v": 2} if args.schedule in ("zb-v", "v-half", "v-min", "interleaved-1f1b") else {}
    sched = generate(args.schedule, p=ctx.world_size, m=args.m, **kw)
    store = None
    if args.offload:
        sched = plan_offload(sched, offload_chunks=sched.chunks).schedule  # activations to host between F and B
        store = OffloadStore()
    model = build_model(args.tie, layers=max(4, sched.num_stages))
    runner = PipelineRunner(split_causal_lm(model, sched.num_stages), causal_lm_loss, sched, activation_store=store)
    opt = torch.optim.AdamW(runner.parameters(), lr=3e-3)
    # Shared parameters, by every name they have: ``lm_head.weight`` -> ``model.embed_tokens.weight`` when tied.
    shared = {n: c for n, c in runner.table.aliases.items() if n != c}
    if ctx.rank == 0:
        tied = "tied" if args.tie else "untied"
        print(f"{sched.name}: p={ctx.world_size}, m={args.m}, {sched.num_stages} stages, {tied} embeddings, "
              f"offload={'on' if args.offload else 'off'}; shared: {shared or 'none'}")
    t0 = time.perf_counter()
    for step in range(args.steps):
        x, y = make_batch(step % 2, args.batch, args.seq)  # two batches, alternating: the loss falls
        res = runner.step(x, y)  # the whole batch: split into m microbatches
        opt.step()
        opt.zero_grad(set_to_none=True)
        if res.loss is not None:
            print(f"step {step}: loss {res.loss:.4f}")
    val = runner.eval_step(*make_batch(99, args.batch, args.seq))
    if val.loss is not None:
        print(f"validation loss {val.loss:.4f}; {time.perf_counter() - t0:.1f} s; "
              f"W share per split stage: {res.meta.get('w_share') or 'no split'}")
    runner.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--p", type=int, default=2, help="pipeline ranks")
    ap.add_argument("--m", type=int, default=4, help="microbatches per step")
    ap.add_argument("--schedule", default="zb-v", help="any schedule of the registry (pipeoffload simulate --list)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--tie", action="store_true", help="tie the head to the embedding")
    ap.add_argument("--no-offload", dest="offload", action="store_false", help="keep activations on the device")
    args = ap.parse_args()
    launch(worker, args.p, (args,), backend="gloo")


if __name__ == "__main__":
    main()
