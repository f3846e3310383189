"""Ray workers' settings and answers, without a Ray cluster (tests/ray_integration runs one)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import stoker
from stoker.engine.messages import Failed, StartEpoch, StartupFailed, Task, rebuild_error
from stoker.engine.ray_workers import unsendable_answer


def test_numpy_scalars_are_taken_as_plain_numbers() -> None:
    options = stoker.RayWorkers(
        num_cpus=np.float64(0.5),
        resources={"preprocess": np.int64(2), "gpu_free": np.float32(0.25)},
        start_timeout_s=np.int32(30),
    )
    asked = options.actor_options()
    assert asked == {
        "num_cpus": 0.5,
        "max_restarts": 0,
        "resources": {"preprocess": 2, "gpu_free": 0.25},
    }
    assert type(asked["num_cpus"]) is float
    assert [type(v) for v in asked["resources"].values()] == [int, float]
    assert options.start_timeout_s == 30 and type(options.start_timeout_s) is int
    assert options.describe_request() == "0.5 CPU and {'preprocess': 2, 'gpu_free': 0.25}"
    assert stoker.RayWorkers(num_cpus=np.int64(2)).actor_options()["num_cpus"] == 2


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"num_cpus": -1}, "RayWorkers(num_cpus=...) must be a number >= 0, got -1"),
        ({"num_cpus": True}, "RayWorkers(num_cpus=...) must be a number >= 0, got True"),
        ({"num_cpus": "2"}, "RayWorkers(num_cpus=...) must be a number >= 0, got '2'"),
        (
            {"resources": {"preprocess": 0}},
            "RayWorkers(resources=...)['preprocess'] must be a number > 0, got 0",
        ),
        (
            {"resources": {"preprocess": float("nan")}},
            "RayWorkers(resources=...)['preprocess'] must be a number > 0, got nan",
        ),
        (
            {"resources": {3: 1}},
            "RayWorkers(resources=...) maps resource names to positive amounts, such as "
            '{"preprocess": 1}; got the name 3',
        ),
        (
            {"start_timeout_s": 0},
            "RayWorkers(start_timeout_s=...) must be a number > 0, got 0",
        ),
    ],
)
def test_bad_requests_are_refused_naming_the_argument(arguments, message) -> None:
    with pytest.raises(ValueError) as caught:
        stoker.RayWorkers(**arguments)
    assert str(caught.value) == message


def _unpicklable_return() -> pickle.PicklingError:
    return pickle.PicklingError("cannot pickle '_thread.lock' object")


def test_a_batch_ray_could_not_carry_back_is_that_batchs_failure() -> None:
    task = Task(task_id=7, epoch=2, indices=[0, 1], slot=None, batch_index=3, position=6)
    answer = unsendable_answer(4, task, _unpicklable_return())
    assert isinstance(answer, Failed)
    assert (answer.task_id, answer.epoch, answer.worker_id) == (7, 2, 4)
    assert answer.failure.text == "cannot pickle '_thread.lock' object"


def test_an_epoch_start_ray_could_not_carry_back_is_the_workers_start_up_failure() -> None:
    answer = unsendable_answer(4, StartEpoch(epoch=0, seed=1), _unpicklable_return())
    assert isinstance(answer, StartupFailed)
    assert not hasattr(answer, "task_id")  # no task number for the iterator to look up
    error = rebuild_error(answer.failure, 4, "in worker_init_fn or while starting the worker", None)
    assert isinstance(error, pickle.PicklingError)
    assert str(error) == "cannot pickle '_thread.lock' object"
    assert "Raised in stoker worker 4" in "\n".join(getattr(error, "__notes__", []))
