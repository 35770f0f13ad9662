"""Where the job's driver and its data feeds run (raytrain.runtime.driver.head): the head node, pinned with a hard
affinity (Ray puts a CPU-less actor on a random node whatever a soft affinity says), and what a worker says when
its feed is gone. Real Ray placement across two nodes: tests/multinode/test_scaling.py."""
import pytest
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from raytrain.runtime.datasets import feed
from raytrain.runtime.datasets.source import DataError
from raytrain.runtime.driver import entrypoint, head

HEAD = head.NodeSeen("a" * 56, "10.0.0.1", is_head=True, alive=True)
WORKER = head.NodeSeen("b" * 56, "10.0.0.2", is_head=False, alive=True)


def test_a_feeder_is_pinned_hard_to_the_drivers_node(monkeypatch):
    monkeypatch.setattr(head, "this_node", lambda: HEAD.node_id)
    options = feed.feeder_options("02000000", "train")
    strategy = options["scheduling_strategy"]
    assert isinstance(strategy, NodeAffinitySchedulingStrategy)
    # soft=True is what let a CPU-less Feeder land on a worker node that the test then killed
    assert strategy.node_id == HEAD.node_id and strategy.soft is False
    assert options["num_cpus"] == 0 and options["name"] == "raytrain-data-02000000-train"


def test_the_driver_on_the_head_goes_on_and_one_on_a_worker_node_is_warned_about_naming_both():
    assert head.driver_node_problem(HEAD.node_id, [HEAD, WORKER]) is None
    problem = head.driver_node_problem(WORKER.node_id, [HEAD, WORKER])
    assert problem.startswith("the job's driver runs on the worker node 10.0.0.2 (node bbbbbbbbbbbb), not on the "
                              "head node 10.0.0.1 (node aaaaaaaaaaaa)")
    assert "RAY_JOB_ALLOW_DRIVER_ON_WORKER_NODES=1" in problem


def test_where_no_live_head_is_listed_there_is_no_warning():
    dead_head = head.NodeSeen(HEAD.node_id, HEAD.ip, is_head=True, alive=False)
    assert head.driver_node_problem(WORKER.node_id, [dead_head, WORKER]) is None
    assert head.driver_node_problem(WORKER.node_id, []) is None


def test_the_driver_checks_its_node_first_and_off_the_head_it_warns_and_goes_on(monkeypatch, capsys):
    """Off the head is the cluster owner's choice (a Ray setting): the job runs, its log says what it risks."""
    assert entrypoint.PHASES[0] is entrypoint.check_driver_node
    nodes = [entrypoint.Node(node_id=n.node_id, address=n.ip, resources={"CPU": 2.0}, alive=True, hostname="")
             for n in (HEAD, WORKER)]
    monkeypatch.setattr(entrypoint, "cluster_nodes", lambda: nodes)
    monkeypatch.setattr(head, "list_nodes", lambda: [HEAD, WORKER])
    job = entrypoint.Job(plan=None, run_name="r")
    monkeypatch.setattr(head, "this_node", lambda: WORKER.node_id)
    assert entrypoint.check_driver_node(job) is None and job.driver_ip == "10.0.0.2"
    assert "raytrain: warning: the job's driver runs on the worker node 10.0.0.2" in capsys.readouterr().err
    monkeypatch.setattr(head, "this_node", lambda: HEAD.node_id)
    assert entrypoint.check_driver_node(job) is None and job.driver_ip == "10.0.0.1"
    assert capsys.readouterr().err == ""


class _Gone:
    """A Feeder handle whose calls fail as Ray's do once the actor is gone (or never answers)."""

    def __init__(self, exc):
        self.since = self
        self.exc = exc

    def remote(self, *args):
        raise self.exc


@pytest.mark.parametrize("exc, why", [
    (__import__("ray").exceptions.ActorDiedError(), "it died: "),
    (__import__("ray").exceptions.GetTimeoutError("Get timed out"), f"it did not answer within {feed.CALL_TIMEOUT_S:.0f} s"),
])
def test_a_worker_whose_feed_is_gone_fails_naming_the_data_feed(exc, why):
    source = feed.FeedSource("train", handle=_Gone(exc))
    with pytest.raises(DataError) as err:
        source.rows_at_least(1)
    message = str(err.value)
    assert message.startswith("ctx.dataset('train'): the data feed (the job's Feeder actor on the driver's node) "
                              f"is gone, {why}")
    assert "--resume" in message and "\n" not in message
    assert err.value.__cause__ is None  # the driver reports the root cause of a failure: this line, not Ray's

