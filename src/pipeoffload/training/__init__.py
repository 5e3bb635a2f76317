"""The training application built on the runtime: the job behind ``pipeoffload train``.

- ``config``: :class:`TrainConfig` dataclasses (pure, no torch);
- ``job``: :func:`run_training` / :class:`Trainer`, the steps of a run;
- ``report``: the run's output folder, pictures, traces and printed report;
- ``checkpoint``: atomic per-rank checkpoints with a verified manifest, resume;
- ``faults``: fault injection (kill, hang, raise, NaN) for reliability tests;
- ``measure``: measured against predicted timelines.

The engine these drive is :mod:`pipeoffload.runtime`. Importing this package imports no
torch (``pipeoffload.training.config`` works without it).
"""
