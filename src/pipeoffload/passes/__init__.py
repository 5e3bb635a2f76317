"""Passes over schedules, and the pipeline that runs them (:func:`lower`). Pure Python.

- ``validate``: the schedule's structural rules (each message cites its rule);
- ``timing``: list scheduling of the compute ops → a :class:`~pipeoffload.timeline.Timeline`
  (also the deadlock proof);
- ``offload``: PipeOffload's selective activation offload (:func:`plan_offload`);
- ``comm``: sends and receives for cross-rank dependencies;
- ``lower``: validate → time → offload → comm, written once.
"""

from .lower import Lowered, lower
from .offload import OffloadOptions, OffloadResult, plan_offload

__all__ = ["Lowered", "lower", "OffloadOptions", "OffloadResult", "plan_offload"]
