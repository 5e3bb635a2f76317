"""Split any ``nn.Module`` by name, torchtitan's way: a torchtitan-style Llama on pipeoffload.

    .venv/bin/python examples/torchtitan_llama.py
    .venv/bin/python examples/torchtitan_llama.py --schedule 1f1b --p 4

The model has torchtitan's layout — ``tok_embeddings``, ``layers`` as an ``nn.ModuleDict``
keyed by the layer number, ``norm``, ``output`` — and a forward that skips what a stage
dropped. :func:`pipeoffload.models.split.split_by_name` keeps, per stage, the submodules
listed (the embedding with the first layers, the norm and head with the last), under the
model's fully qualified names (``layers.3.attention.wq.weight``): a checkpoint written at
one pipeline size loads at another.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn

from pipeoffload.models.config import layer_ranges
from pipeoffload.models.split import split_by_name
from pipeoffload.runtime import PipelineRunner, launch
from pipeoffload.schedules import generate

VOCAB, DIM, HEADS = 128, 64, 4


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(DIM, DIM, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (w(x).view(b, s, HEADS, -1).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        return self.wo(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, DIM))


class TransformerBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention_norm, self.ffn_norm = nn.RMSNorm(DIM), nn.RMSNorm(DIM)
        self.attention = Attention()
        self.w1, self.w2, self.w3 = nn.Linear(DIM, 4 * DIM, bias=False), nn.Linear(4 * DIM, DIM, bias=False), \
            nn.Linear(DIM, 4 * DIM, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = h + self.attention(self.attention_norm(h))
        x = self.ffn_norm(h)
        return h + self.w2(F.silu(self.w1(x)) * self.w3(x))


class Transformer(nn.Module):
    """torchtitan's layout; the forward skips the parts a pipeline stage dropped."""

    def __init__(self, layers: int) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleDict({str(i): TransformerBlock() for i in range(layers)})
        self.norm = nn.RMSNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for layer in self.layers.values():
            h = layer(h)
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None else h


def stage_names(layers: int, num_stages: int) -> list[list[str]]:
    """What each stage keeps: contiguous layers, the embedding first, norm and head last."""
    names = [[f"layers.{i}" for i in r] for r in layer_ranges(layers, num_stages)]
    names[0].insert(0, "tok_embeddings")
    names[-1] += ["norm", "output"]
    return names


def build(layers: int) -> Transformer:
    torch.manual_seed(0)
    return Transformer(layers)


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def worker(ctx, args: argparse.Namespace) -> None:
    sched = generate(args.schedule, p=ctx.world_size, m=args.m)
    layers = max(4, sched.num_stages)
    stages = split_by_name(build(layers), stage_names(layers, sched.num_stages))
    runner = PipelineRunner(stages, loss_fn, sched)
    opt = torch.optim.AdamW(runner.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (8, 33), generator=g)
    for step in range(args.steps):
        res = runner.step(ids[:, :-1], ids[:, 1:])
        opt.step()
        opt.zero_grad(set_to_none=True)
        if res.loss is not None:
            print(f"step {step}: loss {res.loss:.4f}")
    if ctx.rank == 0:
        print("rank 0 holds", ", ".join(n for n, _ in runner.named_parameters())[:200], "...")
    runner.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--p", type=int, default=2)
    ap.add_argument("--m", type=int, default=4)
    ap.add_argument("--schedule", default="zb-v")
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args()
    launch(worker, args.p, (args,), backend="gloo")


if __name__ == "__main__":
    main()
