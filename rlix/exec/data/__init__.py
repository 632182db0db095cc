"""Executor layer, job data: prompts from files, reward functions, built-in tasks, the recipe, and tiny models made in code."""
