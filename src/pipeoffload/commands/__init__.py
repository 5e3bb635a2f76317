"""One module per CLI verb; see :mod:`pipeoffload.cli`."""
