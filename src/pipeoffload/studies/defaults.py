"""The offload settings the studies (compare, best, scale) plan with, defined once. Pure Python.

Every study offloads through the offload pass with one
:class:`~pipeoffload.passes.offload.OffloadOptions` built from :data:`STUDY_OFFLOAD`: "skip"
mode (an offload whose reload cannot finish before its backward is dropped, so a study never
fails on a busy host link), warm-up forwards postponed, and the pass's own host-link defaults
(two ranks per link, solo factor 0.7). The command line's defaults for these studies are read
from here too.
"""

from __future__ import annotations

from dataclasses import replace

from ..passes.offload import OffloadOptions

__all__ = ["STUDY_OFFLOAD", "COMPARE_OFFLOAD_TIME", "BEST_OFFLOAD", "study_offload"]

#: What every study's offload shares (chunks, transfer time and window set per row).
STUDY_OFFLOAD = OffloadOptions(on_infeasible="skip", postpone_warmup=True)

#: ``compare``'s one-way transfer: 0.5 × the chunk's F+B+W, i.e. k = 1, the largest offload ratio
#: the paper says hides fully (the other studies default to free transfers, as the pass does).
COMPARE_OFFLOAD_TIME = 0.5

#: ``best`` plans each setting with and without postponed warm-ups and keeps the better plan
#: (the pass's ``postpone_warmup=None``), as it always has.
BEST_OFFLOAD = replace(STUDY_OFFLOAD, postpone_warmup=None)


def study_offload(base: OffloadOptions = STUDY_OFFLOAD, **settings: object) -> OffloadOptions:
    """``base`` with ``settings`` (OffloadOptions field names) changed."""
    return replace(base, **settings)  # type: ignore[arg-type]
