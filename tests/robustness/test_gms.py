"""Probes of the gms engine as a careless or hostile caller would write them.

Crash probes (an edited plan, a short scale, an oversize segment pointer, an index out of range,
a forged packed plan) each run in a subprocess with a timeout, so that a segfault or a hang is
recorded as a failure rather than killing pytest; each must end in one clean error naming the
argument. Property tests compare every strategy, forward and gradient, with the plain-PyTorch
reference over random problems holding empty segments, duplicate pairs and NaN/Inf in ``x``,
for every reduce: on the CPU in this process, and with the Triton kernels under Triton's
interpreter in a subprocess (so ``TRITON_INTERPRET`` does not leak into this one).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fusekit.gms import GMSProblem, Order, Strategy, gms, plan
from fusekit.gms.candidates import Dataflow
from fusekit.gms.kernels.reference import gms_reference

# ---------------------------------------------------------------------------------------------
# crash probes: a subprocess per kind, each with a timeout
# ---------------------------------------------------------------------------------------------

#: What every probe starts from: a small problem, a ``fresh()`` plan of it (with both orders),
#: operands, and ``expect``, which prints ``CLEAN <label>: <error>`` when the call raises
#: ``error`` with ``words`` in a one-line message, and makes the process exit 1 otherwise.
PRELUDE = """
import atexit
import sys
import torch
import fusekit.gms.ops  # registers torch.ops.fusekit.gms
from fusekit.gms import GMSProblem, gms, plan
from fusekit.gms.planning.layout import GMSPlan

torch.manual_seed(0)
E, N, S, K, M = 60, 12, 3, 5, 7
g, s, d = torch.randint(0, N, (E,)), torch.randint(0, S, (E,)), torch.randint(0, N, (E,))
x, w, c = torch.randn(N, K), torch.randn(S, K, M), torch.rand(E)


def fresh():
    return plan(GMSProblem.create(g, s, d, N), tile_rows=8, blocks=3)


pl = fresh()
failed = []
atexit.register(lambda: failed and sys.exit(1))


def expect(label, error, words, fn, *args, **kwargs):
    print("RUN " + label, flush=True)  # the last line if the call crashes the process
    try:
        fn(*args, **kwargs)
    except error as e:
        message = str(e)
        missing = [word for word in words if word not in message] + ["\\n"] * ("\\n" in message)
        print(("CLEAN " if not missing else f"MISSING {missing} ") + label + ": " + message)
        if missing:
            failed.append(label)
        return
    print("NO ERROR " + label)
    failed.append(label)
