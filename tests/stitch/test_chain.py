"""Chains: runs of a plan's CPU kernels launched by one call (fusekit.stitch.chain)."""

import threading

import numba
import pytest
import torch

from fusekit.hw import CPUTarget, detect
from fusekit.ir import capture
from fusekit.stitch.chain import ALIGN, Chain, _arena
from fusekit.stitch.runner import PlannedGraph
from fusekit.stitch.search import plan
from fusekit.stitch.workloads import load_workload


@pytest.fixture(scope="module")
def target() -> CPUTarget:
    return detect()


class Residuals(torch.nn.Module):
    """Residual adds and LayerNorms, GPT-2's stream: many kernels with views between."""

    def __init__(self, layers: int = 3, width: int = 32) -> None:
        super().__init__()
        self.norms = torch.nn.ModuleList(torch.nn.LayerNorm(width) for _ in range(layers))

    def forward(self, x: torch.Tensor, *deltas: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outs = []
        for norm, d in zip(self.norms, deltas, strict=True):
            x = x + d.view(x.shape)
            y = norm(x)
            outs += [y.view(-1, x.shape[-1]), y.view(-1, x.shape[-1]).t()]
        return (x, *outs)


def _planned(module: torch.nn.Module, args: tuple[torch.Tensor, ...], target: CPUTarget):
    cap = capture(module, args)
    return cap, PlannedGraph(plan(cap.graph, target), cap.constants)


def _args(seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    deltas = (torch.randn(32, 32, generator=g) for _ in range(3))
    return (torch.randn(4, 8, 32, generator=g), *deltas)


def _chains(planned: PlannedGraph) -> list[Chain]:
    return [k for k, _ in planned.steps or [] if isinstance(k, Chain)]


def test_a_chain_runs_from_the_second_call_and_equals_each_kernel_in_turn(target):
    module, args = Residuals(), _args()
    cap, planned = _planned(module, args, target)
    first = planned.run(cap.values(*args))  # kernel by kernel; then the steps are chained
    (chain,) = _chains(planned)
    assert len(chain.kernels) >= 3
    for _ in range(2):  # the program built, then reused (its arena too)
        got = planned.run(cap.values(*args))
        assert set(got) == set(first)
        for name, value in first.items():
            assert torch.equal(got[name], value), name
            assert got[name].stride() == value.stride(), name
    assert [p for p in chain.programs.values() if p is not None]
    with torch.no_grad():
        want = module(*args)
    for name, value in zip(cap.graph.outputs, want, strict=True):
        torch.testing.assert_close(got[name], value, rtol=1e-5, atol=1e-5)


def test_returned_views_share_their_buffer_and_fresh_outputs_are_new_each_call(target):
    args = _args()
    cap, planned = _planned(Residuals(), args, target)
    planned.run(cap.values(*args))
    a = planned.run(cap.values(*args))
    b = planned.run(cap.values(*args))
    views = [n for n in a if not a[n].is_contiguous()]
    assert views  # the transposes
    for n in views:  # a view of an output the same call returns, not of the arena
        assert any(a[n].data_ptr() == a[m].data_ptr() for m in a if m != n)
    for n in a:  # the caller keeps each call's outputs: none is overwritten by the next
        assert a[n].data_ptr() != b[n].data_ptr()
        assert torch.equal(a[n], b[n])


def test_other_input_strides_make_another_program_or_run_each_kernel(target):
    args = _args()
    cap, planned = _planned(Residuals(), args, target)
    want = planned.run(cap.values(*args))
    deltas = [d.t().contiguous().t() for d in args[1:]]  # same values, column-major
    for _ in range(2):
        got = planned.run(cap.values(args[0], *deltas))
        for name, value in want.items():
            assert torch.equal(got[name], value), name
    planned.run(cap.values(*args))
    (chain,) = _chains(planned)
    assert len(chain.programs) == 2  # column-major deltas: copied first, so kernel by kernel
    assert any(p is None for p in chain.programs.values())


def test_a_new_thread_count_makes_a_program_of_its_chunks(target, monkeypatch):
    monkeypatch.setattr("fusekit.stitch.codegen.cpu.SERIAL_MAX_BYTES", 0)  # parallel kernels
    args = _args()
    cap, planned = _planned(Residuals(), args, target)
    want = planned.run(cap.values(*args))
    planned.run(cap.values(*args))  # chained, for this pool's threads
    before = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        got = planned.run(cap.values(*args))
    finally:
        numba.set_num_threads(before)
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=1e-6, atol=1e-6)
    (chain,) = _chains(planned)
    assert not chain.serial
    assert {key[0] for key in chain.programs} == {1} | ({before} if before != 1 else set())


def test_a_serial_chain_keeps_its_program_across_thread_counts(target):
    args = _args()
    cap, planned = _planned(Residuals(), args, target)  # small: every kernel runs serially
    planned.run(cap.values(*args))
    planned.run(cap.values(*args))
    before = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        planned.run(cap.values(*args))
    finally:
        numba.set_num_threads(before)
    (chain,) = _chains(planned)
    assert chain.serial and len(chain.programs) == 1


def test_calls_from_two_threads_at_once_are_each_right(target):
    args = _args()
    cap, planned = _planned(Residuals(), args, target)
    want = planned.run(cap.values(*args))
    planned.run(cap.values(*args))
    errors: list[str] = []

    def work() -> None:
        for _ in range(20):
            got = planned.run(cap.values(*args))
            errors.extend(n for n, v in want.items() if not torch.equal(got[n], v))

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


@pytest.mark.parametrize(
    "name",
    [pytest.param("bert", marks=pytest.mark.slow), "layernorm_bwd", "bias_dropout_res_ln"],
)
def test_workloads_chained_equal_their_kernels_in_turn(name, target):
    w = load_workload(name, small=True)
    cap, planned = _planned(w.module, w.args, target)
    values = cap.values(*w.args)
    each = planned.run_each(values)
    planned.run(values)
    got = planned.run(values)
    for n, value in each.items():
        assert torch.equal(got[n], value), n


def test_arena_slots_share_bytes_only_when_their_lives_do_not_overlap():
    slots = {
        "a": (100, (0, 1)),  # written by kernel 0, last read by kernel 1
        "b": (100, (1, 2)),  # written by 1 while a is read: apart from a
        "c": (300, (2, 3)),  # a is dead: a's bytes, not b's
        "d": (10, (3, 3)),
    }
    at, size = _arena(slots)
    assert all(v % ALIGN == 0 for v in at.values())

    def span(n: str) -> range:
        return range(at[n], at[n] + -(-slots[n][0] // ALIGN) * ALIGN)

    for x in slots:
        for y in slots:
            lx, ly = slots[x][1], slots[y][1]
            if x < y and lx[0] <= ly[1] and ly[0] <= lx[1]:
                assert not set(span(x)) & set(span(y)), (x, y)
    assert at["a"] == 0 and at["c"] != at["b"]
    assert size < sum(-(-s // ALIGN) * ALIGN for s, _ in slots.values())


class TwoSums(torch.nn.Module):
    """A column sum and a row sum, both read by a last elementwise kernel and not returned."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cols = torch.softmax(x, dim=0).sum(0, keepdim=True)
        rows = torch.softmax(x, dim=1).amax(1, keepdim=True)
        return x * cols - rows


def test_intermediates_alive_together_get_their_own_arena_bytes(target):
    x = torch.randn(64, 48, generator=torch.Generator().manual_seed(0))
    cap, planned = _planned(TwoSums(), (x,), target)
    want = planned.run(cap.values(x))
    got = planned.run(cap.values(x))
    (chain,) = _chains(planned)
    (program,) = chain.programs.values()
    assert program is not None and program.arena_bytes > 0  # the sums live in the arena
    for name, value in want.items():
        assert torch.equal(got[name], value), name
    with torch.no_grad():
        torch.testing.assert_close(got[cap.graph.outputs[0]], TwoSums()(x), rtol=1e-5, atol=1e-5)
