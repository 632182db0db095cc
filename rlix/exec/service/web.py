"""Executor layer: the service's HTTP pages, ``/metrics`` (Prometheus) and ``/status`` (``rlix status --json``).

The shared service always serves them, on ``--metrics-port`` or on a free
port, and writes where in a file on its node (:func:`rlix.transport.page_file`),
so the ``rlix`` tool there reads the status over HTTP without importing Ray.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from rlix.exec.service.prom import serve
from rlix.transport import page_file


class Web:
    """The pages' server, and the file naming it (removed when the service stops)."""

    def __init__(self, port: int) -> None:
        self.port = port  # 0: any free port
        self.server = None
        self.file = None
        self.starting = False

    async def start(self, pages: dict[str, Callable[[], tuple[str, str]]]) -> None:
        """Serve ``pages``; raises OSError if the port is taken."""
        import ray

        if self.starting:  # once: the first caller binds (another awaiting meanwhile must not bind a second)
            return
        self.starting = True
        try:
            self.server = await serve(self.port, pages)
        except BaseException:
            self.starting = False
            raise
        port = self.server.sockets[0].getsockname()[1]
        gcs_port = int(ray.get_runtime_context().gcs_address.rpartition(":")[2])
        self.file = page_file(gcs_port)
        self.file.parent.mkdir(parents=True, exist_ok=True)
        self.file.write_text(json.dumps({"url": f"http://{ray.util.get_node_ip_address()}:{port}"}))

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        if self.file is not None:
            self.file.unlink(missing_ok=True)
