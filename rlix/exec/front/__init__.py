"""Executor layer, front end: the rlix-run CLI and Python API, the config, the live console, per-step metrics and run outputs."""
