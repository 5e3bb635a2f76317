"""Studies over many schedules or sizes, built on the simulator (pure Python, no torch).

- ``compare``: every schedule side by side (bubble, peak memory, P2P volume; Pareto set);
- ``scale``: per-device activation memory against the number of stages, with and without
  offload, for a model and hardware.
"""
