"""One mapping from what a cluster says about a job (and what its log says) to a job state, for every target."""
import pytest

from raytrain.events import CAPACITY, ERROR, RESTARTING, STARTED, WAITING, JobFacts, format_event
from raytrain.status import JobState, job_state, ray_job_state, rayjob_state, state_of
from raytrain.targets.kuberay_rayjob import KubeRayJobTarget

SUBMITTED = "Job submission server address: http://raytrain-head-svc:8265\n"
NOT_STARTED = JobFacts.from_lines([SUBMITTED])  # the driver runs, its workers are not placed yet
STARTED_LOG = [SUBMITTED, format_event(STARTED, workers=2)]
TRAINING = JobFacts.from_lines(STARTED_LOG)
RESTART = JobFacts.from_lines([*STARTED_LOG, format_event(RESTARTING, attempt=1)])
RUNNING_RAYJOB = {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}
# the driver said why it failed and is exiting; Ray still says RUNNING for a moment
GAVE_UP = JobFacts.from_lines([*STARTED_LOG, format_event(WAITING, message="2 CPU"),
                               format_event(ERROR, type="StartTimeout", rank=None, message="not within 30 s")])
NO_ROOM = JobFacts.from_lines([SUBMITTED, format_event(CAPACITY, message="8 CPU asked, 2 on the cluster")])


@pytest.mark.parametrize("facts, state", [
    (None, JobState.RUNNING),  # the log was not read: the cluster's view stands
    (NOT_STARTED, JobState.PENDING),
    (TRAINING, JobState.RUNNING),
    (RESTART, JobState.RESTARTING),
    (GAVE_UP, JobState.FAILED),  # was "running" between the StartTimeout and the driver's exit
    (NO_ROOM, JobState.FAILED),
])
def test_a_rayjob_and_a_ray_job_map_to_the_same_state(facts, state):
    assert job_state(rayjob_state(RUNNING_RAYJOB), facts) is state
    assert job_state(ray_job_state("RUNNING"), facts) is state
    assert state_of("RUNNING", facts) is state


def test_terminal_states_are_never_refined_by_the_log():
    for ray, kuberay in (("SUCCEEDED", {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}),
                         ("FAILED", {"jobDeploymentStatus": "Failed"}), ("STOPPED", {"jobDeploymentStatus": "Suspended"})):
        assert state_of(ray, NOT_STARTED) is job_state(rayjob_state(kuberay), NOT_STARTED) is JobState(ray.lower())


class _Conn:
    def namespace(self, *candidates):
        return next((c for c in candidates if c), "default")


def _target(monkeypatch, status: dict, log: str) -> KubeRayJobTarget:
    from raytrain.clusters.profiles import default_k8s_profile

    target = KubeRayJobTarget(_Conn(), profile=default_k8s_profile(), namespace="team")
    obj = {"metadata": {"name": "cnn-x"}, "spec": {"metadata": {"name": "cnn"}}, "status": status}
    monkeypatch.setattr(target, "_get", lambda job_id: obj)
    monkeypatch.setattr(target, "_submitter_log", lambda job_id: (log, None))
    return target


def test_a_kuberay_job_that_has_not_started_is_pending_like_a_ray_jobs_one(monkeypatch):
    target = _target(monkeypatch, RUNNING_RAYJOB, SUBMITTED)
    assert target.status("cnn-x").state is JobState.PENDING
    assert state_of("RUNNING", JobFacts.from_lines([SUBMITTED])) is JobState.PENDING  # the Ray Jobs target's
    assert _target(monkeypatch, RUNNING_RAYJOB, "".join(STARTED_LOG)).status("cnn-x").state is JobState.RUNNING


def test_a_kuberay_job_whose_log_cannot_be_read_keeps_the_rayjobs_state(monkeypatch):
    target = _target(monkeypatch, RUNNING_RAYJOB, "")  # no submitter pod yet
    info = target.status("cnn-x")
    assert info.state is JobState.RUNNING and info.facts is not None
    assert target.status("cnn-x", with_facts=False).state is JobState.RUNNING


