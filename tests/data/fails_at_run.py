"""A reward function that passes the config check and the dry run, and fails on the model's completions."""


def flaky(completions, prompts, answer, **kwargs):
    """Knows only an empty completion or one that repeats its prompt (what the dry run tries); any other raises."""
    known = {"": 0.0, **{p: 0.0 for p in prompts}}
    print(f"flaky: {len(completions)} completions")
    return [known[c] for c in completions]