"""

#: Calls a kernel would read or write past their arrays for, by kind; each kind in its own
#: subprocess, each call in it expected to raise a clean error.
PROBES = {
    "edited plan, bypassing the version counter": """
        gms(x, w, pl, None, "(GMS)seg")
        pl.block_ptr.data[1] = 10**9
        expect("block_ptr via .data", ValueError, ["'plan.block_ptr'"], gms, x, w, pl)
        p2 = fresh()
        gms(x, w, p2, None, "transform-first/G-(MS)seg")
        p2.transform.plan.block_ptr.data[1] = 10**9
        expect("sub-plan block_ptr via .data", ValueError, ["'plan.transform.plan.block_ptr'"],
               gms, x, w, p2, None, "transform-first/G-(MS)seg")
        p3 = fresh()
        gms(x, w, p3, None, "G-(MS)seg")
        p3.block_ptr.numpy()[1] = p3.block_ptr[2] + 1  # in range: block 1's tiles would be lost
        expect("in-range block_ptr via numpy", ValueError, ["'plan.block_ptr'"],
               gms, x, w, p3, None, "G-(MS)seg")
        p4 = fresh()
        gms(x, w, p4, None, "(GM)seg-S")
        p4.tile_end.numpy()[0] = 10**9
        expect("tile_end via numpy", ValueError, ["'plan.tiles'"], gms, x, w, p4, None, "(GM)seg-S")
    """,
    "edited plan, through torch": """
        gms(x, w, pl, None, "G-Mseg-S")
        pl.segment_ptr[1] = 10**9  # a torch write: the version moves
        expect("segment_ptr", ValueError, ["'plan.segment_ptr'"], gms, x, w, pl, None, "G-Mseg-S")
        p2 = fresh()
        xg = x.clone().requires_grad_()
        y = gms(xg, w, p2, None, "(GMS)seg")
        p2.dst_ptr.data[2] = 10**9  # between the forward and the backward
        expect("dst_ptr before the backward", ValueError, ["'plan.dst_ptr'"], y.sum().backward)
    """,
    "short scale": """
        from fusekit.gms.kernels.cpu.gms_seg import gms_seg_cpu
        from fusekit.gms.kernels.cpu.rows import reduce_rows_cpu

        expect("op", ValueError, ["'scale'", "length 60"], torch.ops.fusekit.gms, x, w, c[:5],
               pl.packed, N, "(GMS)seg")
        expect("CPU (GMS)seg kernel", ValueError, ["'scale'", "length 60"], gms_seg_cpu, x, w, pl,
               c[:5])
        expect("CPU reduce", ValueError, ["'scale'"], reduce_rows_cpu, x, pl.dst_ptr, n_pairs=E,
               scale=c[:5], pos=pl.dst_pos, src_index=pl.gather)
    """,
    "oversize segment pointer": """
        from fusekit.gms.kernels.cpu.g_mseg_s import segment_mm
        from fusekit.gms.kernels.cpu.skinny import segment_skinny_mm

        ptr = torch.tensor([0, 2, 4, 6, 8, 10])  # five segments; w has three
        expect("segment_mm", ValueError, ["'segment_ptr'", "at most 3 segments"], segment_mm,
               torch.randn(10, K), w, ptr, out=torch.empty(10, M))
        expect("skinny segment", ValueError, ["'segments'"], segment_skinny_mm, torch.randn(10, K),
               w, ptr, [4], torch.empty(10, M))
    """,
    "out-of-range index": """
        from fusekit.gms.kernels.cpu.rows import gather_rows_cpu, reduce_rows_cpu

        expect("create", ValueError, ["'gather'", "[0, 12)"], GMSProblem.create, g + N, s, d, N,
               n_in=N)
        expect("gather kernel", ValueError, ["gather index"], gather_rows_cpu, x,
               torch.tensor([0, N, -1]))
        expect("reduce past src_index", ValueError, ["'src_index'"], reduce_rows_cpu, x,
               torch.tensor([0, 100]), n_pairs=100, src_index=pl.gather)
    """,
    "operand shapes": """
        from fusekit.gms.kernels.cpu.backward import pair_dot_cpu
        from fusekit.gms.kernels.cpu.gm_seg_s import gm_seg_s_cpu

        expect("narrow w", ValueError, ["'w'", "[S, 5, M]"], gm_seg_s_cpu, x, torch.randn(S, 2, M),
               pl, None)
        expect("narrow b", ValueError, ["'b'"], pair_dot_cpu, x, pl.gather, w, torch.randn(N, 2),
               pl.scatter, pl)
    """,
    "Triton launchers": """
        try:
            import triton
        except ImportError:
            print("SKIP: no triton (the gpu extra)")
            sys.exit(0)
        from fusekit.gms.kernels.triton.gms_seg import INTERPRETED, gms_seg_triton

        assert INTERPRETED
        gms_seg_triton(x, w, pl, None)  # the launcher's checks are now memoised
        pl.tile_end.data[0] = 10**9     # the kernel must bound positions by itself
        assert gms_seg_triton(x, w, pl, None).isfinite().all()
        expect("short scale", ValueError, ["'scale'"], gms_seg_triton, x, w, pl, c[:5])
    """,
}

#: Probes that need Triton's interpreter.
INTERPRETED = {"Triton launchers"}


def _run(code: str, *, interpret: bool, timeout: float = 300) -> tuple[int, str, str]:
    """Run ``code`` in a fresh interpreter: (return code, stdout, stderr); a hang is rc -9."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update({"OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"})  # probes run side by side
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env
        )
    except subprocess.TimeoutExpired as e:
        return -9, str(e.stdout or ""), f"timed out after {timeout} s"
    return done.returncode, done.stdout, done.stderr


