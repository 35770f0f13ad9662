"""The driver's phases end the job with one Outcome each; one classifier turns a failure into an outcome by the
type of its root cause; status and the run's record read a job's outcome through one function."""
import pytest

from raytrain.errors import ConfigError
from raytrain.events import CAPACITY, ERROR, FINISHED, INVALID, STARTED, STOPPED, JobFacts, format_event
from raytrain.runtime.driver import entrypoint as driver
from raytrain.runtime.driver.preflight import PreflightError
from raytrain.status import JobState, job_state, outcome


class WorkerGroupError(Exception):  # the shape of Ray Train's error: worker_failures by rank
    def __init__(self, failures):
        super().__init__("workers failed")
        self.worker_failures = failures


class Wrapped(Exception):  # the shape of Ray's wrappers: the original error as ``cause``
    def __init__(self, cause):
        super().__init__("wrapped")
        self.cause = cause


class NetworkPreflightError(PreflightError):
    """A subclass: a match on the class's name would miss it."""


@pytest.mark.parametrize("exc", [
    Wrapped(PreflightError("preflight: rank 1 cannot reach rank 0")),
    WorkerGroupError({0: NetworkPreflightError("preflight: no interface eth7 on node b")}),
])
def test_workers_that_cannot_connect_are_a_plan_that_cannot_run(exc):
    out = driver.classify_failure(exc)
    assert (out.event, out.exit_code, out.ends_trackers) == (INVALID, driver.EXIT_CANNOT_RUN, None)
    assert out.fields["message"].startswith("preflight: ")


def test_a_missing_resume_point_cannot_run():
    try:
        raise ConfigError("--resume latest: no checkpoint in /s", flag="--resume") from OSError("no such folder")
    except ConfigError as exc:
        out = driver.classify_failure(exc)
    assert (out.event, out.exit_code) == (INVALID, driver.EXIT_CANNOT_RUN)
    assert out.fields == {"message": "--resume latest: no checkpoint in /s"}


def test_any_other_failure_is_the_training_failing_on_its_rank_and_ends_the_trackers():
    exc = WorkerGroupError({2: ValueError("loss went the wrong way\nshape mismatch (4, 8)")})
    out = driver.classify_failure(exc, ["rank 0 in all_reduce", "rank 1 in step 7"])
    assert (out.event, out.exit_code, out.ends_trackers) == (ERROR, driver.EXIT_TRAINING_FAILED, "failed")
    assert out.fields == {"type": "ValueError", "rank": 2,
                          "message": "shape mismatch (4, 8); after a hang: rank 0 in all_reduce; rank 1 in step 7"}


def test_the_driver_runs_its_phases_in_order():
    names = [phase.__name__ for phase in driver.PHASES]
    assert names == ["check_driver_node", "check_capacity", "check_storage", "resolve_resume", "load_data", "fit"]


def facts(*last_words):
    return JobFacts.from_lines(format_event(kind, **fields) for kind, fields in last_words)


STARTED_ = (STARTED, {"name": "j", "workers": 2})


@pytest.mark.parametrize("last_words, expected", [
    ((STARTED_,), None),
    ((STARTED_, (FINISHED, {"metrics": {}})), JobState.SUCCEEDED),
    ((STARTED_, (ERROR, {"type": "ValueError", "message": "x"})), JobState.FAILED),
    (((CAPACITY, {"message": "no room"}),), JobState.FAILED),
    (((INVALID, {"message": "bad storage"}),), JobState.FAILED),
    ((STARTED_, (STOPPED, {"signal": "SIGTERM"})), JobState.STOPPED),
])
def test_one_outcome_for_status_and_the_record(tmp_path, last_words, expected):
    from raytrain import run_record

    f = facts(*last_words)
    assert outcome(f) is expected
    # status: while the cluster says running, only a failure's last word is final (the driver exits next)
    assert job_state(JobState.RUNNING, f) is (JobState.FAILED if expected is JobState.FAILED else
                                               JobState.RUNNING if STARTED_ in last_words else JobState.PENDING)
    # the record: its last word, or FAILED for a record that ends without one
    (tmp_path / "events-driver.log").write_text(
        "".join(f"{100.0 + n} {format_event(kind, **fields)}\n" for n, (kind, fields) in enumerate(last_words)))
    assert run_record.job_info("j1", tmp_path).state is (expected or JobState.FAILED)
