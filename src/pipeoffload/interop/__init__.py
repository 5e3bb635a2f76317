"""Interoperability with other pipeline-parallel tools.

:mod:`.torch_csv` speaks PyTorch ``torch.distributed.pipelining``'s action strings and
schedule CSV without importing torch; :mod:`.torch_actions` converts to and from torch's
in-memory ``_Action`` lists (imports torch when called).
"""

from .torch_csv import action_string, from_actions, parse_action, read_csv, to_actions, write_csv

__all__ = ["action_string", "parse_action", "to_actions", "write_csv", "from_actions", "read_csv"]
