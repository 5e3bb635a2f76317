"""The point-to-point transports (``runtime/transport.py``) on real gloo processes.

Gloo forgives what NCCL does not: a send that waits for a receive issued after it on the
same communicator, a receive posted before the send it depends on, receives matched by
tag. :class:`NcclRulesTransport` emulates NCCL's rules over gloo, so those programs hang
here too and end with a timeout error naming the rank, the op and the rule; the same
exchanges pass with :class:`TorchTransport` on gloo, which is why gloo proves nothing.

Three worlds (spawned gloo ranks, no mocks): a 2-rank world runs the exchanges under
every transport and records each op's outcome (a failed op's ``Work.wait`` raises
RuntimeError: its text is the outcome); a 2-rank world whose hazard is left to fail the
launch; a 4-rank world: a DP x PP mesh whose two pipelines each build their own emulator,
then one communicator per peer on a 3-rank group of it.
"""

from __future__ import annotations

import datetime
import os
import time

import pytest

from helpers import import_torch, run_world

torch = import_torch()

import torch.distributed as dist  # noqa: E402

from pipeoffload.errors import ParameterError  # noqa: E402
from pipeoffload.runtime.launcher import LaunchError, launch  # noqa: E402
from pipeoffload.runtime.transport import (  # noqa: E402
    ENV_VAR, NcclRulesTransport, P2PSpec, TorchTransport, Transport, make_transport,
)

pytestmark = pytest.mark.multiproc

T = 3.0  #: the emulator's timeout where a case hangs (s)
LONG = datetime.timedelta(seconds=30)  #: callers' waits: longer than T, so the emulator speaks first


def _send(me: int, peer: int, t, what: str = "SEND") -> P2PSpec:
    return P2PSpec(True, t, peer, tag=7, what=f"{what}(rank={me}, peer={peer})")


def _recv(me: int, peer: int, t, what: str = "RECV") -> P2PSpec:
    return P2PSpec(False, t, peer, tag=7, what=f"{what}(rank={me}, peer={peer})")


def _outcome(work, timeout=LONG) -> str:
    """"ok" when the op completed; the emulator's text when it failed (wait raised
    RuntimeError); "pending" when the caller's own timeout passed first."""
    try:
        return "ok" if work.wait(timeout) else "pending"
    except RuntimeError as e:
        return str(e)


def _exchange(tr, me: int, peer: int, together: bool):
    """Send this rank's message to ``peer`` and receive the peer's, as one group or as a
    send group then a receive group. Returns (received buffer, [send work, recv work])."""
    out = torch.zeros(4)
    send, recv = _send(me, peer, torch.full((4,), float(me + 1))), _recv(me, peer, out)
    works = tr.issue([send, recv]) if together else tr.issue([send]) + tr.issue([recv])
    return out, works


def _emulator(me: int, peer_mode: bool = False) -> NcclRulesTransport:
    return NcclRulesTransport(None, me, None, T, per_peer=peer_mode)


# ----------------------------------------------------------------------------- the 2-rank world