class _Kube:
    """The Kubernetes API as raytrain's client sees it, answering pod reads with ``error``."""

    def __init__(self, error):
        self.error = error
        self.core = type("Core", (), {"list_namespaced_pod": "list", "read_namespaced_pod_log": "read"})()

    def call(self, what, fn, *args, **kwargs):
        if fn is self.core.list_namespaced_pod:
            return {"items": [{"metadata": {"name": "cnn-x-submitter", "creationTimestamp": "t"}}]}
        raise self.error


def _unreadable(monkeypatch, error) -> KubeRayJobTarget:
    target = _target(monkeypatch, RUNNING_RAYJOB, "")
    monkeypatch.undo()  # the real _submitter_log, over a client whose pod-log read fails
    monkeypatch.setattr(target, "_get", lambda job_id: {"metadata": {"name": "cnn-x"}, "status": RUNNING_RAYJOB})
    target.conn = type("Conn", (_Conn,), {"kube": _Kube(error)})()
    return target


def test_a_cluster_error_reading_the_log_is_said_not_shown_as_an_empty_log(monkeypatch):
    from raytrain.errors import ClusterError

    target = _unreadable(monkeypatch, ClusterError("read the log of pod cnn-x-submitter: HTTP 403 Forbidden"))
    info = target.status("cnn-x")
    assert info.state is JobState.RUNNING
    assert info.warnings() == [
        "cannot read the job's log: read the log of pod cnn-x-submitter: HTTP 403 Forbidden "
        "(the state is the RayJob's alone)"
    ]
    assert info.to_dict()["warnings"] == info.warnings()
    with pytest.raises(ClusterError, match="RayJob cnn-x: cannot read the job's log: .*403 Forbidden"):
        target.logs("cnn-x")


def test_a_submitter_pod_gone_between_list_and_read_is_no_log_yet(monkeypatch):
    from raytrain.clusters.k8s_client import NotFound

    target = _unreadable(monkeypatch, NotFound("read the log of pod cnn-x-submitter: not found"))
    assert target.status("cnn-x").warnings() == []
    assert target.logs("cnn-x").startswith("raytrain: no log for RayJob cnn-x yet")


def test_following_a_rayjob_stuck_initializing_gives_up_saying_where_to_look(monkeypatch):
    from raytrain.errors import RaytrainError

    stuck = {"jobDeploymentStatus": "Initializing", "rayClusterName": "cnn-x-raycluster-abc"}
    target = _target(monkeypatch, stuck, "")
    target.poll_s, target.init_timeout_s = 0.01, 0.2
    lines = []
    with pytest.raises(RaytrainError, match=r"RayJob cnn-x has been Initializing for \d+ s: its Ray cluster "
                                            r"cnn-x-raycluster-abc has not come up") as err:
        target.follow("cnn-x", lines.append)
    assert "kubectl get pods -n team -l ray.io/cluster=cnn-x-raycluster-abc" in str(err.value)
    assert err.value.exit_code == 1
    assert lines == ["raytrain: RayJob cnn-x: deployment Initializing, cluster cnn-x-raycluster-abc\n"]
    running = _target(monkeypatch, {**RUNNING_RAYJOB, "rayClusterName": "c"}, "")
    running.init_timeout_s = 0.0
    running._check_not_stuck("cnn-x", RUNNING_RAYJOB, 10.0)  # started: never stuck


def test_a_driver_ended_by_a_plain_sigterm_is_stopped_not_failed():
    """Ray says FAILED for a driver a SIGTERM ended outside its job stop; the driver's last word says stopped."""
    from raytrain.events import STOPPED

    stopped = JobFacts.from_lines([*STARTED_LOG, format_event(STOPPED, signal="SIGTERM")])
    assert state_of("FAILED", stopped) is JobState.STOPPED
    assert state_of("FAILED", TRAINING) is JobState.FAILED
    assert state_of("STOPPED", stopped) is JobState.STOPPED