@pytest.fixture(scope="module")
def probe_results() -> dict[str, tuple[int, str, str]]:
    """Every probe's outcome, the subprocesses run side by side (each with its own timeout).

    The kernels are compiled in this process first (numba's disk cache), so that the probes
    load them instead of each compiling them again.
    """
    warm_up()
    jobs = {
        name: (PRELUDE + textwrap.dedent(code), name in INTERPRETED)
        for name, code in PROBES.items()
    }
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        futures = {name: pool.submit(_run, code, interpret=i) for name, (code, i) in jobs.items()}
        return {name: future.result() for name, future in futures.items()}


def warm_up() -> None:
    """Run every CPU kernel once at a tiny size (forward and backward of every strategy)."""
    g = torch.tensor([0, 1, 1])
    for reduce in ("sum", "max"):
        pl = plan(GMSProblem.create(g, g, g, 2, reduce=reduce))
        for name in strategies(reduce):
            x, w = torch.randn(2, 3, requires_grad=True), torch.randn(2, 3, 4, requires_grad=True)
            gms(x, w, pl, torch.rand(3, requires_grad=True), name).sum().backward()


@pytest.mark.parametrize("probe", PROBES, ids=list(PROBES))
def test_probe_ends_in_one_clean_error(probe, probe_results):
    rc, out, err = probe_results[probe]
    report = f"rc={rc}\nstdout:\n{out}\nstderr:\n{err[-3000:]}"
    if rc == 0 and out.startswith("SKIP"):
        pytest.skip(out)
    assert rc == 0, report
    lines = out.strip().splitlines()
    calls = PROBES[probe].count("expect(")
    assert len(lines) == 2 * calls, report  # RUN, then CLEAN, per call
    assert all(line.startswith("CLEAN ") for line in lines[1::2]), report


def test_an_edited_plan_that_stays_consistent_is_used_as_edited():
    # re-validation, not refusal: a buffer overwritten with another consistent plan is that plan
    g, s, d = torch.tensor([0, 1, 2, 2]), torch.tensor([0, 0, 1, 1]), torch.tensor([1, 0, 2, 1])
    pl = plan(GMSProblem.create(g, s, d, 3, n_in=3), tile_rows=2, blocks=2, orders=False)
    g_other = (g + 1) % 3  # the same sizes, another problem
    other = plan(GMSProblem.create(g_other, s, d, 3, n_in=3), tile_rows=2, blocks=2, orders=False)
    x, w = torch.randn(3, 4), torch.randn(2, 4, 5)
    gms(x, w, pl, None, "(GMS)seg")
    pl.buffer.numpy()[:] = other.buffer.numpy()  # bypasses the version counter
    torch.testing.assert_close(gms(x, w, pl, None, "(GMS)seg"), gms(x, w, other))


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (
            lambda g: GMSProblem.create(g + 12, g, g, 12, n_in=12),
            "'gather' to be indices in [0, 12)",
        ),
        (lambda g: GMSProblem.create(g, g, g, 2**50), "'n_out' to be <= 2**40"),
        (
            lambda g: GMSProblem.create(g, g, g, 2**40, num_segments=2**30),
            "'num_segments * (max(n_in, n_out) + 1)' to be < 2**62",
        ),
        (lambda g: plan(GMSProblem.create(g, g, g, 12), blocks=2**41), "'blocks' to be <= 2**40"),
    ],
)
def test_sizes_and_indices_are_checked_before_any_kernel(call, words):
    with pytest.raises(ValueError) as info:
        call(torch.arange(4))
    assert words in str(info.value)


def test_a_replaced_plan_runs_what_its_buffer_holds():
    # dataclasses.replace keeps the buffer; the op reads the buffer, never the replaced field
    import dataclasses

    g = torch.arange(20) % 6
    pl = plan(GMSProblem.create(g, g % 3, g % 5, 5), tile_rows=4, blocks=2)
    bad = dataclasses.replace(pl, tile_end=torch.full_like(pl.tile_end, 10**9))
    x, w = torch.randn(6, 3), torch.randn(3, 3, 4)
    for name in ("(GMS)seg", "(GM)seg-S"):
        torch.testing.assert_close(gms(x, w, bad, None, name), gms(x, w, pl, None, name))


