"""Executor layer, control plane: the cluster's scheduler actor, one pipeline's calls to it, worker placement and call deadlines."""