def _pair_world(ctx, path):
    me, peer = ctx.rank, 1 - ctx.rank
    res: dict = {}

    # make_transport picks by $PIPEOFFLOAD_P2P; `mode` wins over it.
    for env in ("", "torch", "nccl-rules", "nccl-rules-peer"):
        os.environ[ENV_VAR] = env
        tr = make_transport(None, me, None, T)
        res[f"env={env}"] = (type(tr).__name__, tr.name)
        tr.close()
    os.environ[ENV_VAR] = "nccl-rules"
    tr = make_transport(None, me, None, T, mode="torch")
    res["mode wins"] = type(tr).__name__
    del os.environ[ENV_VAR]

    # Gloo forgives: both forms pass with torch's transport.
    for together in (False, True):
        out, works = _exchange(TorchTransport(), me, peer, together)
        res[f"torch together={together}"] = ([_outcome(w) for w in works], out.tolist())

    # NCCL rules, one group: passes, and the works report completion without wait().
    tr = _emulator(me)
    out, works = _exchange(tr, me, peer, together=True)
    deadline = time.monotonic() + 20
    while not all(w.is_completed() for w in works) and time.monotonic() < deadline:
        time.sleep(0.005)
    res["rules together completed"] = [w.is_completed() for w in works]
    res["rules together"] = ([_outcome(w) for w in works], out.tolist())
    # More traffic on the same communicator: several ops per peer in one group, mixed
    # dtypes and sizes (matched by order), a zero-size message, many groups.
    got = []
    for round_ in range(4):
        n = 3 + round_
        a, b, z = torch.arange(n, dtype=torch.int64) * (me + 1), torch.rand(2, n), torch.empty(0)
        ra, rb, rz = torch.empty(n, dtype=torch.int64), torch.empty(2, n), torch.empty(0)
        sends = [_send(me, peer, a), _send(me, peer, b), _send(me, peer, z)]
        recvs = [_recv(me, peer, ra), _recv(me, peer, rb), _recv(me, peer, rz)]
        # Sends before receives or after: inside a group it does not matter (the order
        # among the sends, and among the receives, is what matches them).
        ops = sends + recvs if me == 0 else recvs + sends
        outcomes = [_outcome(w) for w in tr.issue(ops)]
        got.append((outcomes, ra.tolist(), b.tolist(), rb.tolist()))
    res["rules rounds"] = got
    tr.close()

    # The hazard: send then receive as two groups. The send waits for the peer's
    # receive (rule 2), which is queued behind the peer's own send (rule 1): a hang.
    tr = _emulator(me)
    t0 = time.monotonic()  # the timeout runs from when the group starts: right after this issue
    out, (sent, got_) = _exchange(tr, me, peer, together=False)
    early = datetime.timedelta(seconds=0.5)
    res["hazard early"] = (sent.wait(early), got_.wait(early), sent.pending_reason(), got_.pending_reason(),
                           sent.is_completed(), got_.is_completed())
    res["hazard"] = [_outcome(sent), _outcome(got_)]
    res["hazard s"] = time.monotonic() - t0  # was measured after the two early waits + 0.5: 2.5 s nominal
    tr.close()

    # Rule 1: a receive issued before the send it depends on (on both ranks).
    tr = _emulator(me)
    buf = torch.zeros(4)
    got_ = tr.issue([_recv(me, peer, buf)])[0]
    sent = tr.issue([_send(me, peer, torch.ones(4))])[0]
    res["recv first"] = [_outcome(got_), _outcome(sent)]
    tr.close()

    # Rule 3: two messages of different sizes, received in the other order. Gloo matches
    # by tag and delivers; NCCL matches by order: a size mismatch on both ranks.
    small, big = torch.full((4,), 1.0), torch.full((8,), 2.0)
    for name, tr in (("torch", TorchTransport()), ("rules", _emulator(me))):
        if me == 0:
            works = tr.issue([P2PSpec(True, small, 1, tag=1, what="SEND small")])
            works += tr.issue([P2PSpec(True, big, 1, tag=2, what="SEND big")])
            bufs = []
        else:
            bufs = [torch.zeros(8), torch.zeros(4)]
            works = tr.issue([P2PSpec(False, bufs[0], 0, tag=2, what="RECV big")])
            works += tr.issue([P2PSpec(False, bufs[1], 0, tag=1, what="RECV small")])
        res[f"order {name}"] = ([_outcome(w) for w in works], [b.tolist() for b in bufs])
        tr.close()

    # The emulator's traffic never touched the default group: a collective still works.
    x = torch.tensor([float(me + 1)])
    dist.all_reduce(x)
    res["all_reduce"] = x.item()

    everyone = [None, None]
    dist.all_gather_object(everyone, res)
    if me == 0:
        torch.save(everyone, path)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return run_world(_pair_world, 2, tmp_path_factory.mktemp("transport") / "pair.pt")


def test_make_transport_selects_by_environment_and_mode(pair):
    for res in pair:
        assert res["env="] == ("TorchTransport", "torch")
        assert res["env=torch"] == ("TorchTransport", "torch")
        assert res["env=nccl-rules"] == ("NcclRulesTransport", "nccl-rules")
        assert res["env=nccl-rules-peer"] == ("NcclRulesTransport", "nccl-rules-peer")
        assert res["mode wins"] == "TorchTransport"


