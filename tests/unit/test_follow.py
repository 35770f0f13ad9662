"""Following a Ray job's log (`submit`, `jobs logs --follow`) ends as soon as the job has ended, with every
line of its log delivered once: Ray's own tail only ends 2-3 s later (it sleeps 1 s at each end of file)."""
import asyncio
import os
import time

from raytrain.targets.ray_jobs_api import JobDetails, LastWord, RayJobsApiTarget

STARTED = '@@raytrain {"event":"started","name":"cnn"}\n'
WORKER_ERROR = '(RayTrainWorker pid=7) @@raytrain {"event":"error","type":"X","rank":1,"message":"m"}\n'
FINISHED = '@@raytrain {"event":"finished","metrics":null}\n'
AFTER = "written after the last event, before the driver exited\n"


class FakeJobs:
    """Ray's JobSubmissionClient (and raytrain's reads of the Jobs REST API) as they behave: the job ends ``exit_s`` after printing its last chunk; the
    tail goes on for ``tail_after_s`` after the job has ended before it stops."""

    def __init__(self, chunks, *, exit_s=0.3, tail_after_s=30.0, tail_gets_rest=False):
        self.chunks, self.exit_s, self.tail_after_s, self.tail_gets_rest = chunks, exit_s, tail_after_s, tail_gets_rest
        self.ended_at = None

    def get_job_info(self, job_id):  # the job runs when the follow starts
        return JobDetails(submission_id=job_id, status="RUNNING")

    def get_job_status(self, job_id):  # the Jobs REST API's status value
        return "SUCCEEDED" if self.ended_at is not None and time.monotonic() >= self.ended_at else "RUNNING"

    def get_job_logs(self, job_id):
        return "".join(self.chunks) + AFTER

    async def tail_job_logs(self, job_id):
        for chunk in self.chunks:
            yield chunk
            await asyncio.sleep(0.01)
        self.ended_at = time.monotonic() + self.exit_s
        if self.tail_gets_rest:
            yield AFTER
        await asyncio.sleep(self.tail_after_s)


def follow(fake, **kw):
    target = RayJobsApiTarget("http://127.0.0.1:1", token="")
    target._client = target._rest = fake  # Ray's client (the tail) and the REST reads
    seen = []
    start = time.monotonic()
    target.follow("job", seen.append, **kw)
    return "".join(seen), time.monotonic() - start


def test_following_ends_when_the_job_has_ended_not_when_rays_tail_does():
    out, took = follow(FakeJobs([STARTED, "step 1\n", FINISHED]), end_poll_s=0.02)
    assert out == STARTED + "step 1\n" + FINISHED + AFTER  # the rest read once the job ended, nothing twice
    assert took < 10  # the fake tail would have gone on for 30 s


def test_a_job_that_has_already_ended_is_read_in_one_piece_without_rays_tail():
    class Ended(FakeJobs):
        def get_job_info(self, job_id):
            return JobDetails(submission_id=job_id, status="FAILED")

        async def tail_job_logs(self, job_id):  # Ray's tail gives an ended job's log in 1-3 s, in pieces
            raise AssertionError("the tail of a job that has ended")
            yield  # an async generator

    out, took = follow(Ended([STARTED, "step 1\n", FINISHED]))
    assert out == STARTED + "step 1\n" + FINISHED + AFTER and took < 1


def test_a_line_the_tail_already_gave_is_not_given_again():
    out, _ = follow(FakeJobs([STARTED, FINISHED], tail_gets_rest=True), end_poll_s=0.02)
    assert out == STARTED + FINISHED + AFTER


def test_without_the_drivers_last_event_the_tail_alone_decides():
    """A worker's error event, or a driver killed before its last word: followed until Ray's tail ends."""
    out, took = follow(FakeJobs([STARTED, WORKER_ERROR], tail_after_s=0.5), end_poll_s=0.02)
    assert out == STARTED + WORKER_ERROR and took >= 0.5


def test_the_last_word_is_seen_across_chunks_and_only_from_the_driver():
    seen = LastWord()
    seen.add(STARTED + WORKER_ERROR + FINISHED[:20])
    assert not seen.said
    seen.add(FINISHED[20:])
    assert seen.said
    for kind in ("error", "capacity", "invalid"):
        word = LastWord()
        word.add(f'@@raytrain {{"event":"{kind}","message":"m"}}\n')
        assert word.said, kind
    assert seen.rest_of(STARTED + WORKER_ERROR + FINISHED + AFTER) == AFTER


