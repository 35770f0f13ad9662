"""Names that mean one thing, with the older spellings users typed still accepted (issue 42)."""
from click.testing import CliRunner

from raytrain.cli.main import main
from raytrain.config.options import Options
from raytrain.config.resolve import resolve
from tests.conftest import JOBS


def test_cluster_commands_take_cluster_name_as_submit_does_and_still_name(raytrain_home):
    """`--cluster NAME` names the RayCluster on submit and jobs; cluster up/status/down take it too."""
    runner = CliRunner()
    for spelling in ("--cluster", "--name"):
        r = runner.invoke(main, ["cluster", "status", spelling, "x"])  # a k8s option without --k8s: refused
        assert r.exit_code == 2, r.output
        assert "Kubernetes option" in r.output, r.output
    assert "--cluster" in runner.invoke(main, ["cluster", "up", "--help"]).output


def test_activation_checkpointing_has_its_own_name_and_keeps_the_old_one():
    from raytrain.runtime.worker.context import TrainContext

    ctx = TrainContext(resolve(Options(job=str(JOBS / "cnn.py"), workers=1)), rank=0, local_rank=0, world_size=1,
                       device="cpu")
    assert ctx.activation_checkpointed(lambda x: x + 1, 1) == 2
    assert type(ctx).checkpointed is type(ctx).activation_checkpointed


def test_the_config_file_is_not_called_a_profile_in_help():
    """`--config FILE` is a config file; a profile is `cluster up --profile`'s cluster file."""
    runner = CliRunner()
    help_text = " ".join(runner.invoke(main, ["submit", "--help"]).output.split())
    assert "config file" in help_text and "profile" not in help_text.split("--config", 1)[1].split("--", 1)[0]