def test_make_transport_rejects_unknown_values(monkeypatch):
    with pytest.raises(ParameterError) as e:
        make_transport(None, 0, None, 1.0, mode="nccl")
    assert e.value.param == "mode"
    assert all(m in e.value.message for m in ("'nccl'", "torch", "nccl-rules", "nccl-rules-peer"))
    monkeypatch.setenv(ENV_VAR, "gloo-please")
    with pytest.raises(ParameterError) as e:
        make_transport(None, 0, None, 1.0)
    assert e.value.param == ENV_VAR and "gloo-please" in e.value.message and "nccl-rules-peer" in e.value.message
    monkeypatch.setenv(ENV_VAR, "torch")
    assert isinstance(make_transport(None, 0, None, 1.0), TorchTransport)


def test_gloo_forgives_both_forms(pair):
    for me, res in enumerate(pair):
        peer_value = [float(2 - me)] * 4
        assert res["torch together=False"] == (["ok", "ok"], peer_value)
        assert res["torch together=True"] == (["ok", "ok"], peer_value)


def test_rules_pass_when_send_and_receive_are_one_group(pair):
    for me, res in enumerate(pair):
        assert res["rules together"] == (["ok", "ok"], [float(2 - me)] * 4)
        assert res["rules together completed"] == [True, True]  # is_completed() without wait()
        for r, (outcomes, ra, b, rb) in enumerate(res["rules rounds"]):
            assert outcomes == ["ok"] * 6
            assert ra == [i * (2 - me) for i in range(3 + r)]
            assert rb == pair[1 - me]["rules rounds"][r][2]  # the peer's random payload
    assert pair[0]["all_reduce"] == 3.0


def test_rules_catch_send_then_receive_as_separate_groups(pair):
    for me, res in enumerate(pair):
        sent_ok, got_ok, sent_why, got_why, sent_done, got_done = res["hazard early"]
        # Still hanging after 0.5 s: the caller's wait says so (False), no completion.
        assert (sent_ok, got_ok, sent_done, got_done) == (False, False, False, False)
        assert "rule 2" in sent_why and f"rank {1 - me}'s matching receive" in sent_why
        assert "queued" in got_why and "rule 1" in got_why and f"SEND(rank={me}" in got_why
        sent, got = res["hazard"]
        assert sent.startswith(f"rank {me}: timed out after 3 s"), sent
        assert f"SEND(rank={me}, peer={1 - me})" in sent and f"rank {1 - me}'s matching receive" in sent
        assert "rule 2" in sent
        assert f"RECV(rank={me}, peer={1 - me})" in got and "never started" in got and "rule 1" in got
        assert T - 0.5 < res["hazard s"] < T + 10


def test_rules_catch_receive_issued_before_its_send(pair):
    for me, res in enumerate(pair):
        got, sent = res["recv first"]
        assert got.startswith(f"rank {me}: timed out after 3 s"), got
        assert f"RECV(rank={me}, peer={1 - me})" in got and f"rank {1 - me}'s matching send" in got
        assert f"SEND(rank={me}, peer={1 - me})" in sent and "never started" in sent and "rule 1" in sent


def test_rules_match_by_order_not_tag(pair):
    outcomes, bufs = pair[1]["order torch"]
    assert outcomes == ["ok", "ok"] and bufs == [[2.0] * 8, [1.0] * 4]  # gloo: matched by tag
    assert pair[0]["order torch"][0] == ["ok", "ok"]
    first, second = pair[0]["order rules"][0]
    assert first.startswith("rank 0: SEND small: size mismatch: this send has 16 bytes") and "32 bytes" in first
    assert "rule 3" in first and "never started" in second and "rule 1" in second
    first, second = pair[1]["order rules"][0]
    assert first.startswith("rank 1: RECV big: size mismatch: this receive expects 32 bytes") and "16 bytes" in first
    assert "rule 3" in first and "never started" in second
    assert "timed out" not in first  # P2P turns this into a CommError, not a CommTimeout


# ----------------------------------------------------------------------------- the hazard fails the launch


