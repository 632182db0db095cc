"""rlix: a scheduler that time-shares GPUs between concurrent RL training jobs."""

__version__ = "0.1.0"
