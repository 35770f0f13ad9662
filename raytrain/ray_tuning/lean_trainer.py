"""Ray Train's DataParallelTrainer without what a raytrain run does not use (the ``lean_trainer`` tuning).

Ray Train's default callbacks that raytrain's jobs do without, each one more actor process (a Python start
on the node, in the seconds before step 1) and worker round trips:
- DatasetsCallback: a DatasetManager actor and Ray Data's context sent to every worker, also for a trainer
  given no datasets (raytrain never gives one: ``--data`` streams through its own Feeder actor);
- PlacementGroupCleanerCallback, on raytrain's own local cluster (the plan's ``local_cluster``, which the local
  target sets): a detached actor per run that removes the workers' placement group if the controller dies;
  there the driver removes the groups an ended job leaked before it places its own.

And a fixed-size run's scaling policy registers the run's resources with the AutoscalingCoordinator, a
detached actor shared by Ray Train and Ray Data, before it places the workers (a blocking call) and every
20 s; the first run after a cluster starts creates that actor, which then stays on the node. A node raytrain
runs itself has no autoscaler to tell: on the local cluster (``local_cluster``) the fixed policy does without
it. An elastic run keeps it: it sizes itself by what the coordinator reserves (with ``elastic_fresh_view``,
from a fresh view of the nodes: raytrain.ray_tuning.elastic_view). Both overrides are of Ray
Train's private methods (``_create_default_callbacks``, ``_initialize_and_run_controller``,
``FixedScalingPolicy._maybe_send_resource_request``).
"""
from __future__ import annotations

from typing import Any

from raytrain import ray_tuning


def dropped_callbacks(datasets: dict | None, *, local_cluster: bool | None) -> set[str]:
    """The default callbacks a run does without; ``local_cluster``: the plan's (None: not said, so not local)."""
    names = set() if datasets else {"DatasetsCallback"}
    if local_cluster:
        names.add("PlacementGroupCleanerCallback")
    return names


def coordinator_enabled(*, local_cluster: bool | None) -> bool:
    """Whether a fixed-size run registers with the AutoscalingCoordinator: everywhere but the local cluster."""
    return not local_cluster


_NO_COORDINATOR: list[type] = []


def without_coordinator(policy: Any) -> Any:
    """A fixed scaling policy that makes the same decisions and never calls the AutoscalingCoordinator;
    any other policy unchanged."""
    from ray.train.v2._internal.execution.scaling_policy.fixed import FixedScalingPolicy

    if type(policy) is not FixedScalingPolicy:
        return policy
    if not _NO_COORDINATOR:
        class FixedScalingPolicyWithoutCoordinator(FixedScalingPolicy):
            # No coordinator client is ever made, so the base class's cancel on shutdown is a no-op.
            def after_controller_start(self, train_run_context):
                self._requester_id = f"train-{train_run_context.run_id}"

            def _maybe_send_resource_request(self):
                pass

        _NO_COORDINATOR.append(FixedScalingPolicyWithoutCoordinator)
    return _NO_COORDINATOR[0](policy.scaling_config)


_LEAN: list[type] = []


def lean_trainer_class() -> type:
    """DataParallelTrainer less the default callbacks ``dropped_callbacks`` names and, where
    ``coordinator_enabled`` says so, a fixed-size run's calls to the AutoscalingCoordinator. Build it with
    ``local_cluster=plan.local_cluster`` (the plan the driver read); Ray's own arguments pass through."""
    if not _LEAN:
        from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

        class LeanDataParallelTrainer(DataParallelTrainer):
            def __init__(self, *args, local_cluster: bool | None = None, **kwargs):
                self._raytrain_local_cluster = local_cluster
                super().__init__(*args, **kwargs)

            def _create_default_callbacks(self):
                drop = dropped_callbacks(self.datasets, local_cluster=self._raytrain_local_cluster)
                return [c for c in super()._create_default_callbacks() if type(c).__name__ not in drop]

            def _initialize_and_run_controller(self, **controller_init_kwargs):
                policy = controller_init_kwargs.get("scaling_policy")
                if policy is not None:
                    if not coordinator_enabled(local_cluster=self._raytrain_local_cluster):
                        policy = without_coordinator(policy)
                    if ray_tuning.on("elastic_fresh_view"):
                        from raytrain.ray_tuning.elastic_view import fresh_view

                        policy = fresh_view(policy)
                    controller_init_kwargs["scaling_policy"] = policy
                return super()._initialize_and_run_controller(**controller_init_kwargs)

        _LEAN.append(LeanDataParallelTrainer)
    return _LEAN[0]