def _hazard_world(ctx, mode):
    """Each rank sends then receives as two groups and waits for both: under NCCL rules
    the wait raises, and so the launch fails."""
    me, peer = ctx.rank, 1 - ctx.rank
    tr = make_transport(None, me, None, T, mode=mode)
    out, works = _exchange(tr, me, peer, together=False)
    for w in works:
        if not w.wait(LONG):
            raise TimeoutError(f"rank {me}: the caller's wait timed out")
    assert out.tolist() == [float(peer + 1)] * 4
    tr.close()


def test_hazard_ends_the_run_with_a_named_timeout():
    # (With mode "torch" the same function passes: test_gloo_forgives_both_forms.)
    t0 = time.monotonic()
    with pytest.raises(LaunchError) as e:
        launch(_hazard_world, 2, ("nccl-rules",), backend="gloo", init_timeout_s=120)
    took = time.monotonic() - t0
    r = e.value.rank
    text = str(e.value)
    assert f"rank {r}: timed out after 3 s" in text, text
    assert f"SEND(rank={r}, peer={1 - r})" in text and f"rank {1 - r}'s matching receive" in text, text
    assert took < 30, took


# ----------------------------------------------------------------------------- one communicator per peer


def _chain(ctx, mode, res, group):
    """On the three ranks of ``group`` (global ranks 0, 1, 2): rank 0 posts a receive from
    rank 1, then sends to rank 2 (two groups); rank 2 forwards what it got to rank 1, which
    forwards it to rank 0. Rank 0's send must go out while its receive from rank 1 is pending."""
    me = ctx.rank
    tr = make_transport(group, me, None, T, mode=mode)
    steps: list = []
    if me == 0:
        buf = torch.zeros(3)
        got = tr.issue([_recv(0, 1, buf)])[0]
        sent = tr.issue([_send(0, 2, torch.full((3,), 1.0))])[0]
        steps.append(_outcome(sent))
        steps.append(not got.is_completed())  # the receive was pending while the send went out
        steps.append(_outcome(got))
        steps.append(buf.tolist())
    else:
        src, dst = {1: (2, 0), 2: (0, 1)}[me]
        buf = torch.zeros(3)
        steps.append(_outcome(tr.issue([_recv(me, src, buf)])[0]))
        if steps[-1] == "ok":
            steps.append(_outcome(tr.issue([_send(me, dst, buf + 1)])[0]))
    res[mode] = steps
    tr.close()


def test_one_communicator_per_peer(four):
    ranks = [res["peer"] for res in four[:3]]
    assert ranks[0]["nccl-rules-peer"] == ["ok", True, "ok", [3.0] * 3]
    assert ranks[1]["nccl-rules-peer"] == ["ok", "ok"] and ranks[2]["nccl-rules-peer"] == ["ok", "ok"]
    # One communicator for the group: rank 0's send is queued behind its receive, which
    # waits (through ranks 2 and 1) for that send: every rank times out, naming it.
    sent = ranks[0]["nccl-rules"][0]
    assert "SEND(rank=0, peer=2)" in sent and "never started" in sent and "rule 1" in sent, sent
    assert "RECV(rank=0, peer=1)" in sent and "rank 1's matching send" in sent
    assert ranks[2]["nccl-rules"][0].startswith("rank 2: timed out after 3 s")
    assert "RECV(rank=2, peer=0)" in ranks[2]["nccl-rules"][0]
    assert ranks[1]["nccl-rules"][0].startswith("rank 1: timed out after 3 s")


# ----------------------------------------------------------------------------- a DP x PP mesh


def _four_world(ctx, path):
    """A 4-rank world: the DP x PP mesh's pipelines (:func:`_mesh_part`), then the chain
    (:func:`_chain`) on a 3-rank group of it, one communicator per peer and one for the group
    (rank 3 takes no part). One launch for both."""
    res = {"mesh": _mesh_part(ctx)}
    group = dist.new_group([0, 1, 2])  # every rank creates it
    if ctx.rank < 3:
        res["peer"] = {}
        _chain(ctx, "nccl-rules-peer", res["peer"], group)
        _chain(ctx, "nccl-rules", res["peer"], group)
    everyone = [None] * 4
    dist.all_gather_object(everyone, res)
    if ctx.rank == 0:
        torch.save(everyone, path)


