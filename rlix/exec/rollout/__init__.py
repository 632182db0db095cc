"""Executor layer, rollout.

The worker pool and its lifecycle, expand/shrink and dispatch, the rollout queue, and the engines (torch, vLLM).
"""