def test_a_forged_packed_plan_is_validated():
    from fusekit.gms.planning.layout import GMSPlan

    g = torch.arange(6) % 4
    forged = plan(GMSProblem.create(g, g % 2, g, 4)).packed.clone()
    forged[-1] = 10**9  # the transform sub-plan's last src_pos
    with pytest.raises(ValueError, match=r"'plan\.transform\.plan\.src_pos'"):
        GMSPlan.from_packed(forged)


# ---------------------------------------------------------------------------------------------
# kernels against the reference, forward and gradient
# ---------------------------------------------------------------------------------------------

KINDS = ("uniform", "empty_segments", "duplicates", "one_output_row")


def strategies(reduce: str) -> list[str]:
    """Every (order, dataflow) the reduce allows."""
    return [Strategy(o, d).name for o in Order for d in Dataflow if o.allows(reduce)]


@st.composite
def problems(draw, max_pairs: int = 40, max_width: int = 6):
    """A random problem: indices of one of :data:`KINDS`, NaN and Inf sprinkled into ``x``."""
    kind = draw(st.sampled_from(KINDS))
    reduce = draw(st.sampled_from(("sum", "mean", "max")))
    n_in, n_out = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    s, e = draw(st.integers(1, 4)), draw(st.integers(0, max_pairs))
    k, m = draw(st.integers(1, max_width)), draw(st.integers(1, max_width))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    g, seg, d = (torch.randint(0, h, (e,), generator=gen) for h in (n_in, s, n_out))
    if kind == "empty_segments":  # only the first and last segments hold pairs
        seg = torch.where(torch.rand(e, generator=gen) < 0.5, 0, s - 1)
    elif kind == "duplicates":  # few distinct pairs, each repeated
        pick = torch.randint(0, max(1, e // 5), (e,), generator=gen)
        g, seg, d = g[pick] if e else g, seg[pick] if e else seg, d[pick] if e else d
    elif kind == "one_output_row":
        d = torch.full((e,), n_out - 1)
    x = torch.randn(n_in, k, generator=gen, dtype=torch.float64)
    specials = (float("nan"), -float("nan"), float("inf"), -float("inf"))  # -nan: sign bit set
    for value in draw(st.lists(st.sampled_from(specials), max_size=3)):
        x.view(-1)[int(torch.randint(0, x.numel(), (1,), generator=gen))] = value
    w = torch.randn(s, k, m, generator=gen, dtype=torch.float64)
    c = torch.rand(e, generator=gen, dtype=torch.float64) + 0.5 if draw(st.booleans()) else None
    tiles = {"tile_rows": draw(st.sampled_from((1, 3, 8))), "blocks": draw(st.sampled_from((1, 3)))}
    return g, seg, d, n_out, s, reduce, x, w, c, tiles


def outputs_and_gradients(fn, x, w, c):
    """``(y, dx, dw, dc)`` of ``fn(x, w, c)`` against a fixed, non-uniform upstream gradient."""
    leaves = [t.detach().clone().requires_grad_() if t is not None else None for t in (x, w, c)]
    y = fn(*leaves)
    grad = torch.linspace(-1.0, 2.0, y.numel(), dtype=y.dtype).reshape(y.shape)
    if y.requires_grad:
        y.backward(grad)
    # an operand the reference's graph does not reach (no pairs) has a zero gradient
    grads = [
        None if t is None else t.grad if t.grad is not None else torch.zeros_like(t) for t in leaves
    ]
    return [y.detach(), *grads]


def assert_same(got, want, what: str, atol: float = 1e-9) -> None:
    """Values equal to ``atol`` of the largest, NaN and infinities exactly where the reference's."""
    if want is None:
        assert got is None, what
        return
    assert torch.equal(got.isnan(), want.isnan()), f"{what}: NaN at other places"
    finite = want.isfinite()
    assert torch.equal(got[~finite & ~want.isnan()], want[~finite & ~want.isnan()]), what
    scale = float(want[finite].abs().max()) if bool(finite.any()) else 0.0
    torch.testing.assert_close(got[finite], want[finite], rtol=0, atol=atol * (1 + scale), msg=what)


def check_case(case, names=None, dtype=torch.float64, atol: float = 1e-9) -> None:
    """Strategies ``names`` (default: every one the reduce allows) against the reference.

    The reference runs in float64 on the operands rounded to ``dtype``; the outputs and the
    gradients of ``x``, ``w`` and ``scale`` must agree.
    """
    g, seg, d, n_out, s, reduce, x, w, c, tiles = case
    x, w, c = x.to(dtype), w.to(dtype), None if c is None else c.to(dtype)
    problem = GMSProblem.create(g, seg, d, n_out, n_in=x.shape[0], num_segments=s, reduce=reduce)
    pl = plan(problem, **tiles)

    def reference(x_, w_, c_):
        c64 = None if c_ is None else c_.double()
        return gms_reference(x_.double(), w_.double(), g, seg, d, n_out, c64, reduce).to(dtype)

    want = outputs_and_gradients(reference, x, w, c)
    for name in names or strategies(reduce):
        got = outputs_and_gradients(lambda x_, w_, c_, n=name: gms(x_, w_, pl, c_, n), x, w, c)
        for what, a, b in zip(("y", "dx", "dw", "dscale"), got, want, strict=True):
            assert_same(a, b, f"{name} {reduce} {what}", atol)


def nan_max_cases() -> list[tuple]:
    """Max over rows with a NaN of either sign, a -inf winner, a tie and an empty row (fixed)."""
    g = torch.tensor([0, 1, 2, 3, 3, 4, 0, 3, 2])
    seg = torch.tensor([0, 1, 0, 1, 1, 0, 1, 1, 0])
    d = torch.tensor([0, 0, 1, 1, 2, 3, 3, 2, 4])  # row 2: a pair twice (a tie); row 5 empty
    nan, inf = float("nan"), float("inf")
    x = torch.tensor([[1, 2], [nan, 0.5], [-inf, 1], [0.25, 0.25], [-nan, 1]], dtype=torch.float64)
    w = torch.tensor([[[1.0, -1.0], [0.0, 0.0]], [[0.0, 2.0], [1.0, 1.0]]], dtype=torch.float64)
    c = torch.tensor([1.0, 2.0, 0.5, 1.0, 1.0, 3.0, 1.0, 1.0, 2.0], dtype=torch.float64)
    tiles = {"tile_rows": 2, "blocks": 2}
    return [(g, seg, d, 6, 2, "max", x, w, scale, tiles) for scale in (None, c)]


@pytest.mark.parametrize("case", nan_max_cases(), ids=["unscaled", "scaled"])
def test_max_propagates_nan_in_every_strategy_cpu(case):
    check_case(case)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=problems())
def test_every_strategy_equals_the_reference_cpu(case):
    check_case(case)


#: The CPU checks again with every kernel replaced by its Triton twin (the op's backend table
#: pointed at kernels/triton for CPU tensors), under Triton's interpreter, in float32.
TRITON_SCRIPT = """
import sys
try:
    import triton
except ImportError:
    print("SKIP: no triton (the gpu extra)")
    sys.exit(0)
sys.path.insert(0, {tests!r})
import torch
from hypothesis import given, settings, HealthCheck
import test_gms as t
from fusekit.gms import backends
from fusekit.gms.kernels.triton.gms_seg import INTERPRETED

assert INTERPRETED
backends.BY_DEVICE_TYPE["cpu"] = backends.triton_backend
NAMES = ("(GMS)seg", "G-(MS)seg", "(GM)seg-S", "transform-first/(GMS)seg")


def check(case):
    t.check_case(case, NAMES, torch.float32, 1e-4)


for case in t.nan_max_cases():  # NaN in max: every strategy max allows, fixed cases
    t.check_case(case, t.strategies("max"), torch.float32, 1e-4)
settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))(
    given(case=t.problems(max_pairs=12, max_width=4))(check)
)()
print("CLEAN triton")
"""


@pytest.mark.slow  # about 23 s of Triton's interpreter; tests/gms/kernels check each kernel
def test_triton_kernels_equal_the_reference_interpreted():
    rc, out, err = _run(TRITON_SCRIPT.format(tests=os.path.dirname(__file__)), interpret=True)
    if rc == 0 and out.startswith("SKIP"):
        pytest.skip(out)
    assert rc == 0 and "CLEAN triton" in out, f"rc={rc}\n{out}\n{err[-4000:]}"
