"""The local Ray start (rlix.ray_runtime) drops Ray's token-auth-on notice and nothing else."""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("ray")

from ray._private.authentication import authentication_token_setup as ray_auth  # noqa: E402

from rlix import ray_runtime  # noqa: E402


class _Keep(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def auth_log():
    logger = logging.getLogger(ray_runtime.AUTH_LOGGER)
    keep = _Keep()
    logger.addHandler(keep)
    yield keep
    logger.removeHandler(keep)


def test_ray_names_its_notice_as_we_filter_it(auth_log):
    """Ray's own notice goes to the logger and starts with the text we drop (a Ray upgrade that changes it fails here)."""
    assert ray_auth.logger.name == ray_runtime.AUTH_LOGGER
    ray_auth._warn_token_auth_enabled()
    assert len(auth_log.messages) == 1 and auth_log.messages[0].startswith(ray_runtime.AUTH_ON_NOTICE)


def test_local_start_drops_only_the_auth_on_notice(monkeypatch, auth_log):
    seen = {}

    def fake_init(**kwargs):  # the process boundary: ray.init starts a cluster
        seen.update(kwargs)
        ray_auth._warn_token_auth_enabled()
        ray_auth._warn_token_auth_disabled()
        logging.getLogger(ray_runtime.AUTH_LOGGER).warning("something else")

    monkeypatch.setattr("ray.init", fake_init)
    ray_runtime.init_local_ray(num_cpus=2, include_dashboard=False)
    assert seen == {"address": "local", "num_cpus": 2, "include_dashboard": False}  # always a new cluster of its own
    assert not any(m.startswith(ray_runtime.AUTH_ON_NOTICE) for m in auth_log.messages)
    assert any(m.startswith("Token authentication is disabled") for m in auth_log.messages)  # a real risk still shows
    assert "something else" in auth_log.messages
    ray_auth._warn_token_auth_enabled()  # after the start, the logger is as it was
    assert auth_log.messages[-1].startswith(ray_runtime.AUTH_ON_NOTICE)


def test_filter_removed_when_start_fails(monkeypatch, auth_log):
    def broken_init(**kwargs):
        raise ConnectionError("no cluster")

    monkeypatch.setattr("ray.init", broken_init)
    with pytest.raises(ConnectionError):
        ray_runtime.init_local_ray()
    assert not logging.getLogger(ray_runtime.AUTH_LOGGER).filters
