"""Side data and auxiliary losses crossing stages (runtime, two gloo ranks):

- a skip connection: a tensor (with gradient) made by the first stage, passed on untouched
  by the middle stages and used by the last (a non-adjacent stage, on the other rank
  under ZB-V's V placement and back);
- ``cu_seqlens`` of packed sequences (int64, no gradient) used by every stage (a mean per
  sequence);
- a z-loss-like auxiliary term added by every stage (``models.aux_loss.add_aux_loss``)
  and summed into the loss by ``with_aux_loss``;

on a loop (interleaved 1F1B) and a V schedule (ZB-V, with offload), 4 layer groups: the
loss and every gradient equal single-process training of the same stages in sequence.
"""

from __future__ import annotations

import pytest

from helpers import import_torch, run_world

torch = import_torch()

from pipeoffload.models.aux_loss import add_aux_loss, with_aux_loss  # noqa: E402

M, D, STAGES = 4, 8, 4
pytestmark = [pytest.mark.multiproc]


def _segment_mean(h: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
    """Each token gets the mean of its packed sequence (``cu``: sequence starts and end)."""
    out = torch.empty_like(h)
    bounds = cu.tolist()
    for a, b in zip(bounds[:-1], bounds[1:]):
        out[:, a:b] = h[:, a:b].mean(dim=1, keepdim=True)
    return out


class Stage(torch.nn.Module):
    def __init__(self, s: int) -> None:
        super().__init__()
        torch.manual_seed(s)
        self.s = s
        self.lin = torch.nn.Linear(D, D)
        if s == 0:
            self.skip = torch.nn.Linear(D, D)

    def forward(self, x: dict) -> dict:
        h = torch.tanh(self.lin(x["h"]))
        h = h + _segment_mean(h, x["cu_seqlens"])
        out = {"h": h, "cu_seqlens": x["cu_seqlens"],
               "aux_loss": add_aux_loss(x, 1e-2 * torch.logsumexp(h, dim=-1).pow(2).mean())}
        if self.s == 0:
            out["skip"] = self.skip(x["h"])
        elif self.s < STAGES - 1:
            out["skip"] = x["skip"]  # handed on untouched
        else:
            out["h"] = h + x["skip"]
        return out


def _mse(h, y):
    return ((h["h"] if isinstance(h, dict) else h) - y).pow(2).mean()


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 6, D, generator=g)
    y = torch.randn(8, 6, D, generator=g)
    return {"h": x, "cu_seqlens": torch.tensor([0, 2, 6]).expand(8, 3)}, y


def _world(ctx, path: str) -> None:
    from pipeoffload.passes.offload import plan_offload
    from pipeoffload.runtime.executor import PipelineRunner
    from pipeoffload.runtime.measure import gather_results
    from pipeoffload.runtime.offload_store import OffloadStore
    from pipeoffload.schedules import generate

    out = {}
    for name, off in (("interleaved-1f1b", False), ("zb-v", True)):
        sched = generate(name, p=2, m=M, **({"v": 2} if name == "interleaved-1f1b" else {}))
        store = None
        if off:
            sched, store = plan_offload(sched, offload_chunks=sched.chunks).schedule, OffloadStore()
        stages = [_Row(Stage(s)) for s in range(STAGES)]
        runner = PipelineRunner(lambda s: stages[s], with_aux_loss(_mse), sched, timeout_s=120,
                                activation_store=store)
        res = runner.step(*_data())
        got = gather_results({"loss": res.loss, "grads": {n: q.grad.clone() for n, q in runner.named_parameters()}})
        if ctx.rank == 0:
            out[name] = {"loss": next(g["loss"] for g in got if g["loss"] is not None),
                         "grads": {k: v for g in got for k, v in g["grads"].items()}}
    if ctx.rank == 0:
        torch.save(out, path)


class _Row(torch.nn.Module):
    """Takes the per-row ``cu_seqlens`` the batch split gives and uses its first row."""

    def __init__(self, inner: Stage) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: dict) -> dict:
        cu = x["cu_seqlens"]
        out = self.inner({**x, "cu_seqlens": cu[0] if cu.dim() == 2 else cu})
        out["cu_seqlens"] = cu
        return out


def test_skip_connections_packed_lengths_and_aux_losses_cross_stages_exactly(tmp_path):
    out = run_world(_world, 2, tmp_path / "out.pt")
    stages = [_Row(Stage(s)) for s in range(STAGES)]
    loss_fn = with_aux_loss(_mse)
    from pipeoffload.runtime.boundary import split_batch

    x, y = _data()
    total = 0.0
    for xm, ym in zip(split_batch(x, M, "inputs"), split_batch(y, M, "targets")):
        h = xm
        for s in stages:
            h = s(h)
        loss = loss_fn(h, ym) / M
        loss.backward()
        total += loss.item()
    want = {f"{s}.{n}": q.grad for s, st in enumerate(stages) for n, q in st.named_parameters()}
    for name, r in out.items():
        assert abs(r["loss"] - total) <= 1e-6 * abs(total), f"{name}: {r['loss']} vs {total}"
        assert set(r["grads"]) == set(want), f"{name}: {sorted(r['grads'])}"
        for n, w in want.items():
            err = ((r["grads"][n] - w).abs().max() / w.abs().max()).item()
            assert err <= 1e-5, f"{name}: {n} off by {err:.2e}"
