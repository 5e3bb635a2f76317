"""pipeoffload: memory-efficient pipeline parallelism (PipeOffload, zero-bubble and
controllable-memory schedules), a simulator and planner, and a torch.distributed runtime.

Pure parts (schedules, passes, simulator, planner, drawing) never import torch.
"""

__version__ = "0.1.0"

from .errors import ParameterError, PipeoffloadError, ScheduleError  # noqa: F401
