"""Nothing lost: `cluster down` never stops running jobs unasked."""
from click.testing import CliRunner

from raytrain.cli import cluster as cluster_cli
from raytrain.cli.main import main
from raytrain.clusters.base import Cluster


class Busy(Cluster):
    """A cluster with one running job that records whether it was stopped."""

    kind = "test"

    def __init__(self):
        self.stopped = False

    def up(self, *, dry_run=False):
        return ""

    def status(self):
        return {}

    def jobs_in_use(self):
        return ["raytrain-a-1 (a, running)"]

    def down(self):
        self.stopped = True
        return "stopped\n"


def _down(monkeypatch, *args, can_ask=False, answer=""):
    busy = Busy()
    monkeypatch.setattr(cluster_cli, "make_cluster", lambda options, local_jobs=None: busy)
    monkeypatch.setattr(cluster_cli, "_can_ask", lambda: can_ask)
    return busy, CliRunner().invoke(main, ["cluster", "down", *args], input=answer)


def test_down_with_running_jobs_and_no_terminal_refuses_naming_them(monkeypatch, raytrain_home):
    busy, result = _down(monkeypatch)
    assert result.exit_code == 2 and not busy.stopped
    assert "1 job(s) still run on this cluster" in result.output and "raytrain-a-1 (a, running)" in result.output
    assert "give --force to stop them with the cluster" in result.output


def test_down_asks_at_a_terminal_and_force_does_not_ask(monkeypatch, raytrain_home):
    busy, result = _down(monkeypatch, can_ask=True, answer="n\n")
    assert result.exit_code == 2 and not busy.stopped and "nothing stopped" in result.output
    busy, result = _down(monkeypatch, can_ask=True, answer="y\n")
    assert result.exit_code == 0 and busy.stopped
    busy, result = _down(monkeypatch, "--force")
    assert result.exit_code == 0 and busy.stopped and "still run" not in result.output
