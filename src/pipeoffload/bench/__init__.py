"""The benchmark harness: this project's runtime side by side with
``torch.distributed.pipelining`` (``pipeoffload bench``, docs/bench.md).

- ``side_by_side``: :func:`run_bench`, the same model, data and order through both
  runtimes, alternated step by step;
- ``torch_baseline``: torch's schedules over metered ``PipelineStage`` copies, and
  torch's generated orders imported for our runtime.
"""
