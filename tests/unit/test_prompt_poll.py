"""raytrain.ray_tuning.prompt_poll: Ray Train's real controller class with raytrain's wait between polls, driven
on an event loop with a worker group that records when it is polled (no Ray cluster: the rest of the
controller is Ray's, exercised by every e2e job)."""
import asyncio
import time
import types

import pytest

from raytrain.ray_tuning import prompt_poll


class RecordingGroup:
    def __init__(self):
        self.polls: list[float] = []

    def poll_status(self, timeout=None):
        self.polls.append(time.monotonic())
        return "status"


def make_controller(interval_s: float):
    controller = object.__new__(prompt_poll.controller_class())  # Ray's __init__ needs a whole run's context
    controller._health_check_interval_s = interval_s
    controller._latest_poll_time = float("-inf")
    controller._worker_group = RecordingGroup()
    controller.get_state = lambda: types.SimpleNamespace(is_terminal=lambda: False)
    return controller


def test_it_is_ray_trains_controller_under_its_own_name():
    from ray import cloudpickle
    from ray.train.v2._internal.execution.controller import TrainController

    cls = prompt_poll.controller_class()
    assert issubclass(cls, TrainController) and cls is not TrainController
    assert cls.__name__ == "TrainController"  # logs and process titles read as with Ray's
    assert prompt_poll.controller_class() is cls
    # Ray ships the actor class to the controller's process by value
    assert cloudpickle.loads(cloudpickle.dumps(cls)).raytrain_poll_soon


def test_polls_wait_for_the_interval_unless_a_worker_asks(monkeypatch):
    controller = make_controller(interval_s=30.0)
    polls = controller._worker_group.polls

    async def scenario():
        assert await controller._poll_workers() == "status"  # the first poll: at once
        assert len(polls) == 1
        waiting = asyncio.ensure_future(controller._poll_workers())
        await asyncio.sleep(0.3)
        assert not waiting.done() and len(polls) == 1  # the next regular poll is 30 s away
        asked = time.monotonic()
        await controller.raytrain_poll_soon(0.6)
        await asyncio.wait_for(waiting, 2)
        assert len(polls) == 2 and polls[1] - asked < 0.2  # at once
        while time.monotonic() < asked + 0.6:  # then every FAST_S for the window
            await asyncio.wait_for(controller._poll_workers(), 2)
        gaps = [b - a for a, b in zip(polls[1:], polls[2:])]
        assert len(gaps) >= 5 and all(0.04 <= g < 0.3 for g in gaps), gaps
        after = asyncio.ensure_future(controller._poll_workers())  # the window is over: 30 s again
        await asyncio.sleep(0.3)
        assert not after.done()
        await controller.raytrain_poll_soon(0)  # an ask with no window: one poll now
        await asyncio.wait_for(after, 2)

    asyncio.run(scenario())


def test_an_ask_while_polls_are_regular_shortens_only_the_current_wait():
    controller = make_controller(interval_s=0.2)
    polls = controller._worker_group.polls

    async def scenario():
        for _ in range(4):
            await controller._poll_workers()
        gaps = [b - a for a, b in zip(polls, polls[1:])]
        assert all(g >= 0.19 for g in gaps), gaps  # Ray's contract: at least the interval between polls

    asyncio.run(scenario())


def test_installed_swaps_ray_trains_controller_for_the_run(monkeypatch):
    from ray.train.v2.api import data_parallel_trainer

    ray_s = data_parallel_trainer.TrainController
    with prompt_poll.installed():
        assert data_parallel_trainer.TrainController is prompt_poll.controller_class()
    assert data_parallel_trainer.TrainController is ray_s
    with pytest.raises(RuntimeError), prompt_poll.installed():
        raise RuntimeError("fit failed")
    assert data_parallel_trainer.TrainController is ray_s  # restored however fit ends
    monkeypatch.setenv("RAYTRAIN_RAY_TUNING", "off")
    with prompt_poll.installed():
        assert data_parallel_trainer.TrainController is ray_s


def test_without_prompt_polls_the_driver_polls_every_0_2_s_unless_told(monkeypatch):
    monkeypatch.delenv(prompt_poll.INTERVAL_ENV, raising=False)
    prompt_poll.configure_driver_env()
    assert prompt_poll.INTERVAL_ENV not in __import__("os").environ  # Ray's 2 s, with prompt polls
    monkeypatch.setenv("RAYTRAIN_RAY_TUNING", "off")
    prompt_poll.configure_driver_env()
    assert __import__("os").environ[prompt_poll.INTERVAL_ENV] == "0.2"
    monkeypatch.setenv(prompt_poll.INTERVAL_ENV, "1.5")
    prompt_poll.configure_driver_env()
    assert __import__("os").environ[prompt_poll.INTERVAL_ENV] == "1.5"  # the job's own value stands


def test_the_job_env_no_longer_sets_ray_trains_poll_interval():
    from raytrain.targets.base import LOCAL_RUNTIME_ENV_VARS, RUNTIME_ENV_VARS

    assert prompt_poll.INTERVAL_ENV not in RUNTIME_ENV_VARS and prompt_poll.INTERVAL_ENV not in LOCAL_RUNTIME_ENV_VARS


def test_ask_outside_a_ray_train_worker_is_a_no_op():
    assert prompt_poll.ask() is False
