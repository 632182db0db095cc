"""A reward function that passes the config check and fails when called (a run-time failure)."""


def flaky(completions, answer, **kwargs):
    raise KeyError("the verifier crashed")
