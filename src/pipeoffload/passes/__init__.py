"""Passes over schedules: validate, timing, offload, comm. Pure Python."""
