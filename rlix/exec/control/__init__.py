"""Executor layer, control plane.

The cluster's scheduler actor, one pipeline's calls to it, worker placement and call deadlines.
"""