@pytest.fixture(scope="module")
def four(tmp_path_factory):
    return run_world(_four_world, 4, tmp_path_factory.mktemp("transport") / "four.pt")


def _mesh_part(ctx) -> dict:
    """Two pipelines (global ranks [0, 1] and [2, 3]) each build their emulator over their
    own members only; pipeline [2, 3] builds one more before it, which [0, 1] does not."""
    from pipeoffload.runtime.mesh import build_mesh, coords, pipeline_ranks, sub_group

    mesh = build_mesh(pp=2, dp=2)
    group = sub_group(mesh, "pp")
    ranks = pipeline_ranks(group, mesh)
    me = coords(mesh)["pp"]
    peer = ranks[1 - me]
    if ranks[0] == 2:
        NcclRulesTransport(group, me, ranks, T).close()
    tr = NcclRulesTransport(group, me, ranks, T)
    out = torch.zeros(2)
    works = tr.issue([P2PSpec(True, torch.full((2,), float(ctx.rank)), peer, what=f"SEND(rank={me})"),
                      P2PSpec(False, out, peer, what=f"RECV(rank={me})")])
    res = {"global": ctx.rank, "ranks": ranks, "exchange": [_outcome(w) for w in works], "got": out.tolist()}
    # A mismatch names pipeline ranks, with their global ranks.
    n = 2 if me == 0 else 3
    w = tr.issue([P2PSpec(me == 0, torch.zeros(n), peer, what=f"{'SEND' if me == 0 else 'RECV'}(rank={me})")])[0]
    res["mismatch"] = _outcome(w)
    tr.close()
    return res


def test_pipelines_of_a_mesh_each_build_their_own(four):
    ranks = [res["mesh"] for res in four]
    for res in ranks:
        g = res["global"]
        peer = g ^ 1
        assert res["ranks"] == [g & ~1, g | 1]
        assert res["exchange"] == ["ok", "ok"] and res["got"] == [float(peer)] * 2
    assert ranks[3]["mismatch"].startswith("rank 1 (global 3): RECV(rank=1): size mismatch: this receive expects "
                                           "12 bytes but the send of rank 0 (global 2) it matches has 8 bytes")
    assert ranks[1]["mismatch"].startswith("rank 1: RECV(rank=1): size mismatch")


class _ClosedPairs(Transport):
    """A transport whose issue fails as gloo's does once a peer's process has died (its
    pair's connection closed), or with ``text``."""

    def __init__(self, text: str) -> None:
        self.text = text

    def issue(self, ops):
        raise RuntimeError(self.text)


GLOO_CLOSED = ("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
               "[127.0.0.1]:49575. This is typically caused by a remote worker crashing.")


def test_a_peer_found_dead_when_issuing_is_named_as_at_a_wait():
    # CI saw it: under torchrun a survivor's next group met the dead peer's closed pair at issue,
    # and the report said "could not issue" without naming the lost rank.
    from pipeoffload.runtime.p2p import P2P, CommError

    p2p = P2P(0, 5.0, torch.device("cpu"), transport=_ClosedPairs(GLOO_CLOSED))
    buf = torch.zeros(2)
    with pytest.raises(CommError, match=r"rank 0: lost rank 1 issuing the group of RECV grad") as e:
        p2p.issue([(False, buf, 1, 0, "RECV grad"), (True, buf, 1, 1, "SEND act")])
    assert e.value.lost_peer == 1
    # A group with two peers: gloo names an address, not a rank, so both are named and none is blamed.
    with pytest.raises(CommError, match=r"lost one of ranks 1, 2 issuing") as e:
        p2p.issue([(False, buf, 1, 0, "RECV grad"), (True, buf, 2, 1, "SEND act")])
    assert e.value.lost_peer is None
    # Any other failure to issue is not a lost peer.
    p2p = P2P(0, 5.0, torch.device("cpu"), transport=_ClosedPairs("Bad address"))
    with pytest.raises(CommError, match=r"could not issue the group of RECV grad \(Bad address\)") as e:
        p2p.issue([(False, buf, 1, 0, "RECV grad")])
    assert e.value.lost_peer is None
