"""Our runtime side by side with torch.distributed.pipelining (docs/bench.md).

Thin wrapper over ``pipeoffload bench`` (see ``pipeoffload bench --help``): every
schedule both runtimes offer at p = 2 and p = 4, alternating the two runtimes step by
step on the same model, data and microbatches. Extra arguments are passed through.

    python benchmarks/bench_vs_torch.py --pairs 7 -o runs/bench
"""

from __future__ import annotations

import sys

from pipeoffload.cli import main

if __name__ == "__main__":  # the ranks are spawned: the guard keeps them from re-running this
    sys.exit(main(["bench", *sys.argv[1:]]))
