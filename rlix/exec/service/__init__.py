"""Executor layer: the shared scheduler service (one per Ray cluster) and its tools (``rlix``)."""
