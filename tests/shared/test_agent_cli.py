"""``pobo agent run`` against the wrong address (issue 34): a closed port, https on an http port, a URL
without a scheme, a server that is not a pobo modeler (the curator, any other web server) — each one line on
stderr with what to do, exit status 1, no traceback unless ``--debug``; and the coordinator's warning about
a second process on the agent's token printed as one line. The servers are small local HTTP servers
(threads); one run is a real process, for its exit status and stderr."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from shared.federated.rff import draw_rff
from shared.protocol.schemas.federations import AGENT_INSTANCE_HEADER
from shared.tools.agent import AgentError
from shared.tools.agent_checks import AgentSetupError, check_modeler, check_url, explain
from shared.tools.cli import app

ROOT = Path(__file__).resolve().parents[2]
FEDERATION = "0123456789abcdef"
Answer = Callable[[str, dict[str, str]], tuple[int, str, bytes]]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def server(answer: Answer) -> Iterator[str]:
    """A local HTTP server whose every GET is answered by ``answer(path, headers)``: (status, type, body)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the standard library's name
            status, kind, body = answer(self.path, {k.lower(): v for k, v in self.headers.items()})
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def health_of(service: str) -> Answer:
    def answer(path: str, headers: dict[str, str]) -> tuple[int, str, bytes]:
        if path == "/healthz":
            body = {"status": "ok", "database": "ok", "service": service}
            return 200, "application/json", json.dumps(body).encode()
        return 404, "application/json", b'{"detail": "Not Found"}'

    return answer


def not_pobo(path: str, headers: dict[str, str]) -> tuple[int, str, bytes]:
    return 404, "text/html", b"<html><body>Not found</body></html>"


def run(url: str, *extra: str) -> Any:
    args = ["agent", "run", "--modeler", url, "--federation", FEDERATION, "--token", "pobo_a_x", *extra]
    return CliRunner().invoke(app, args)


def one_error_line(result: Any) -> str:
    """The run failed with exit status 1 and printed exactly one line, on stderr, and no traceback."""
    assert result.exit_code == 1, (result.exit_code, result.output, result.exception)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert result.stdout == "" and "Traceback" not in result.output
    return str(lines[0])


def test_a_closed_port_is_one_line_with_the_fix() -> None:
    port = closed_port()
    line = one_error_line(run(f"http://127.0.0.1:{port}"))
    assert line == (
        f"error: cannot connect to http://127.0.0.1:{port}: connection refused — is the modeler running, "
        "and is the port right?"
    )


