import compileall
import importlib.util
import os
import sys
from pathlib import Path

import pytest
from hypothesis import settings

# Property tests draw the same examples on every run (a red CI is then reproducible, never a
# coin flip); HYPOTHESIS_PROFILE=explore draws fresh random examples each run, to search.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

sys.path.insert(0, str(Path(__file__).parent))


def pytest_sessionstart(session):
    """Byte-compile rlix once for the session: every Ray worker process imports it, and where
    PYTHONDONTWRITEBYTECODE is set (the CI machine) each would compile it from source again."""
    compileall.compile_dir(Path(__file__).resolve().parent.parent / "rlix", quiet=1)


EXEC_EXTRA = ("ray", "torch", "transformers", "peft", "datasets")
MISSING = [name for name in EXEC_EXTRA if importlib.util.find_spec(name) is None]


def pytest_collection_modifyitems(config, items):
    """Without the exec extra, the tests that run the executor are skipped, not failed."""
    if not MISSING:
        return
    skip = pytest.mark.skip(reason=f"needs the exec extra ({', '.join(MISSING)} not installed): pip install -e '.[exec]'")
    for item in items:
        if "heavy" in item.keywords or "exec" in item.keywords:
            item.add_marker(skip)
