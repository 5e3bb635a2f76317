"""What the verbs share: argument groups (schedule, costs, memory, offload), the
command line's names for library parameters, list parsing, output files, JSON."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

from ..costs import Costs, MemoryDeltas, load_rank_costs, parse_costs, parse_memory
from ..errors import ParameterError, PipeoffloadError, rename_mentions

# --- library parameter names -> command-line flags -------------------------------------

#: The flag that sets each library parameter, by the name the library's errors use
#: (:class:`~pipeoffload.errors.ParameterError`'s ``param`` and the parameters its
#: message names in backquotes). A name without an entry is printed as it is.
CLI_FLAGS: dict[str, str] = {
    # schedules (pipeoffload.schedules.ScheduleSpec), the papers' letters
    "p": "-p", "m": "-m", "v": "-v", "g": "-g", "p/v": "-p/-v", "mem_limit": "--mem-limit",
    # costs and memory deltas (pipeoffload.costs)
    "costs": "--costs", "rank_costs": "--rank-costs", "stage_costs": "--rank-costs", "group_costs": "--rank-costs",
    "memory": "--memory",
    # the offload pass (pipeoffload.passes.offload)
    "offload_chunks": "--offload-chunks", "offload_time": "--offload-time", "link_group": "--link-group",
    "solo_factor": "--solo-factor", "tolerance": "--offload-tolerance", "on_infeasible": "--offload-infeasible",
    "postpone_warmup": "--postpone-warmup", "transfer_times": "--transfer-times", "stash": "--offload-stash",
    # the exact scheduler and the best-schedule search (pipeoffload.solver, pipeoffload.studies.best)
    "time_limit": "--time-limit", "placement": "--placement", "max_v": "--max-v",
    # the cost model and the planner (pipeoffload.costmodel, pipeoffload.planner)
    "model": "--model", "hardware": "--hardware", "trim_edges": "--trim-edges", "gpus": "--gpus",
    "memory_budget": "--memory-budget", "global_batch": "--global-batch", "seq": "--seq",
    "microbatch": "--microbatch-size", "schedules": "--schedules", "chunks": "--chunks",
    "recompute": "--recompute", "top": "--top", "tp_bw": "--tp-link-gbs", "hbm_bw": "--hbm-gbs",
    "peak_rate": "--peak-tflops",
    # studies (compare, scale) and the benchmark
    "stages": "--ranks", "ranks": "--ranks", "world_size": "--ranks", "series": "--series", "pairs": "--pairs",
    "warmup": "--warmup",
    "microbatch_size": "--microbatch-size", "microbatches": "--microbatches",
    # schedule files (pipeoffload.interop.torch_csv)
    "path": "--from-csv",
    # `pipeoffload train`'s configuration (pipeoffload.training.config): the keys its flags set
    # where the message has always named the flag
    "config": "--config", "training.steps": "--steps", "training.corpus": "--corpus",
    "training.on_nonfinite": "--on-nonfinite", "runtime.timeout_s": "--timeout", "runtime.threads": "--threads",
    "offload.offload_chunks": "--offload", "offload.offload_time": "--offload-time",
    "offload.chunks": "--offload", "offload.time": "--offload-time", "checkpoint.dir": "--checkpoint-dir",
    "checkpoint.every": "--checkpoint-every", "checkpoint.keep": "--checkpoint-keep",
    "checkpoint.resume": "--resume",
    "pp": "--ranks", "dp": "--dp", "tp": "--tp",  # runtime.mesh.build_mesh's own arguments
    "parallel.dp": "--dp", "parallel.tp": "--tp", "parallel.fsdp": "--fsdp",
    "parallel.sequence_parallel": "--sequence-parallel", "parallel.world_size": "--ranks x --dp x --tp",
    "emit_config": "--emit-config",
}


def cli_message(error: PipeoffloadError) -> str:
    """An error as the command line prints it: parameters named by their flags."""
    if isinstance(error, ParameterError):
        return error.render(CLI_FLAGS)
    return str(error)


def cli_text(text: str) -> str:
    """An error kept as text, ``"param: message"`` or ``"reason: param: message"`` (a refused
    schedule in ``compare``, a refused point in ``scale``), with its parameters named by
    their flags."""
    parts = text.split(": ", 2)
    for i, part in enumerate(parts[:-1][:2]):
        if part in CLI_FLAGS:
            parts[i] = CLI_FLAGS[part]
            break
    return rename_mentions(": ".join(parts), CLI_FLAGS)


# --- lists on the command line ---------------------------------------------------------


def name_list(text: str) -> tuple[str, ...]:
    """``"a, b,,c"`` -> ``("a", "b", "c")``."""
    return tuple(x.strip() for x in text.split(",") if x.strip())


def int_list(text: str, flag: str, *, required: bool = False) -> tuple[int, ...]:
    """``"2,4,8"`` -> ``(2, 4, 8)``; ParameterError naming ``flag`` for anything else
    (and for no value at all when ``required``)."""
    try:
        values = tuple(int(x) for x in name_list(text))
    except ValueError:
        raise ParameterError(flag, f"expected comma-separated integers, got {text!r}") from None
    if required and not values:
        raise ParameterError(flag, "needs at least one value")
    return values


# --- output files ----------------------------------------------------------------------


def check_output(flag: str, path: str | os.PathLike | None, directory: bool = False) -> None:
    """Fail before any work when ``path`` (given with ``flag``) clearly cannot be written:
    a directory where a file goes (or the reverse), or a parent that is not a writable
    directory. Creates nothing; what only writing can tell is left to :func:`write_output`."""
    if path is None:
        return
    target = Path(path)
    if target.exists():
        if target.is_dir() != directory:
            raise ParameterError(flag, f"cannot write {path}: {'not a' if directory else 'is a'} directory")
        return
    parent = target.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ParameterError(flag, f"cannot write {path}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ParameterError(flag, f"cannot write {path}: permission denied in {parent}")


def write_output(flag: str, path: str, write: Callable[[str], Any]) -> None:
    """``write(path)``, with a failure to write (a missing or read-only folder, a
    directory in the way) turned into a ParameterError naming ``flag`` and ``path``."""
    try:
        write(path)
    except OSError as e:
        where = f" ({e.filename})" if e.filename and str(e.filename) != str(path) else ""
        raise ParameterError(flag, f"cannot write {path}: {e.strerror or e}{where}") from None
    except ParameterError as e:  # a writer that reports its own failure to write
        raise ParameterError(flag, e.message if e.message.startswith("cannot write") else
                             f"cannot write {path}: {e.message}") from None


def add_html_arg(parser: argparse.ArgumentParser, what: str) -> None:
    """``--html FILE``: the interactive explorer of ``what`` (:mod:`pipeoffload.viz.html`),
    one self-contained file that needs no network."""
    parser.add_argument("--html", metavar="FILE",
                        help=f"write {what} as one self-contained interactive HTML page (hover, zoom, hide ranks; "
                             "works offline)")


def output_dir(flag: str, path: str) -> None:
    """Create the output folder ``path`` (given with ``flag``) now, before processes start,
    or fail naming the flag and the path."""
    write_output(flag, path, lambda p: Path(p).mkdir(parents=True, exist_ok=True))


def print_json(obj: Any) -> None:
    try:
        json.dump(obj, sys.stdout, indent=2)
        sys.stdout.write("\n")
        sys.stdout.flush()
    except BrokenPipeError:  # e.g. `| head`: not an error of ours
        sys.stdout = None  # type: ignore[assignment]


# --- schedule, costs and memory arguments -----------------------------------------------


def add_costs_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--costs", default="F=1,B=1,W=1,comm=0", metavar="F=..,B=..,W=..,comm=..",
                        help="op durations per rank (all its chunks) and comm latency per hop (default: unit costs)")
    parser.add_argument("--rank-costs", metavar="FILE",
                        help="JSON: a list of {F,B,W} per rank, or {'layer_groups': [...]} per layer group (stage)")
    parser.add_argument("--stage-costs", dest="rank_costs", default=argparse.SUPPRESS, action=_DeprecatedAlias,
                        new="--rank-costs", help=argparse.SUPPRESS)
    parser.add_argument("--memory", default="F=1,B=0,W=-1", metavar="F=..,B=..,W=..",
                        help="activation memory change per op kind per rank (units or bytes; "
                             "default F=1,B=0,W=-1)")


class _DeprecatedAlias(argparse.Action):
    """A flag's old spelling: stores like the new one and says once, on stderr, to use it."""

    def __init__(self, option_strings: list[str], dest: str, new: str = "", **kwargs: Any) -> None:
        self.new = new
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(f"pipeoffload: warning: {option_string} is deprecated and will be removed; use {self.new}",
              file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_ranks_arg(parser: Any, *, dest: str = "p", default: Any = 4, type: Any = int, metavar: str | None = None,
                  help: str = "pipeline ranks p (default 4)") -> None:
    """``-p/--ranks``: the number of pipeline ranks (docs/glossary.md); ``--stages``, its
    old spelling, still works with a warning (hidden from --help)."""
    parser.add_argument("-p", "--ranks", dest=dest, type=type, default=default, metavar=metavar, help=help)
    parser.add_argument("--stages", dest=dest, type=type, default=argparse.SUPPRESS, action=_DeprecatedAlias,
                        new="--ranks (-p)", help=argparse.SUPPRESS)


def add_schedule_args(parser: argparse.ArgumentParser, positional: bool = True) -> None:
    """-p, -m, -v, -g: the papers' p (ranks), m (microbatches), v (chunks per rank) and
    g (group size of group-interleaved)."""
    if positional:
        parser.add_argument("schedule", help="schedule name (see `pipeoffload schedules`)")
    add_ranks_arg(parser)
    parser.add_argument("-m", "--microbatches", dest="m", type=int, default=8, help="microbatches (default 8)")
    parser.add_argument("-v", "--chunks", dest="v", type=int, default=None, help="chunks per rank (schedule default)")
    parser.add_argument("-g", "--group", dest="g", type=int, default=None,
                        help="group size for group-interleaved, ceil(p/2)..p (default ceil(p/2))")
    parser.add_argument("--mem-limit", type=float, default=None,
                        help="memory limit for zb-auto, in the units of --memory (default p units)")


def costs_from_args(args: argparse.Namespace) -> Costs:
    per_rank = load_rank_costs(args.rank_costs) if getattr(args, "rank_costs", None) else None
    return parse_costs(args.costs, per_rank)


def memory_from_args(args: argparse.Namespace) -> MemoryDeltas:
    return parse_memory(args.memory)


def memory_unit(args: argparse.Namespace) -> str:
    m = memory_from_args(args)
    return "units" if (m.F, m.B, m.W) == (1.0, 0.0, -1.0) else "memory"


# --- activation offload (PipeOffload) -------------------------------------------------


def add_offload_args(parser: argparse.ArgumentParser) -> None:
    """Flags that turn on and tune the offload pass (docs/algorithms.md#63-the-offload-pass)."""
    group = parser.add_argument_group("activation offload (PipeOffload)")
    group.add_argument("--offload-chunks", type=int, default=None, metavar="C",
                       help="offload chunks 0..C-1 of every rank (earliest, longest-lived first)")
    group.add_argument("--offload", choices=["auto", "none"], default=None,
                       help="auto: choose C for the lowest peak within --offload-tolerance of the makespan")
    from ..passes.offload import OffloadOptions  # the flags' defaults are the pass's

    d = OffloadOptions()
    group.add_argument("--offload-time", type=float, default=d.offload_time, metavar="X",
                       help="one one-way transfer of a chunk's activations for one microbatch, as a multiple of "
                            "that chunk's F+B+W time (the reference's offload_time = k/2; default 0 = instantaneous)")
    group.add_argument("--offload-tolerance", type=float, default=d.tolerance, metavar="FRAC",
                       help="with --offload auto: allowed makespan increase (default 0.01 = 1%%)")
    group.add_argument("--link-group", type=int, default=d.link_group, metavar="N",
                       help="ranks sharing one host link (default 2: ranks 2r and 2r+1)")
    group.add_argument("--solo-factor", type=float, default=d.solo_factor, metavar="F",
                       help="transfer time multiplier while the link's other direction is idle (default 0.7)")
    group.add_argument("--offload-infeasible", choices=["error", "skip", "delay"], default=None,
                       help="when a reload cannot finish before its backward: error (default with -C), "
                            "skip that offload (default with auto), or delay the backward")
    group.add_argument("--postpone-warmup", dest="postpone_warmup", action="store_true", default=None,
                       help="start warm-up forwards as late as their consumers allow (shorter lifespans); "
                            "default: plan with and without and keep the better plan")
    group.add_argument("--no-postpone-warmup", dest="postpone_warmup", action="store_false",
                       help="never postpone warm-up forwards")
    group.add_argument("--offload-stash", action="store_true",
                       help="also offload, between each B and its W, what only W needs (the stash window, "
                            "B->W; the runtime moves the weight-gradient stash to host and back)")


def offload_requested(args: argparse.Namespace) -> bool:
    """True when the command line asks for the offload pass."""
    if getattr(args, "offload", None) == "auto":
        return True
    return getattr(args, "offload_chunks", None) is not None


def offload_options(args: argparse.Namespace) -> Any:
    """The offload flags as one :class:`~pipeoffload.passes.offload.OffloadOptions` (for
    :func:`~pipeoffload.passes.offload.plan_offload`'s ``options``; ``comm`` is not a setting).

    Raises ParameterError for flags that need offload turned on or contradict each other."""
    from ..passes.offload import OffloadOptions

    auto = getattr(args, "offload", None) == "auto"
    if getattr(args, "offload", None) == "none" and args.offload_chunks is not None:
        raise ParameterError("--offload", "'none' contradicts --offload-chunks")
    if not offload_requested(args):
        for flag, attr, default in (("--offload-time", "offload_time", OffloadOptions.offload_time),
                                    ("--offload-infeasible", "offload_infeasible", None),
                                    ("--postpone-warmup", "postpone_warmup", None),
                                    ("--offload-stash", "offload_stash", False)):
            if getattr(args, attr, default) != default:
                raise ParameterError(flag, "needs --offload-chunks C or --offload auto")
    return OffloadOptions(
        offload_chunks=args.offload_chunks,
        auto=auto,
        offload_time=args.offload_time,
        link_group=args.link_group,
        solo_factor=args.solo_factor,
        tolerance=args.offload_tolerance,
        on_infeasible=args.offload_infeasible,
        postpone_warmup=args.postpone_warmup,
        stash=getattr(args, "offload_stash", False),
    )


#: Why the offload pass skipped a candidate (``OffloadResult.skipped``), and what would help.
_SKIP_REASONS = {
    "short_lifespan": ("the backward needs the activation before a round trip to the host could end",
                       "a shorter transfer ({time})"),
    "no_memory": ("the chunk's forward keeps no activation memory",
                  "offloading more chunks (--offload-chunks) whose forwards keep memory"),
    "link_busy": ("the reload could not finish on the busy host link before its backward",
                  "a shorter transfer ({time}), --postpone-warmup (spreads the warm-up's offloads) or "
                  "--offload-infeasible delay (backwards wait for their reloads)"),
}


def offload_warning(off: Any, tolerance_flag: str | None = "--offload-tolerance") -> str | None:
    """One line saying why an offload request placed no transfer at all and what would
    help; None when it placed some, or when C = 0 was asked for. ``off`` is an
    :class:`~pipeoffload.passes.offload.OffloadResult`."""
    if off.transfers:
        return None
    settings = off.settings
    time = "--offload-time" if settings.get("offload_time") is not None else "a faster host link, --hardware"
    if off.offloaded_chunks == 0:
        if not settings.get("auto"):
            return None
        advice = f"a shorter transfer ({time})" + (f" or a larger {tolerance_flag}" if tolerance_flag else "")
        return (f"--offload auto placed no transfer: offloading any chunk lowers no peak within a makespan "
                f"increase of {settings.get('tolerance', 0.01):g}; {advice} would help")
    which = "chunk 0" if off.offloaded_chunks == 1 else f"chunks 0..{off.offloaded_chunks - 1}"
    known = {reason: _SKIP_REASONS.get(reason, ("", "")) for reason in off.skipped}
    why = ", ".join(f"{n} {reason}" + (f" ({known[reason][0]})" if known[reason][0] else "")
                    for reason, n in off.skipped.items())
    helps = " or ".join(h.format(time=time) for _, h in known.values() if h)
    return (f"offloading {which} of every rank placed no transfer: all {sum(off.skipped.values())} candidates "
            f"skipped: {why or 'none'}" + (f"; {helps} would help" if helps else ""))
