"""The schedule model: op kinds, ops, placements and schedules. Pure data, no torch.

Vocabulary (docs/algorithms.md#1-the-schedule-model): ``p`` ranks (pipeline devices), ``m`` microbatches,
``v`` chunks per rank. There are ``num_stages`` layer groups ("stages" in PyTorch's
vocabulary); a *chunk* is one layer group placed on one rank, and ``Op.chunk`` is
its index among that rank's layer groups (ascending stage order).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence as _SequenceABC
from dataclasses import dataclass, field
from enum import Enum
from typing import Iterable, Iterator, Sequence

from .errors import ParameterError, require
from .native import c_engine


class OpKind(str, Enum):
    """What an op does. Compute kinds come first; the rest are added by passes."""

    F = "F"  #: forward
    B = "B"  #: backward for the input gradient only
    W = "W"  #: backward for the weight gradient only
    BW = "BW"  #: fused full backward (B + W)
    # Added by the offload pass.
    OFFLOAD_START = "OFFLOAD_START"  #: device→host copy of a chunk's activations begins
    OFFLOAD_END = "OFFLOAD_END"  #: copy done; device memory released
    RELOAD_START = "RELOAD_START"  #: device buffer allocated, host→device copy begins
    RELOAD_END = "RELOAD_END"  #: copy done; activations ready for B
    # Added by the offload pass's stash window, between B and W (``stash=True``): what
    # only W needs (the linear layers' stashed inputs and output gradients).
    STASH_OFFLOAD_START = "STASH_OFFLOAD_START"  #: after B: device→host copy of the W stash begins
    STASH_OFFLOAD_END = "STASH_OFFLOAD_END"  #: copy done; the stash's device memory released
    STASH_RELOAD_START = "STASH_RELOAD_START"  #: device buffer allocated, host→device copy begins
    STASH_RELOAD_END = "STASH_RELOAD_END"  #: copy done; the stash ready for W
    # Added by the communication pass.
    SEND_F = "SEND_F"  #: send a forward activation to the next layer group's rank
    RECV_F = "RECV_F"  #: receive a forward activation from the previous layer group's rank
    SEND_B = "SEND_B"  #: send an input gradient to the previous layer group's rank
    RECV_B = "RECV_B"  #: receive an input gradient from the next layer group's rank

    @property
    def is_compute(self) -> bool:
        return self in _COMPUTE

    @property
    def is_backward(self) -> bool:
        """B or BW: the op that produces the gradient sent to the previous stage."""
        return self is OpKind.B or self is OpKind.BW

    @property
    def is_transfer(self) -> bool:
        return self in _TRANSFER

    @property
    def is_comm(self) -> bool:
        return self in _COMM

    @property
    def window(self) -> str | None:
        """Which offload window a transfer op belongs to: ``"activation"`` (F→B: what B
        needs, OFFLOAD_*/RELOAD_*), ``"stash"`` (B→W: what only W needs, STASH_*); None
        for any other op."""
        return _WINDOW.get(self)

    def __str__(self) -> str:
        return self.value


_COMPUTE = frozenset({OpKind.F, OpKind.B, OpKind.W, OpKind.BW})
_ACTIVATION_TRANSFER = (OpKind.OFFLOAD_START, OpKind.OFFLOAD_END, OpKind.RELOAD_START, OpKind.RELOAD_END)
_STASH_TRANSFER = (OpKind.STASH_OFFLOAD_START, OpKind.STASH_OFFLOAD_END, OpKind.STASH_RELOAD_START,
                   OpKind.STASH_RELOAD_END)
_TRANSFER = frozenset(_ACTIVATION_TRANSFER + _STASH_TRANSFER)
_WINDOW = {**{k: "activation" for k in _ACTIVATION_TRANSFER}, **{k: "stash" for k in _STASH_TRANSFER}}
#: The four transfer kinds of each offload window, in the order they happen.
WINDOW_KINDS: dict[str, tuple[OpKind, OpKind, OpKind, OpKind]] = {
    "activation": _ACTIVATION_TRANSFER, "stash": _STASH_TRANSFER,
}
_COMM = frozenset({OpKind.SEND_F, OpKind.RECV_F, OpKind.SEND_B, OpKind.RECV_B})


@dataclass(frozen=True, slots=True)
class Op:
    """One action of one rank on one (layer group, microbatch).

    ``stage`` is the global layer-group index in ``[0, num_stages)``; ``chunk`` is
    its index on ``rank``; ``peer`` is the other rank of a send or receive.
    """

    kind: OpKind
    stage: int
    microbatch: int
    rank: int
    chunk: int
    peer: int | None = None

    def __str__(self) -> str:
        s = f"{self.kind.value}(stage={self.stage}, mb={self.microbatch}, rank={self.rank})"
        return s if self.peer is None else s[:-1] + f", peer={self.peer})"

    @property
    def key(self) -> tuple[OpKind, int, int]:
        return (self.kind, self.stage, self.microbatch)


@dataclass(frozen=True)
class Placement:
    """Which rank holds each layer group.

    ``kind`` is ``"loop"`` (Megatron interleaved: group ``s`` on rank ``s % p``),
    ``"v"`` (v = 2: rank ``i`` holds ``i`` and ``2p-1-i``) or ``"custom"``.
    """

    kind: str
    stage_to_rank: tuple[int, ...]
    num_ranks: int
    _chunk_of: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _stages_of: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        require(self.num_ranks >= 1, "p", f"need at least 1 rank, got {self.num_ranks}")
        require(len(self.stage_to_rank) >= 1, "placement", "needs at least one layer group")
        stages_of: list[list[int]] = [[] for _ in range(self.num_ranks)]
        for s, r in enumerate(self.stage_to_rank):
            if not (isinstance(r, int) and 0 <= r < self.num_ranks):
                raise ParameterError(
                    "placement",
                    f"layer group {s} is mapped to rank {r!r}; valid ranks are 0..{self.num_ranks - 1}",
                )
            stages_of[r].append(s)
        for r, st in enumerate(stages_of):
            require(bool(st), "placement", f"rank {r} holds no layer group; every rank needs one")
        chunk_of = [0] * len(self.stage_to_rank)
        for st in stages_of:
            for c, s in enumerate(st):
                chunk_of[s] = c
        object.__setattr__(self, "_chunk_of", tuple(chunk_of))
        object.__setattr__(self, "_stages_of", tuple(tuple(st) for st in stages_of))

    @classmethod
    def loop(cls, p: int, v: int = 1) -> "Placement":
        require(p >= 1, "p", f"must be >= 1, got {p}")
        require(v >= 1, "v", f"must be >= 1, got {v}")
        return cls("loop", tuple(s % p for s in range(p * v)), p)

    @classmethod
    def vshape(cls, p: int) -> "Placement":
        require(p >= 1, "p", f"must be >= 1, got {p}")
        return cls("v", tuple(list(range(p)) + list(range(p - 1, -1, -1))), p)

    @classmethod
    def custom(cls, stage_to_rank: Sequence[int], p: int | None = None) -> "Placement":
        mapping = tuple(int(r) for r in stage_to_rank)
        n = p if p is not None else (max(mapping) + 1 if mapping else 0)
        return cls("custom", mapping, n)

    @property
    def num_stages(self) -> int:
        return len(self.stage_to_rank)

    def rank_of(self, stage: int) -> int:
        return self.stage_to_rank[stage]

    def chunk_of(self, stage: int) -> int:
        return self._chunk_of[stage]

    def stages_of(self, rank: int) -> tuple[int, ...]:
        return self._stages_of[rank]

    def chunks_on(self, rank: int) -> int:
        return len(self._stages_of[rank])

    @property
    def max_chunks(self) -> int:
        return max(len(s) for s in self._stages_of)


@dataclass
class Schedule:
    """Per-rank ordered op lists plus the placement they run on.

    A schedule says only the *order* of each rank's ops; timing is the timing
    pass's job (:func:`pipeoffload.passes.timing.simulate`).
    """

    name: str
    num_microbatches: int
    placement: Placement
    ranks: list[list[Op]]
    params: dict = field(default_factory=dict)

    def _get_ranks(self) -> list[list[Op]]:
        if self._ranks is None:
            self._ranks, self._compact = self._compact.op_lists(self.placement), None
        return self._ranks

    def _set_ranks(self, ranks: list[list[Op]]) -> None:
        self._ranks, self._compact = ranks, None

    @property
    def compact(self) -> "CompactOrders | None":
        """The per-rank orders as arrays while the :class:`Op` lists are not made yet
        (:func:`build_schedule`'s schedules until ``ranks`` is first read), else None."""
        return self._compact

    @property
    def num_ranks(self) -> int:
        return self.placement.num_ranks

    @property
    def num_stages(self) -> int:
        return self.placement.num_stages

    @property
    def chunks(self) -> int:
        """The papers' ``v``: chunks (layer groups) per rank, the most on any rank for a
        custom placement. (Not to be confused with the number of chunks the offload pass
        offloads, ``offload_chunks``.)"""
        return self.placement.max_chunks

    def ops(self) -> Iterator[Op]:
        for lst in self.ranks:
            yield from lst

    def compute_only(self) -> "Schedule":
        """A copy without offload and communication ops."""
        if self._compact is not None and self._compact.compute_only():  # shares the arrays
            copy = Schedule(self.name, self.num_microbatches, self.placement, [], dict(self.params))
            copy._ranks, copy._compact = None, self._compact
            return copy
        return Schedule(
            self.name,
            self.num_microbatches,
            self.placement,
            [[o for o in lst if o.kind.is_compute] for lst in self.ranks],
            dict(self.params),
        )

    def with_ranks(self, ranks: list[list[Op]], name: str | None = None) -> "Schedule":
        return Schedule(name or self.name, self.num_microbatches, self.placement, ranks, dict(self.params))


#: Schedule.ranks is a property over ``_ranks`` / ``_compact`` (a dataclass field can not
#: be one in the class body); the generated ``__init__``, ``__eq__``, ``__repr__`` and
#: :func:`dataclasses.replace` go through it, so every caller sees the Op lists.
Schedule._ranks = None
Schedule._compact = None
Schedule.ranks = property(Schedule._get_ranks, Schedule._set_ranks,
                          doc="Per rank, its ops in order (made from the compact orders when first read).")

#: Every OpKind in declaration order: a compact order's kind codes index it (F, B, W, BW
#: first: the compute kinds are codes 0..3).
ALL_KINDS: tuple[OpKind, ...] = tuple(OpKind)
_KIND_CODE = {k: i for i, k in enumerate(ALL_KINDS)}


class CompactOrders:
    """A schedule's per-rank orders held as arrays: per rank, each op's kind code (index
    in :data:`ALL_KINDS`, ``array('b')``), layer group and microbatch (``array('l')``);
    its rank and chunk are the placement's. 3.1 M ops take ~ 53 MB instead of ~ 300 MB of
    :class:`Op` objects, and are made ~ 10× faster.

    Guarantees: :meth:`op_lists` gives exactly the Op lists :func:`build_schedule` made
    before (the same fields); every layer group is in ``[0, num_stages)``."""

    __slots__ = ("kinds", "stages", "mbs")

    def __init__(self, kinds: list[array], stages: list[array], mbs: list[array]) -> None:
        self.kinds, self.stages, self.mbs = kinds, stages, mbs

    @classmethod
    def from_triples(cls, placement: Placement,
                     per_rank: Iterable[Iterable[tuple[OpKind, int, int]]]) -> "CompactOrders | None":
        """The arrays of per-rank ``(kind, stage, microbatch)`` triples, or None when a
        triple is not an OpKind with int layer group in range and int microbatch
        (:func:`build_schedule` then makes the Op lists as ever)."""
        S = placement.num_stages
        loop = getattr(c_engine(), "compact_triples", None)
        if loop is not None and type(per_rank) is list:  # in C where built: the same arrays or None
            got = loop(per_rank, S, OpKind, _KIND_CODE)
            if got is not NotImplemented:
                return None if got is None else cls(*got)
        kinds, stages, mbs = [], [], []
        for lst in per_rank:
            lst = lst if isinstance(lst, (list, tuple)) else list(lst)
            try:  # strict: every triple as long as the others, and three of them: the triples' length
                ks, ss, js = zip(*lst, strict=True) if lst else ((), (), ())
            except ValueError:
                return None
            if not (set(map(type, ks)) <= {OpKind} and set(map(type, ss)) <= {int} and set(map(type, js)) <= {int}):
                return None
            if ss and (min(ss) < 0 or max(ss) >= S):
                return None
            kinds.append(array("b", map(_KIND_CODE.__getitem__, ks)))
            stages.append(array("l", ss))
            mbs.append(array("l", js))
        return cls(kinds, stages, mbs)

    def compute_only(self) -> bool:
        """Whether every op is a compute op (F, B, W or BW)."""
        return all(not k or max(k) < 4 for k in self.kinds)

    def op(self, placement: Placement, rank: int, i: int) -> Op:
        """Rank ``rank``'s ``i``-th op."""
        s = self.stages[rank][i]
        return Op(ALL_KINDS[self.kinds[rank][i]], s, self.mbs[rank][i], placement.stage_to_rank[s],
                  placement._chunk_of[s])

    def rank_ops(self, placement: Placement, rank: int) -> "RankOps":
        """A read-only sequence of rank ``rank``'s ops, each made when read."""
        return RankOps(self, placement, rank)

    def op_lists(self, placement: Placement) -> list[list[Op]]:
        """The Op lists (as :func:`build_schedule` made them)."""
        return [RankOps(self, placement, r).to_list() for r in range(len(self.kinds))]


class RankOps(_SequenceABC):
    """One rank's ops of a :class:`CompactOrders`, each :class:`Op` made when read (equal,
    field for field, to the one ``Schedule.ranks`` makes)."""

    __slots__ = ("orders", "placement", "rank")

    def __init__(self, orders: CompactOrders, placement: Placement, rank: int) -> None:
        self.orders, self.placement, self.rank = orders, placement, rank

    def __len__(self) -> int:
        return len(self.orders.kinds[self.rank])

    def stages(self) -> set[int]:
        """The layer groups of the rank's ops (read from the array, no Op made)."""
        return set(self.orders.stages[self.rank])

    def to_list(self) -> list[Op]:
        """Every op of the rank as a list, made at once: equal, op for op, to reading each
        (what a caller that reads them all wants: one comprehension instead of a call an op)."""
        o, rank_of, chunk_of, r = self.orders, self.placement.stage_to_rank, self.placement._chunk_of, self.rank
        return [Op(ALL_KINDS[k], s, j, rank_of[s], chunk_of[s]) for k, s, j in zip(o.kinds[r], o.stages[r], o.mbs[r])]

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError("rank op index out of range")
        return self.orders.op(self.placement, self.rank, i % n)


#: ``Schedule.params`` key of the overlapped forward/backward pairs (DualPipe's ``F&B``,
#: torch's ``OVERLAP_F_B``): a tuple of ``(F stage, F microbatch, backward stage, backward
#: microbatch)``, the backward being the B or BW of that layer group and microbatch. Kept
#: in ``params`` so that every pass's copy carries it (and reports print it as JSON).
OVERLAP = "overlap_f_b"


def overlap_pairs(schedule: Schedule) -> dict[tuple[int, int], tuple[int, int]]:
    """The overlapped pairs of ``schedule``: ``(stage, mb)`` of the F -> ``(stage, mb)`` of
    the backward that runs with it as one op. Empty for schedules without pairs."""
    return {(fs, fj): (bs, bj) for fs, fj, bs, bj in schedule.params.get(OVERLAP, ())}


def without_overlap(schedule: Schedule) -> Schedule:
    """``schedule`` with its overlapped pairs run as two ops (same order; a copy without
    ``params[OVERLAP]``), or ``schedule`` itself when it has none."""
    if OVERLAP not in schedule.params:
        return schedule
    return Schedule(schedule.name, schedule.num_microbatches, schedule.placement, schedule.ranks,
                    {k: v for k, v in schedule.params.items() if k != OVERLAP})


def make_op(placement: Placement, kind: OpKind, stage: int, microbatch: int) -> Op:
    """Build an op, deriving its rank and chunk from the placement."""
    return Op(kind, stage, microbatch, placement.rank_of(stage), placement.chunk_of(stage))


def compact_schedule(name: str, num_microbatches: int, placement: Placement, compact: CompactOrders,
                     **params: object) -> Schedule:
    """The :class:`Schedule` that holds ``compact`` (its :class:`Op` lists made when ``ranks``
    is first read): :func:`build_schedule` of the triples ``compact`` holds, for a generator
    that writes the arrays itself (group-interleaved)."""
    sched = Schedule(name, num_microbatches, placement, [], dict(params))
    sched._ranks, sched._compact = None, compact
    return sched


def build_schedule(
    name: str,
    num_microbatches: int,
    placement: Placement,
    per_rank: Iterable[Iterable[tuple[OpKind, int, int]]],
    **params: object,
) -> Schedule:
    """Make a :class:`Schedule` from per-rank ``(kind, stage, microbatch)`` triples.

    ``params`` (e.g. p, m, v, g) are recorded for reports. The schedule holds the
    orders as :class:`CompactOrders` and makes its :class:`Op` lists when ``ranks`` is
    first read (the passes read the arrays); triples that are not OpKinds with int
    layer groups in range and int microbatches are made into Ops at once, as before."""
    per_rank = [lst if isinstance(lst, list) else list(lst) for lst in per_rank]
    compact = CompactOrders.from_triples(placement, per_rank)
    if compact is not None:  # the Op lists are made when ``ranks`` is first read
        return compact_schedule(name, num_microbatches, placement, compact, **params)
    # make_op, inlined
    rank_of, chunk_of = placement.stage_to_rank, placement._chunk_of
    ranks = [[Op(k, s, j, rank_of[s], chunk_of[s]) for (k, s, j) in lst] for lst in per_rank]
    return Schedule(name, num_microbatches, placement, ranks, dict(params))
