"""A reward file that ends the process as it is imported (a script's habit)."""

import sys

sys.exit(1)


def fn(completions, **kwargs):
    return [0.0] * len(completions)
