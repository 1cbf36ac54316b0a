import numba
import torch

from fusekit.gms.launch import Launch, current, launch


def test_launch_applies_and_restores_cpu_threads_and_chunks():
    before = (numba.get_num_threads(), numba.get_parallel_chunksize(), torch.get_num_threads())
    settings = Launch(threads=1, chunk=1)
    assert current() == Launch()
    with launch(settings) as active:
        assert active is settings and current() is settings
        assert numba.get_num_threads() == 1 and torch.get_num_threads() == 1
        assert numba.get_parallel_chunksize() == 1
    assert current() == Launch()
    assert (
        numba.get_num_threads(),
        numba.get_parallel_chunksize(),
        torch.get_num_threads(),
    ) == before


def test_launch_restores_after_an_error():
    before = torch.get_num_threads()
    try:
        with launch(Launch(threads=1)):
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert torch.get_num_threads() == before and current() == Launch()


def test_gpu_settings_leave_cpu_threads_alone():
    before = torch.get_num_threads()
    with launch(Launch(block_e=32, num_warps=8)):
        assert current().block_e == 32 and torch.get_num_threads() == before
