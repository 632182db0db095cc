"""Executor layer: runs real RL jobs on Ray, sharing GPUs through :mod:`rlix.core`.

Importing this package is cheap: it pulls in neither Ray nor torch nor vLLM.
The public entry points are the CLI (``rlix-run``) and :mod:`rlix.exec.front.api`
(``init``, ``register``, ``admit``, ``run``, ``kill``).
"""
