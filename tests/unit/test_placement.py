"""Nothing hangs at start: a job whose workers cannot be placed says what it waits for and who holds it, is
pending, and gives up after --start-timeout; groups that ended jobs leaked are found; `jobs stop` waits for a
job's workers and placement groups and removes leaked ones, and says what still runs when its wait runs out."""
import pytest

from raytrain import events, placement
from raytrain.config import Options, resolve
from raytrain.errors import ConfigError, RaytrainError
from raytrain.events import JobFacts, format_event
from raytrain.status import JobInfo, JobState, state_of
from raytrain.targets.ray_jobs_api import RayJobsApiTarget
from tests.conftest import JOBS


def group(pg_id, job, state, cpus=(1.0, 1.0), detached=False):
    return {"placement_group_id": pg_id, "creator_job_id": job, "state": state, "is_detached": detached,
            "bundles": [{"unit_resources": {"CPU": c}} for c in cpus]}


HOLDER = group("aa", "01000000", "CREATED")
MINE = group("bb", "02000000", "PENDING")
NAMES = {"01000000": "raytrain-a-1", "02000000": "raytrain-b-2"}


def test_a_waiting_job_says_what_it_waits_for_and_which_job_holds_it():
    groups = [HOLDER, MINE, group("cc", "03000000", "REMOVED")]
    mine = placement.of_job(groups, "02000000")
    assert mine == [MINE]
    assert placement.waiting_message(mine, groups, NAMES) == "waiting for 2 CPU; 2 CPU held by job raytrain-a-1"
    alone = placement.waiting_message(mine, [MINE], NAMES)
    assert alone.startswith("waiting for 2 CPU; no other job holds them")


def test_leaked_groups_are_live_non_detached_groups_of_ended_jobs():
    leaked = group("dd", "04000000", "CREATED")
    detached = group("ee", "05000000", "CREATED", detached=True)
    jobs = [{"job_id": "01000000", "status": "RUNNING"}, {"job_id": "02000000", "status": "PENDING"},
            {"job_id": "04000000", "status": "STOPPED"}, {"job_id": None, "status": "PENDING"}]
    alive = placement.alive_job_ids(jobs)
    assert alive == ["01000000", "02000000"]
    assert placement.leaked([HOLDER, MINE, leaked, detached, group("ff", "04000000", "REMOVED")], alive) == [leaked]


def test_a_running_job_whose_workers_wait_is_pending_until_they_are_placed():
    started = format_event(events.STARTED, workers=2)
    waiting = format_event(events.WAITING, message="waiting for 2 CPU; 2 CPU held by job raytrain-a-1")
    facts = JobFacts.from_lines([started, waiting])
    assert state_of("RUNNING", facts) is JobState.PENDING
    info = JobInfo("b", "b", JobState.PENDING, "local", "", facts=facts).to_dict()
    assert info["waiting"] == "waiting for 2 CPU; 2 CPU held by job raytrain-a-1"
    placed = JobFacts.from_lines([started, waiting, format_event(events.PLACED, waited_s=3.0)])
    assert state_of("RUNNING", placed) is JobState.RUNNING and placed.waiting is None
    gave_up = JobFacts.from_lines([started, waiting, format_event(events.ERROR, type="StartTimeout", message="x")])
    assert state_of("FAILED", gave_up) is JobState.FAILED and gave_up.waiting is None


def test_start_timeout_has_a_stated_default_and_refuses_a_negative_value():
    assert resolve(Options(job=str(JOBS / "cnn.py"))).start_timeout_s == 600.0
    assert resolve(Options(job=str(JOBS / "cnn.py"), start_timeout=0)).start_timeout_s == 0.0
    with pytest.raises(ConfigError, match="--start-timeout -1"):
        resolve(Options(job=str(JOBS / "cnn.py"), start_timeout=-1))


class Cluster(RayJobsApiTarget):
    """A Jobs API target whose cluster answers from these lists (no Ray): what `jobs stop` reads and does."""

    def __init__(self, *, state=JobState.STOPPED, actors=(), groups=(), removes=True):
        super().__init__("http://127.0.0.1:1", token="")
        self.state, self.actors, self.groups, self.removes = state, list(actors), list(groups), removes
        self.utilities = []

    def stop(self, job_id):
        return True

    def status(self, job_id, *, with_facts=True):
        return JobInfo(job_id, "b", self.state, "address", self.address, ray_job_id="02000000")

    def held_by(self, ray_job_id):
        return self.actors, self.groups

    def release(self, info, timeout_s=1.0, poll_s=0.1):
        """The real wait, 1 s instead of 20: these groups only go when run_utility removes them."""
        return super().release(info, timeout_s=timeout_s, poll_s=poll_s)

    def run_utility(self, module, event_kind, timeout_s=120.0):
        self.utilities.append(module)
        if self.removes:
            self.groups = []
        return {"event": event_kind}


def test_jobs_stop_says_the_workers_and_placement_groups_are_gone():
    assert Cluster().stop_and_wait("b") == "b: stopped; its workers and placement groups are gone"


def test_jobs_stop_removes_a_placement_group_ray_leaked():
    cluster = Cluster(groups=[group("bb", "02000000", "CREATED")])
    line = cluster.stop_and_wait("b", timeout_s=1)
    assert cluster.utilities == ["raytrain.runtime.driver.placement_watch"]
    assert line == "b: stopped; its workers and placement groups are gone (removed the placement group Ray leaked)"
    assert Cluster().release(cluster.status("b"), timeout_s=0) == "; its workers and placement groups are gone"


def test_jobs_stop_fails_naming_what_still_runs():
    with pytest.raises(RaytrainError, match=r"b is still running 0 s after the stop request") as err:
        Cluster(state=JobState.RUNNING).stop_and_wait("b", timeout_s=0)
    assert err.value.exit_code == 1
    stuck = Cluster(actors=[{"class_name": "RayTrainWorker"}], groups=[MINE])
    with pytest.raises(RaytrainError, match=r"1 actor\(s\) \(RayTrainWorker\) and 1 placement group\(s\)"):
        stuck.release(stuck.status("b"), timeout_s=0, poll_s=0)
    leaked_for_good = Cluster(groups=[MINE], removes=False)
    with pytest.raises(RaytrainError, match="1 placement group"):
        leaked_for_good.release(leaked_for_good.status("b"), timeout_s=0, poll_s=0)
