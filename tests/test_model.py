"""Reference model, corpus, deferred weight gradients and the saved-tensor meter
(single process, CPU)."""

from __future__ import annotations

import pytest

from helpers import import_torch

torch = import_torch()

from pipeoffload.errors import ParameterError  # noqa: E402
from pipeoffload.models import ModelConfig, layer_ranges  # noqa: E402
from pipeoffload.models.data import ByteCorpus, load_corpus  # noqa: E402
from pipeoffload.models.transformer import build_reference, build_stage, build_stages, lm_loss  # noqa: E402
from pipeoffload.runtime.meter import SavedTensorMeter  # noqa: E402
from pipeoffload.runtime.weight_grad import DeferredLinear, WeightGradStore, convert_linears  # noqa: E402

CFG = ModelConfig(layers=6, hidden=32, heads=4, kv_heads=2, seq_len=16, seed=7)


def _batch(b=2, seed=0):
    c = ByteCorpus(load_corpus(), CFG.seq_len, seed)
    return c.batch(0, 0, b)


@pytest.mark.parametrize("n", [1, 2, 3, 6])
def test_weights_do_not_depend_on_the_split(n):
    ref = dict(build_reference(CFG).named_parameters())
    seen = set()
    for s, mod in build_stages(CFG, list(range(n)), n).items():
        for name, prm in mod.named_parameters():
            assert name not in seen
            seen.add(name)
            assert torch.equal(prm, ref[name]), name
    assert seen == set(ref)


def test_stages_compose_to_the_reference():
    x, y = _batch()
    ref = build_reference(CFG)
    h = x
    for mod in build_stages(CFG, [0, 1, 2], 3).values():
        h = mod(h)
    torch.testing.assert_close(h, ref(x), rtol=0, atol=0)
    assert h.shape == (2, CFG.seq_len, CFG.vocab_size)
    assert abs(lm_loss(h, y).item() - torch.log(torch.tensor(256.0)).item()) < 0.1  # near-uniform at init


def test_seed_changes_weights():
    a = build_reference(CFG).layers["0"].attn.wq.weight
    b = build_reference(ModelConfig(**{**CFG.__dict__, "seed": 8})).layers["0"].attn.wq.weight
    assert not torch.equal(a, b)


def test_model_is_causal_and_uses_gqa():
    ref = build_reference(CFG)
    assert ref.layers["0"].attn.wk.weight.shape[0] == CFG.kv_heads * CFG.head_dim
    x, _ = _batch(1)
    x2 = x.clone()
    x2[0, -1] = (x2[0, -1] + 1) % 256
    out1, out2 = ref(x), ref(x2)
    torch.testing.assert_close(out1[:, :-1], out2[:, :-1])
    assert not torch.allclose(out1[:, -1], out2[:, -1])


def test_layer_ranges_cover_all_layers_contiguously():
    for layers in range(1, 20):
        for n in range(1, layers + 1):
            rs = layer_ranges(layers, n)
            assert [i for r in rs for i in r] == list(range(layers))
            assert max(map(len, rs)) - min(map(len, rs)) <= 1
    assert [len(r) for r in layer_ranges(10, 4)] == [2, 3, 3, 2]  # extras to the middle groups


def test_config_errors_name_the_parameter():
    with pytest.raises(ParameterError, match="model.heads"):
        ModelConfig(hidden=30, heads=4)
    with pytest.raises(ParameterError, match="model.kv_heads"):
        ModelConfig(heads=4, kv_heads=3)
    with pytest.raises(ParameterError, match="model.layers"):
        build_stage(CFG, 0, 8)


def test_corpus_is_deterministic_and_shifted(tmp_path):
    data = load_corpus()
    assert len(data) > 100_000 and data == load_corpus()
    c1, c2 = ByteCorpus(data, 32, 5), ByteCorpus(data, 32, 5)
    x1, y1 = c1.batch(3, 1, 4)
    x2, y2 = c2.batch(3, 1, 4)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert torch.equal(x1[:, 1:], y1[:, :-1])
    assert not torch.equal(x1, c1.batch(3, 2, 4)[0])
    assert x1.dtype == torch.int64 and int(x1.max()) < 256
    f = tmp_path / "t.txt"
    f.write_text("abcdefgh" * 20)
    xs, ys = ByteCorpus(load_corpus(f), 8).microbatches(0, 3, 2)
    assert len(xs) == 3 and xs[0].shape == (2, 8)
    with pytest.raises(ParameterError, match="training.corpus"):
        load_corpus(tmp_path / "missing.txt")
    with pytest.raises(ParameterError, match="training.corpus"):
        ByteCorpus(b"abc", 8)


