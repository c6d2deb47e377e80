"""A private Prometheus for one test: Debian's ``prometheus`` with its own config, data directory and
loopback port, scraping the targets it is given every second; ended by PID, also when the test fails.

``make deps`` installs it (``apt-get install --no-install-recommends prometheus``, which brings
``promtool``); when it is missing the test FAILS and says so.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

INSTALL_HINT = "make deps (apt-get install --no-install-recommends prometheus: it brings promtool)"


def tool(name: str) -> str:
    """The path of ``prometheus`` or ``promtool``; fails the test when it is not installed."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: {INSTALL_HINT}", pytrace=False)
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Prometheus:
    """Starts at construction (it boots while the test sets up the daemon); :meth:`wait_ready`
    before the first query; :meth:`stop` always (a fixture's ``finally``)."""

    def __init__(self, base: Path, targets: list[str], scrape_interval_s: float = 1.0) -> None:
        base.mkdir(parents=True, exist_ok=True)
        self.base = base
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        interval = f"{int(scrape_interval_s * 1000)}ms"
        config = {  # JSON is YAML
            "global": {
                "scrape_interval": interval,
                "scrape_timeout": interval,
                "evaluation_interval": interval,
            },
            "scrape_configs": [{"job_name": "gpushift", "static_configs": [{"targets": targets}]}],
        }
        (base / "prometheus.yml").write_text(json.dumps(config, indent=2))
        self.log_path = base / "prometheus.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [
                tool("prometheus"),
                f"--config.file={base / 'prometheus.yml'}",
                f"--storage.tsdb.path={base / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"prometheus exited with {self.proc.returncode}:\n{self.log()}", pytrace=False)
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.05)
        pytest.fail(f"prometheus not ready after {timeout_s} s:\n{self.log()}", pytrace=False)

    def api(self, path: str, **params: Any) -> Any:
        """``/api/v1/<path>``'s ``data``; fails the test on an error answer."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.loads(r.read())
        if body.get("status") != "success":
            pytest.fail(f"prometheus {path} {params}: {body}", pytrace=False)
        return body["data"]

    def query(self, expr: str) -> dict[frozenset[tuple[str, str]], float]:
        """An instant query: {labels without __name__: value}."""
        return {_labels(r["metric"]): float(r["value"][1]) for r in self.api("query", query=expr)["result"]}

    def query_range(
        self, expr: str, start: float, end: float, step_s: float
    ) -> dict[frozenset[tuple[str, str]], list[tuple[float, float]]]:
        """A range query through ``/api/v1/query_range``: {labels: [(time, value), ...]}."""
        data = self.api("query_range", query=expr, start=start, end=end, step=step_s)
        return {_labels(r["metric"]): [(float(t), float(v)) for t, v in r["values"]] for r in data["result"]}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


def _labels(metric: dict[str, str]) -> frozenset[tuple[str, str]]:
    return frozenset((k, v) for k, v in metric.items() if k != "__name__")
