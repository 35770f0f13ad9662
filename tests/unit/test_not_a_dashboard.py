"""An --address that answers HTTP but is not a Ray dashboard (here a real http.server serving a folder) is
refused in one line, "not a Ray dashboard at URL", exit 2: never an HTML page on the terminal."""
from __future__ import annotations

import functools
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest
from click.testing import CliRunner

from raytrain.cli.main import main


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def web_server(tmp_path):
    (tmp_path / "index.html").write_text("<html><body><h1>hello</h1></body></html>")
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(tmp_path)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def job(tmp_path):
    path = tmp_path / "job.py"
    path.write_text("def train(ctx):\n    pass\n")
    return str(path)


@pytest.mark.parametrize("command", [["jobs", "list"], ["submit", "JOB"], ["jobs", "status", "some-job"]])
def test_a_web_server_is_not_a_ray_dashboard(raytrain_home, web_server, job, command):
    args = [job if a == "JOB" else a for a in command]
    result = CliRunner().invoke(main, [*args, "--address", web_server])
    assert result.exit_code == 2, result.output
    assert "<" not in result.output and "Traceback" not in result.output, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"raytrain: error: not a Ray dashboard at {web_server} ("), lines