def _grads(mod):
    return {n: p.grad.clone() for n, p in mod.named_parameters()}


def test_deferred_weight_grads_equal_autograd():
    x, y = _batch()
    ref = build_reference(CFG)
    lm_loss(ref(x), y).backward()
    want = _grads(ref)

    mod = build_reference(CFG)
    assert convert_linears(mod) == 7 * CFG.layers + 1
    store = WeightGradStore()
    with store.forward(0, 0):
        loss = lm_loss(mod(x), y)
    with store.deferring():
        loss.backward()  # B: input grads and small params only
    for name, p in mod.named_parameters():
        is_linear = name.endswith(("wq.weight", "wk.weight", "wv.weight", "wo.weight", "w1.weight",
                                   "w2.weight", "w3.weight", "head.weight"))
        assert (p.grad is None) == is_linear, name
    assert store.pending((0, 0)) == 7 * CFG.layers + 1
    assert store.flush(0, 0) == 7 * CFG.layers + 1  # W
    assert store.pending() == 0
    got = _grads(mod)
    for n in want:
        torch.testing.assert_close(got[n], want[n], rtol=1e-5, atol=1e-7)


def test_deferred_linear_with_bias_and_accumulation():
    torch.manual_seed(0)
    lin = torch.nn.Linear(5, 3)
    ref = torch.nn.Linear(5, 3)
    ref.load_state_dict(lin.state_dict())
    convert_linears(lin)
    assert isinstance(lin, DeferredLinear)
    store = WeightGradStore()
    xs = [torch.randn(2, 4, 5) for _ in range(2)]
    for j, x in enumerate(xs):
        with store.forward(0, j):
            out = lin(x)
        with store.deferring():
            out.pow(2).sum().backward()
        ref(x).pow(2).sum().backward()
    assert lin.weight.grad is None and lin.bias.grad is None
    store.flush(0, 1)
    store.flush(0, 0)  # order of W's does not matter
    torch.testing.assert_close(lin.weight.grad, ref.weight.grad)
    torch.testing.assert_close(lin.bias.grad, ref.bias.grad)
    assert store.flush(0, 0) == 0


def test_outside_a_store_deferred_linear_is_plain():
    lin = torch.nn.Linear(4, 2)
    convert_linears(lin)
    x = torch.randn(3, 4, requires_grad=True)
    lin(x).sum().backward()
    assert lin.weight.grad is not None and x.grad is not None


def test_saved_tensor_meter_counts_storages_once_and_returns_to_zero():
    mod = build_reference(CFG)
    meter = SavedTensorMeter(list(mod.parameters()) + list(mod.buffers()))
    x, y = _batch()
    meter.start_step()
    with torch.autograd.graph.saved_tensors_hooks(*meter.saved_tensor_hooks()):
        loss = lm_loss(mod(x), y)
    saved = meter.level()
    assert saved > 0 and meter.peak() == saved
    # the same storage held twice is counted once
    t = torch.ones(1000)
    h1, h2 = meter.hold(t), meter.hold(t[:10])
    assert meter.level() == saved + 4000
    del h1
    assert meter.level() == saved + 4000
    del h2
    assert meter.level() == saved
    loss.backward()
    assert meter.level() == 0 and meter.live_bytes() == 0
    assert meter.peak() == saved + 4000
    # a bigger batch saves proportionally more
    x4, y4 = _batch(4)
    meter.start_step()
    with torch.autograd.graph.saved_tensors_hooks(*meter.saved_tensor_hooks()):
        loss = lm_loss(mod(x4), y4)
    assert 1.8 * saved < meter.level() < 2.2 * saved
    del loss
    assert meter.level() == 0  # graph freed without backward
