"""Executor layer: one pipeline's coordinator, the step runner that drives the step machine, and what a pipeline records."""
