import compileall
import importlib.util
import os
import secrets
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings

# Property tests draw the same examples on every run (a red CI is then reproducible, never a
# coin flip); HYPOTHESIS_PROFILE=explore draws fresh random examples each run, to search.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

sys.path.insert(0, str(Path(__file__).parent))

# The suite runs on pytest-xdist's workers (``-n`` in pyproject.toml). Each worker's Ray clusters
# keep their sockets, logs and ``ray_current_cluster`` (what ``--address auto`` reads) under a
# folder of the worker's own, so the clusters of two tests running at once never meet.
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ["RAY_TMPDIR"] = f"/tmp/rlix-tests-{os.getpid()}"

# Ray turns token authentication on, and a cluster started where there is no token writes one to
# ~/.ray/auth_token, the user's. The suite's clusters carry a token of the suite's own instead, never one
# from (or written to) the home directory (a test that needs another sets its own path).
_TOKEN = Path(tempfile.mkdtemp(prefix="rlix-tests-token-"))
(_TOKEN / "auth_token").write_text(secrets.token_hex(32))
os.environ["RAY_AUTH_TOKEN_PATH"] = str(_TOKEN / "auth_token")
os.environ.pop("RAY_AUTH_TOKEN", None)


def pytest_sessionfinish(session):
    shutil.rmtree(_TOKEN, ignore_errors=True)
    if "PYTEST_XDIST_WORKER" in os.environ:
        shutil.rmtree(os.environ["RAY_TMPDIR"], ignore_errors=True)


def pytest_sessionstart(session):
    """Byte-compile rlix once for the session: every Ray worker process imports it, and where
    PYTHONDONTWRITEBYTECODE is set (the CI machine) each would compile it from source again.
    Under pytest-xdist the controller compiles it, before its workers start."""
    if "PYTEST_XDIST_WORKER" in os.environ:
        return
    compileall.compile_dir(Path(__file__).resolve().parent.parent / "rlix", quiet=1)


EXEC_EXTRA = ("ray", "torch", "transformers", "peft", "datasets")
MISSING = [name for name in EXEC_EXTRA if importlib.util.find_spec(name) is None]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    """On the controller, a worker's collection: if its tests lost their group (pytest-xdist 3.8's
    ``loadgroup`` under pytest 9.2 drops it, pytest-xdist#1386), the groups would run on both workers at
    once and each module's Ray runs twice. Stop, in one line, rather than run a suite twice as long
    that starves its own timing."""
    if node.config.getvalue("dist") == "loadgroup" and ids and not any("@" in i for i in ids):
        pytest.exit(
            "pytest-xdist's --dist loadgroup does not group tests under this pytest (pytest-xdist#1386): "
            "pip install 'pytest<9.2', or run with -n 0",
            returncode=pytest.ExitCode.USAGE_ERROR,
        )


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (``--dist loadgroup``) the tests that start Ray clusters or other services
    (heavy ones not marked ``in_process``) and the GPU tests are one group, run one after another on one
    worker, first (``--no-loadscope-reorder`` keeps this order): on 2 cores two of them at once starve
    each other's timing, and two on one GPU share its memory. The other tests, a group per module, run on
    the other worker meanwhile; the heavy ``in_process`` ones (no Ray, no deadline: models trained in the
    test's own process or its spawned ranks, the notebook) come last there, as one group, so that worker
    stays busy beside the long first group rather than idle.
    Without the exec extra, the tests that run the executor are skipped, not failed."""

    def lane(item) -> int:  # 0: processes or a GPU's memory no other test may share; 1: light; 2: heavy, in-process
        if "gpu" in item.keywords or ("heavy" in item.keywords and "in_process" not in item.keywords):
            return 0
        return 2 if "heavy" in item.keywords else 1

    def group(item) -> str:
        return ("heavy", item.path.name, "heavy-in-process")[lane(item)]

    position = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (lane(item), position[id(item)]))
    for item in items:
        item.add_marker(pytest.mark.xdist_group(group(item)))
    if not MISSING:
        return
    skip = pytest.mark.skip(reason=f"needs the exec extra ({', '.join(MISSING)} not installed): pip install -e '.[exec]'")
    for item in items:
        if "heavy" in item.keywords or "exec" in item.keywords:
            item.add_marker(skip)
