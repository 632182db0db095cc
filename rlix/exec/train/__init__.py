"""Executor layer, training.

GRPO and multi-LoRA learners, FSDP2 ranks, the trainer gang and its link, weight snapshots, checkpoints.
"""
