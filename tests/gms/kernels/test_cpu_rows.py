import pytest
import torch

from fusekit.gms.kernels.cpu.rows import gather_rows_cpu, reduce_rows_cpu
from fusekit.gms.memory import release_scratch, scratch


def test_gather_rows():
    x = torch.randn(6, 5)
    index = torch.tensor([5, 0, 0, 3])
    torch.testing.assert_close(gather_rows_cpu(x, index), x[index])
    assert gather_rows_cpu(x, index[:0]).shape == (0, 5)


def test_gather_rows_guards_its_index():
    with pytest.raises(ValueError, match="plan gather index"):
        gather_rows_cpu(torch.randn(6, 5), torch.tensor([0, 6]))


@pytest.mark.parametrize("reduce_max", [False, True])
def test_reduce_rows_walks_the_csr(reduce_max):
    src = torch.randn(7, 3)
    src_index = torch.tensor([6, 0, 2, 2, 5])
    scale = torch.tensor([1.0, -2.0, 0.5, 3.0, 1.5])
    ptr = torch.tensor([0, 2, 2, 5])  # row 1 gets nothing
    pos = torch.tensor([4, 1, 0, 3, 2])
    out = reduce_rows_cpu(
        src, ptr, n_pairs=5, src_index=src_index, scale=scale, pos=pos, reduce_max=reduce_max
    )
    values = scale[:, None] * src[src_index]
    rows = [pos[0:2], pos[0:0], pos[2:5]]
    expected = torch.stack(
        [
            (values[r].max(0).values if reduce_max else values[r].sum(0))
            if len(r)
            else torch.zeros(3)
            for r in rows
        ]
    )
    torch.testing.assert_close(out, expected)


def test_reduce_rows_identity_defaults():
    src = torch.randn(4, 2)
    out = reduce_rows_cpu(src, torch.tensor([0, 1, 4]), n_pairs=4)
    torch.testing.assert_close(out, torch.stack([src[0], src[1:].sum(0)]))


@pytest.mark.parametrize(
    ("ptr", "pos", "src_index"),
    [
        ([0, 2, 9], None, None),  # pointer past the positions
        ([0, 3, 1], None, None),  # decreasing pointer
        ([0, 2, 4], [0, 1, 2, 7], None),  # position out of range
        ([0, 2, 4], None, [0, 1, 2, 40]),  # source row out of range
    ],
)
def test_reduce_rows_guards_every_index(ptr, pos, src_index):
    with pytest.raises(ValueError, match="plan CSR"):
        reduce_rows_cpu(
            torch.randn(4, 2),
            torch.tensor(ptr),
            n_pairs=4,
            pos=None if pos is None else torch.tensor(pos),
            src_index=None if src_index is None else torch.tensor(src_index),
        )


@pytest.mark.parametrize("reduce_max", [False, True])
def test_reduce_rows_writes_every_row_of_a_new_output(reduce_max):
    # Without ``out`` the result is allocated uninitialised: every row, including rows without
    # entries, must be written. Fill the allocator's memory with NaN first so a missed row shows.
    src = torch.randn(5, 37)
    ptr = torch.tensor([0, 0, 2, 2, 5, 5])  # rows 0, 2 and 4 get nothing
    pos = torch.tensor([3, 0, 4, 1, 2])
    scale = torch.tensor([0.5, -1.0, 2.0, 1.5, -0.25])
    values = scale[:, None] * src
    pick = (lambda v: v.max(0).values) if reduce_max else (lambda v: v.sum(0))
    expected = torch.zeros(5, 37)
    expected[1], expected[3] = pick(values[pos[0:2]]), pick(values[pos[2:5]])
    for _ in range(3):
        torch.full((5, 37), float("nan"))
        out = reduce_rows_cpu(src, ptr, n_pairs=5, scale=scale, pos=pos, reduce_max=reduce_max)
        torch.testing.assert_close(out, expected)


def test_reduce_rows_without_pairs_is_zero():
    out = reduce_rows_cpu(torch.randn(0, 6), torch.zeros(4, dtype=torch.int64), n_pairs=0)
    torch.testing.assert_close(out, torch.zeros(3, 6))


@pytest.mark.parametrize("reduce_max", [False, True])
def test_reduce_rows_accumulates_into_a_given_output(reduce_max):
    src = torch.randn(4, 3)
    ptr = torch.tensor([0, 3, 3, 4])  # row 1 gets nothing and keeps its value (sum)
    out = torch.randn(3, 3)
    start = out.clone()
    got = reduce_rows_cpu(src, ptr, n_pairs=4, out=out, reduce_max=reduce_max)
    assert got is out
    if reduce_max:
        expected = torch.stack(
            [torch.maximum(start[0], src[:3].max(0).values), torch.zeros(3), start[2].max(src[3])]
        )
    else:
        expected = torch.stack([start[0] + src[:3].sum(0), start[1], start[2] + src[3]])
    torch.testing.assert_close(got, expected)


def test_scratch_is_reused_per_thread():
    import threading

    release_scratch()
    first = scratch("products", 12, 8, torch.float32)
    again = scratch("products", 12, 8, torch.float32)
    assert again.data_ptr() == first.data_ptr() and again.shape == (12, 8)
    smaller = scratch("products", 5, 4, torch.float32)  # a view of the same memory
    assert smaller.data_ptr() == first.data_ptr() and smaller.is_contiguous()
    assert scratch("products", 12, 8, torch.float64).data_ptr() != first.data_ptr()
    assert scratch("rows", 12, 8, torch.float32).data_ptr() != first.data_ptr()
    larger = scratch("products", 40, 8, torch.float32)  # grown: a new buffer
    assert larger.shape == (40, 8) and scratch("products", 12, 8, torch.float32).shape == (12, 8)
    other = []
    thread = threading.Thread(
        target=lambda: other.append(scratch("products", 12, 8, torch.float32).data_ptr())
    )
    thread.start()
    thread.join()
    assert other[0] != larger.data_ptr()
    release_scratch()
    assert scratch("products", 12, 8, torch.float32).data_ptr() != larger.data_ptr()


def test_gather_rows_checks_its_output():
    x = torch.randn(6, 5)
    index = torch.tensor([5, 0, 3])
    out = torch.empty(3, 5)
    assert gather_rows_cpu(x, index, out=out) is out
    torch.testing.assert_close(out, x[index])
    for bad in (torch.empty(2, 5), torch.empty(3, 5, dtype=torch.float64), torch.empty(5, 3).t()):
        with pytest.raises(ValueError, match="'out'"):
            gather_rows_cpu(x, index, out=bad)