def test_the_driver_exits_with_its_code_after_its_threads_and_exit_handlers(tmp_path):
    """The driver skips only the interpreter's finalization (2.4 s with Ray loaded): its non-daemon threads
    end, every atexit handler runs (Ray's shutdown among them), its output is flushed, the code is kept."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    done = tmp_path / "done"
    script = (
        "import atexit, sys, threading, time\n"
        "from raytrain.runtime.driver.process_exit import exit_without_finalizing\n"
        f"atexit.register(lambda: open({str(done)!r}, 'a').write('atexit\\n'))\n"
        f"threading.Thread(target=lambda: (time.sleep(0.3), open({str(done)!r}, 'a').write('thread\\n'))).start()\n"
        "sys.stdout.write('unflushed')\n"
        "exit_without_finalizing(3)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout == "unflushed"
    assert done.read_text() == "thread\natexit\n"


class FailingStatus(FakeJobs):
    """The Jobs API's status reads fail (``failures`` times, or always) while the log tail stays open, as a
    dashboard whose job-status route errors would: before, the first error left the follow waiting on the
    tail for ever."""

    def __init__(self, chunks, *, failures=None, **kw):
        super().__init__(chunks, **kw)
        self.failures, self.calls = failures, 0

    def get_job_status(self, job_id):
        self.calls += 1
        if self.failures is None or self.calls <= self.failures:
            raise RuntimeError("Request failed with status code 500: the job agent is gone")
        return "SUCCEEDED"


def fast_give_up(monkeypatch, seconds=0.5):
    from raytrain.targets import ray_jobs_api as ray_jobs

    monkeypatch.setattr(ray_jobs, "FOLLOW_STATUS_GIVE_UP_S", seconds, raising=False)
    monkeypatch.setattr(ray_jobs, "FOLLOW_STATUS_FAILURES", 3, raising=False)


def test_a_status_that_keeps_failing_ends_the_follow_with_the_reason(monkeypatch):
    import pytest

    from raytrain.errors import ClusterError

    fast_give_up(monkeypatch)
    fake = FailingStatus([STARTED, FINISHED], tail_after_s=3600)
    start = time.monotonic()
    with pytest.raises(ClusterError) as err:
        follow(fake, end_poll_s=0.02)
    assert time.monotonic() - start < 10
    message = str(err.value)
    assert "lost track of job job" in message and "could not be read" in message
    assert "RuntimeError: Request failed with status code 500: the job agent is gone" in message
    assert "raytrain jobs status job" in message
    assert err.value.exit_code != 0


def test_a_status_that_fails_before_the_last_word_ends_the_follow_too(monkeypatch):
    """The status is read during the whole job, not only after the driver's last event: a job whose log
    stays silent while its API fails is not followed for ever."""
    import pytest

    from raytrain.errors import ClusterError

    fast_give_up(monkeypatch)
    with pytest.raises(ClusterError, match="lost track"):
        follow(FailingStatus([STARTED], tail_after_s=3600), end_poll_s=0.02, status_poll_s=0.05)


def test_a_transient_status_error_is_retried(monkeypatch):
    fast_give_up(monkeypatch, seconds=30)
    fake = FailingStatus([STARTED, "step 1\n", FINISHED], failures=2, tail_after_s=3600)
    out, took = follow(fake, end_poll_s=0.02)
    assert out == STARTED + "step 1\n" + FINISHED + AFTER
    assert took < 10 and fake.calls >= 3


def test_a_status_read_that_hangs_counts_as_a_failure(monkeypatch):
    import pytest

    from raytrain.errors import ClusterError
    from raytrain.targets import ray_jobs_api as ray_jobs

    fast_give_up(monkeypatch)
    monkeypatch.setattr(ray_jobs, "FOLLOW_STATUS_CALL_S", 0.1, raising=False)

    class Hangs(FakeJobs):
        def get_job_status(self, job_id):
            time.sleep(3600)

    with pytest.raises(ClusterError, match="TimeoutError: no answer within 0.1 s"):
        follow(Hangs([STARTED, FINISHED], tail_after_s=3600), end_poll_s=0.02)


def test_a_tail_that_outlives_the_job_without_the_last_word_is_cut(monkeypatch):
    from raytrain.targets import ray_jobs_api as ray_jobs

    monkeypatch.setattr(ray_jobs, "FOLLOW_TAIL_GRACE_S", 0.3, raising=False)
    out, took = follow(FakeJobs([STARTED, WORKER_ERROR], tail_after_s=3600), end_poll_s=0.02, status_poll_s=0.05)
    assert out == STARTED + WORKER_ERROR + AFTER and took < 10


def test_a_jobs_api_call_that_hangs_is_given_up_naming_the_call(monkeypatch):
    """The Jobs API calls set no timeout that bounds a whole answer: a dashboard that never answers a stop, a status or a log
    read must not hang the command."""
    import pytest

    from raytrain.errors import ClusterError
    from raytrain.targets import ray_jobs_api as ray_jobs

    monkeypatch.setattr(ray_jobs, "JOBS_API_CALL_S", 0.2)

    class Hangs(FakeJobs):
        def stop_job(self, job_id):
            time.sleep(3600)

        def get_job_info(self, job_id):
            raise RuntimeError("Job job does not exist")

    target = RayJobsApiTarget("http://127.0.0.1:1", token="")
    target._client = target._rest = Hangs([STARTED])
    start = time.monotonic()
    with pytest.raises(ClusterError, match=r"^job stop: no answer from http://127.0.0.1:1 within 0 s"):
        target.stop("job")
    assert time.monotonic() - start < 5
    with pytest.raises(ClusterError, match="no job 'job' on http://127.0.0.1:1"):  # its own errors as before
        target.status("job")
    assert target.logs("job") == STARTED + AFTER  # and its answers


def test_ctrl_c_with_stop_on_interrupt_says_so_when_the_stop_gets_no_answer(capsys):
    import pytest

    from raytrain.cli.submit import _follow
    from raytrain.errors import ClusterError
    from raytrain.targets.base import JobHandle
    from rich.console import Console

    class Target:
        def follow(self, job_id, on_text):
            raise KeyboardInterrupt

        def stop(self, job_id):
            raise ClusterError("job stop: no answer from http://h:8265 within 120 s (an overloaded or stuck "
                               "dashboard?); try again")

        def reconnect_flags(self):
            return ["--address", "http://h:8265"]

    with pytest.raises(SystemExit) as ended:
        _follow(Console(width=300), Target(), JobHandle("address", "http://h:8265", "raytrain-cnn-1", "cnn"), quiet=True,
                verbose=False, stop_on_interrupt=True)
    assert ended.value.code == 130
    out = capsys.readouterr().out
    assert "raytrain: could not stop raytrain-cnn-1: job stop: no answer from http://h:8265 within 120 s" in out
    assert "stop:   raytrain jobs stop raytrain-cnn-1 --address http://h:8265" in out