def test_a_closed_port_in_a_real_process_exits_1_without_a_traceback_unless_debug() -> None:
    port = closed_port()
    cmd = [sys.executable, "-m", "shared.tools.cli", "agent", "run", "--modeler", f"http://127.0.0.1:{port}"]
    cmd += ["--federation", FEDERATION]
    env = {**os.environ, "POBO_AGENT_TOKEN": "pobo_a_x"}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)  # noqa: S603
    assert done.returncode == 1 and done.stdout == "", done
    assert done.stderr.splitlines() == [
        f"error: cannot connect to http://127.0.0.1:{port}: connection refused — is the modeler running, "
        "and is the port right?"
    ]
    debug = subprocess.run(  # noqa: S603
        [*cmd, "--debug"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "AgentSetupError" in debug.stderr


def test_a_url_without_a_scheme() -> None:
    port = closed_port()
    line = one_error_line(run(f"127.0.0.1:{port}"))
    assert line == (
        f"error: the modeler URL '127.0.0.1:{port}' has no scheme: write http://127.0.0.1:{port} (or "
        f"https://127.0.0.1:{port} if the modeler serves TLS)"
    )
    assert "has no scheme: write http://localhost:8002" in one_error_line(run("localhost:8002"))
    assert "is not an http:// or https:// URL" in one_error_line(run("ftp://modeler.example.org"))
    assert check_url("https://modeler.example.org:8002/") == "https://modeler.example.org:8002"


def test_https_on_an_http_port() -> None:
    with server(health_of("modeler")) as url:
        https = url.replace("http://", "https://")
        line = one_error_line(run(https))
    assert line.startswith(f"error: TLS failed with {https} (")
    assert line.endswith(f"the server does not speak TLS there; if the modeler serves plain HTTP, use {url}")


def test_the_curator_or_another_server_is_not_a_modeler() -> None:
    with server(health_of("curator")) as url:
        line = one_error_line(run(url))
    assert line == (
        f"error: {url} is a pobo curator, not a modeler: give the modeler's URL (the address `pobo modeler "
        "serve` listens on)"
    )
    with server(not_pobo) as url:
        line = one_error_line(run(url + "/"))
    assert line == (
        f"error: {url} is not a pobo modeler (GET /healthz answered 404 with text/html): give the modeler's "
        "URL (the address `pobo modeler serve` listens on)"
    )
    with server(health_of("modeler")) as url:
        assert check_modeler(url + "/") == url


def test_refusals_of_a_run_read_as_what_to_do() -> None:
    url = "http://modeler.test"
    assert "give the token printed when this agent was registered" in explain(
        AgentError(401, "invalid token"), url, FEDERATION
    )
    assert f"no federation {FEDERATION} for this token" in explain(
        AgentError(404, "no federation"), url, FEDERATION
    )
    assert explain(AgentSetupError("x y"), url, FEDERATION) == "x y"
    assert (
        explain(ValueError("a\nb"), url, FEDERATION) == "ValueError: a b (run with --debug for the traceback)"
    )


def federation_answer(warning: str | None, instances: list[str]) -> Answer:
    """A modeler whose federation is done (no round to take part in): the agent reads it and reports."""
    rff = draw_rff(2, 4, 0.3, rng=np.random.default_rng(0)).to_public()
    you = {"id": "a" * 32, "name": "h", "position": 0, "region": 0}
    federation = {
        "id": FEDERATION,
        "created_at": datetime(2026, 1, 1, tzinfo=UTC).isoformat(),
        "status": "done",
        "stop_reason": "rounds",
        "round": 0,
        "round_deadline": None,
        "rounds_closed": 0,
        "participants": 1,
        "epsilon_pld": 0.0,
        "epsilon_rdp": 0.0,
        "epsilon_replace_one_pld": 0.0,
        "params": {"bounds": [[0.0, 1.0], [0.0, 1.0]], "P": 1, "n_init": 1},
        "rff": rff,
        "region_counts": [1, 1],
        "agents": None,
        "you": you,
        "warning": warning,
    }

    def answer(path: str, headers: dict[str, str]) -> tuple[int, str, bytes]:
        if path == "/healthz":
            return health_of("modeler")(path, headers)
        instances.append(headers.get(AGENT_INSTANCE_HEADER.lower(), ""))
        return 200, "application/json", json.dumps(federation).encode()

    return answer


def test_the_coordinators_warning_of_a_second_process_is_printed_once() -> None:
    warning = "another process is using this agent's token: stop every other `pobo agent run` with this token"
    instances: list[str] = []
    with server(federation_answer(warning, instances)) as url:
        result = run(url, "--seed", "1")
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == [f"warning: {warning}"]  # three answers carried it, printed once
    assert "done (rounds)" in result.stdout
    assert len(instances) >= 2 and len(set(instances)) == 1 and len(instances[0]) == 32  # one id per process
    quiet: list[str] = []
    with server(federation_answer(None, quiet)) as url:
        result = run(url, "--seed", "1")
    assert result.exit_code == 0 and result.stderr == ""
    assert quiet[0] != instances[0]  # a new process, a new instance


@pytest.mark.parametrize("url", ["http://127.0.0.1:1", "https://127.0.0.1:1"])
def test_the_check_makes_one_attempt(url: str) -> None:
    with pytest.raises(AgentSetupError, match="connection refused"):
        check_modeler(url, timeout=2.0)
