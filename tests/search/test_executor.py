import pytest

from fusekit.search import Executor, LocalExecutor, SerialExecutor, default_workers


def square(x: int) -> int:
    return x * x


def fail_on_three(x: int) -> int:
    if x == 3:
        raise ValueError("three")
    return x


@pytest.mark.parametrize(
    "make", [SerialExecutor, lambda: LocalExecutor(1), lambda: LocalExecutor(2)]
)
def test_map_keeps_order(make):
    with make() as ex:
        assert isinstance(ex, Executor)
        assert ex.map(square, range(10), chunksize=3) == [x * x for x in range(10)]
        assert ex.map(square, []) == []


def test_local_executor_propagates_worker_errors():
    with LocalExecutor(2) as ex, pytest.raises(ValueError, match="three"):
        ex.map(fail_on_three, range(5))


def test_closed_executor_refuses_work():
    ex = LocalExecutor(2)
    ex.close()
    with pytest.raises(RuntimeError, match="closed"):
        ex.map(square, [1])


@pytest.mark.parametrize("workers", [0, -1, 1.5, True])
def test_bad_workers(workers):
    with pytest.raises(ValueError, match="workers"):
        LocalExecutor(workers)


def test_bad_chunksize():
    with pytest.raises(ValueError, match="chunksize"):
        SerialExecutor().map(square, [1], chunksize=0)


def test_default_workers_is_positive():
    assert default_workers() >= 1
    assert LocalExecutor().workers == default_workers()


@pytest.mark.slow  # starts a local Ray instance (about 10 s)
def test_ray_executor_runs_on_a_local_ray_instance():
    pytest.importorskip("ray")
    from fusekit.search import RayExecutor

    with RayExecutor(workers=1) as ex:
        assert isinstance(ex, Executor)
        assert ex.map(square, range(7), chunksize=3) == [i * i for i in range(7)]
        assert ex.map(square, []) == []
    with pytest.raises(RuntimeError, match="closed"):
        ex.map(square, [1])
    with pytest.raises(ValueError, match="workers"):
        RayExecutor(workers=0)
