"""`submit` posts to the Jobs API itself (no Ray client) when there is nothing to upload: against a real HTTP
server, the body Ray's client would send, a head whose job agent is not registered yet waited for, a retried
submit that finds its job already there not started twice, and any other refusal said with the server's text."""
import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from raytrain.errors import ClusterError
from raytrain.targets.base import Request
from raytrain.targets.ray_jobs_api import RayJobsApiTarget


def serve(answers: list[tuple[int, str]]):
    """A Jobs API whose ``POST /api/jobs/`` gives ``answers`` in turn; the bodies it got."""
    got: list[dict] = []

    class Jobs(BaseHTTPRequestHandler):
        def do_POST(self):
            got.append({"path": self.path, "token": self.headers.get("Authorization"),
                        "body": json.loads(self.rfile.read(int(self.headers["Content-Length"])))})
            code, text = answers[min(len(got), len(answers)) - 1]
            self.send_response(code)
            self.end_headers()
            self.wfile.write(text.encode())

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Jobs)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, got


def request() -> Request:
    return Request(target="address", address="", submission_id="raytrain-x-1", run_name="raytrain-x-1",
                   entrypoint="python -m raytrain.runtime.driver.entrypoint", runtime_env={"env_vars": {"A": "1"}},
                   metadata={"name": "x"}, entrypoint_num_cpus=0)


@pytest.mark.parametrize("answers", [
    [(500, "No available agent to submit job, please try again later."), (200, '{"submission_id": "raytrain-x-1"}')],
    [(400, "Job with submission_id raytrain-x-1 already exists. Please use a different submission_id.")],
], ids=["agent-not-ready-then-accepted", "already-exists"])
def test_submit_posts_rays_body_and_handles_what_the_head_answers(answers):
    server, got = serve(answers)
    try:
        target = RayJobsApiTarget(f"http://127.0.0.1:{server.server_port}", token="tok")
        handle = target.submit(request(), agent_wait_s=10)
    finally:
        server.shutdown()
    assert handle.job_id == "raytrain-x-1"
    assert len(got) == len(answers)  # one retry after the 500; none after "already exists"
    assert got[0]["path"] == "/api/jobs/" and got[0]["token"] == "Bearer tok", got[0]
    assert got[0]["body"] == {"entrypoint": "python -m raytrain.runtime.driver.entrypoint",
                              "submission_id": "raytrain-x-1", "runtime_env": {"env_vars": {"A": "1"}},
                              "metadata": {"name": "x"}, "entrypoint_num_cpus": 0}


def test_a_refused_submit_says_the_servers_answer():
    server, got = serve([(400, "runtime_env: bad field")])
    try:
        with pytest.raises(ClusterError) as err:
            RayJobsApiTarget(f"http://127.0.0.1:{server.server_port}", token="tok").submit(request())
    finally:
        server.shutdown()
    assert len(got) == 1
    assert "failed: Request failed with status code 400: runtime_env: bad field." in str(err.value), str(err.value)
