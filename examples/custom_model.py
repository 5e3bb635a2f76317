"""Train your own ``nn.Module`` with pipeoffload: a plain MLP-mixer-like model, by hand.

    .venv/bin/python examples/custom_model.py
    .venv/bin/python examples/custom_model.py --schedule 1f1b --p 4

Nothing to inherit and nothing to register: each stage is an ordinary module. The
first takes a dict batch ``{"x": features, "keep": row mask}``; every stage passes a
tuple ``(hidden, keep)`` on — ``keep`` needs no gradient, so it travels forward only
(no gradient message). A bare ``nn.Parameter`` used in ``forward`` and a
non-``nn.Linear`` matmul get the zero-bubble B/W split like linears do (the runner
reports W's share of backward time per stage). Dropout draws from streams keyed by
(seed, step, microbatch, module): the losses are the same for every schedule and
pipeline size.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn

from pipeoffload.runtime import PipelineRunner, launch
from pipeoffload.schedules import generate

DIM, CLASSES = 64, 10


class Block(nn.Module):
    """A residual block without ``nn.Linear``: a bare weight matrix, a gate vector, dropout."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.w = nn.Parameter(torch.randn(DIM, 2 * DIM) / DIM ** 0.5)
        self.v = nn.Parameter(torch.randn(2 * DIM, DIM) / (2 * DIM) ** 0.5)
        self.gate = nn.Parameter(torch.ones(DIM))
        self.drop = nn.Dropout(0.1)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.drop(F.gelu(self.norm(h) @ self.w) @ self.v) * self.gate


class Stage(nn.Module):
    def __init__(self, blocks: int, first: bool, last: bool) -> None:
        super().__init__()
        self.first, self.last = first, last
        self.inp = nn.Linear(32, DIM) if first else None
        self.blocks = nn.ModuleList(Block() for _ in range(blocks))
        self.head = nn.Linear(DIM, CLASSES) if last else None

    def forward(self, x):
        if self.first:
            h, keep = self.inp(x["x"]), x["keep"]
        else:
            h, keep = x
        for b in self.blocks:
            h = b(h) * keep[:, None]  # rows marked 0 are padding: zeroed at every block
        return self.head(h) if self.last else (h, keep)


def loss_fn(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, y, ignore_index=-100)


def data(step: int, n: int = 64) -> tuple[dict, torch.Tensor]:
    g = torch.Generator().manual_seed(step % 4)
    x = torch.randn(n, 32, generator=g)
    keep = (torch.rand(n, generator=g) > 0.1).float()
    y = (x[:, :CLASSES].argmax(1)).masked_fill(keep == 0, -100)  # a learnable rule
    return {"x": x, "keep": keep}, y


def worker(ctx, args: argparse.Namespace) -> None:
    sched = generate(args.schedule, p=ctx.world_size, m=args.m, **({"v": 2} if args.schedule == "zb-v" else {}))
    torch.manual_seed(0)  # the same weights on every rank; each rank keeps only its own stages
    stages = [Stage(2, s == 0, s == sched.num_stages - 1) for s in range(sched.num_stages)]
    runner = PipelineRunner(stages, loss_fn, sched, seed=1)
    opt = torch.optim.AdamW(runner.parameters(), lr=3e-3)
    for step in range(args.steps):
        res = runner.step(*data(step))  # the whole batch, split into m microbatches
        opt.step()
        opt.zero_grad(set_to_none=True)
        if res.loss is not None:
            print(f"step {step}: loss {res.loss:.4f}  W share {_fmt(res.meta.get('w_share', {}))}")
    val = runner.eval_step(*data(99))
    if val.loss is not None:
        print(f"validation loss {val.loss:.4f}")
    runner.close()  # the modules keep the trained values


def _fmt(share: dict) -> str:
    return ", ".join(f"stage {s}: {v:.0%}" for s, v in sorted(share.items())) or "no split"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--p", type=int, default=2)
    ap.add_argument("--m", type=int, default=4)
    ap.add_argument("--schedule", default="zb-h1")
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    launch(worker, args.p, (args,), backend="gloo")


if __name__ == "__main__":
    main()
