"""CPU code generation: the interleave forced on groups that evaluate approximated functions."""

import logging

import pytest
import torch

from fusekit.hw import CPUTarget, detect
from fusekit.ir.text import parse_graph
from fusekit.stitch.codegen.cpu import INTERLEAVE, CpuKernel, interleave_count
from fusekit.stitch.runner import Stitched, reference_group
from fusekit.stitch.schemes import analyze
from fusekit.stitch.workloads import MaskedSoftmax, load_workload


@pytest.fixture(scope="module")
def target() -> CPUTarget:
    return detect()


def _kernels(module: torch.nn.Module, args: tuple[torch.Tensor, ...], target: CPUTarget):  # type: ignore[no-untyped-def]
    cap, planned = Stitched(module, target).prepare(*args)
    env = dict(cap.values(*args))
    for group, kernel in zip(planned.plan.groups, planned.kernels, strict=True):
        yield planned.plan.graph, group, kernel, env
        env.update(kernel(env))


def test_interleave_only_for_approximated_functions_on_long_rows(target: CPUTarget) -> None:
    counts = {}
    for name in ("bias_gelu", "masked_softmax", "layernorm_fwd"):
        w = load_workload(name, small=True)
        for graph, _, kernel, _ in _kernels(w.module, w.args, target):
            if isinstance(kernel, CpuKernel):
                counts[name] = interleave_count(graph, kernel.layout)
    assert counts["bias_gelu"] == INTERLEAVE  # erf, rows of 160
    assert counts["masked_softmax"] == 0  # exp, but rows of 16: all in the scalar remainder
    assert counts["layernorm_fwd"] == 0  # no approximated function


def test_interleaved_softmax_matches_reference(target: CPUTarget) -> None:
    """Rows of 136: four interleaved vector iterations (32 lanes), then a remainder of 8."""
    g = torch.Generator().manual_seed(0)
    s = torch.randn(2, 3, 5, 136, generator=g)
    mask = torch.zeros(2, 1, 1, 136)
    mask[..., 100:] = -1e4
    module, args = MaskedSoftmax(0.125), (s, mask)
    seen = 0
    for graph, group, kernel, env in _kernels(module, args, target):
        if not isinstance(kernel, CpuKernel):
            continue
        assert kernel.interleave == INTERLEAVE
        assert f"-force-vector-interleave={INTERLEAVE}" in kernel.source
        for variant in (kernel, CpuKernel(graph, kernel.layout, serial=not kernel.serial)):
            got = variant(env)
            for k, v in reference_group(graph, group.ops, env).items():
                torch.testing.assert_close(got[k], v, rtol=1e-5, atol=1e-6)
        seen += 1
    assert seen == 1
    with torch.no_grad():
        torch.testing.assert_close(Stitched(module, target)(*args), module(*args))


class Rotary(torch.nn.Module):
    """``q * cos + rotate_half(q) * sin``: a ``cat`` of the negated upper and the lower half."""

    def forward(self, q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = q.shape[-1] // 2
        return q * cos + torch.cat((-q[..., half:], q[..., :half]), dim=-1) * sin


class CatSum(torch.nn.Module):
    """Three pieces along the last dim, then a column sum: a 3-way ``where`` per element."""

    def forward(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor):  # type: ignore[no-untyped-def]
        y = torch.cat((a, b + 1, c * 2), dim=-1)
        return y, y.sum(0)


@pytest.mark.parametrize("case", ["rotary", "cat_sum"])
def test_piece_loops_are_split_and_versioned(target: CPUTarget, case: str) -> None:
    """A ``cat`` loops its pieces as digits (``i_hi``, ``i_lo``) and spells the innermost loop
    once per piece, each loading only its piece; every variant equals the reference."""
    g = torch.Generator().manual_seed(0)
    if case == "rotary":
        module: torch.nn.Module = Rotary()
        args: tuple[torch.Tensor, ...] = (
            torch.randn(2, 4, 6, 16, generator=g), torch.randn(6, 16, generator=g),
            torch.randn(6, 16, generator=g),
        )  # fmt: skip
    else:
        module = CatSum()
        args = tuple(torch.randn(12, 8, generator=g) for _ in range(3))
    sources = []
    for graph, group, kernel, env in _kernels(module, args, target):
        if not isinstance(kernel, CpuKernel):
            continue
        sources.append(kernel.source)
        for variant in (kernel, CpuKernel(graph, kernel.layout, serial=not kernel.serial)):
            got = variant(env)
            for k, v in reference_group(graph, group.ops, env).items():
                torch.testing.assert_close(got[k], v, rtol=1e-5, atol=1e-6)
    body = "\n".join(sources)
    assert "_piece" in body and "if (in_" in body  # versioned on the piece table
    if case == "rotary":
        assert "_hi in range(" in body  # the last dim looped as two digits
    with torch.no_grad():
        torch.testing.assert_close(Stitched(module, target)(*args), module(*args))


def test_a_recomputed_value_that_reads_a_row_buffer_sets_its_index(target: CPUTarget) -> None:
    # LayerNorm's output stage recomputes x - mean, whose x (the GELU) is a row buffer: the
    # stage must compute the buffer's index itself (it read a stale one, the last of the
    # previous stage, before)
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(16, 128), torch.nn.GELU(), torch.nn.LayerNorm(128))
    x = torch.randn(32, 16)
    kernels = [k for *_, k, _ in _kernels(module, (x,), target) if isinstance(k, CpuKernel)]
    (kernel,) = [k for k in kernels if "buf_gelu" in k.source]
    last_stage = kernel.source.split("for a1 in range(n_a1):")[-1]
    assert "buf_gelu" in last_stage and "layer_norm_cent" not in last_stage.split("=")[0]
    with torch.no_grad():
        torch.testing.assert_close(Stitched(module, target)(x), module(x), rtol=1e-5, atol=1e-5)


class Wheres(torch.nn.Module):
    """A ReLU backward (plain reads) and a slice_scatter (its source at ``(j + 8) % 16``)."""

    def forward(self, x: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        relu_grad = torch.where(x <= 0, 0.0, g)
        scattered = torch.slice_scatter(x * 2.0, g[:, :16] * 3.0, dim=1, start=8, end=24)
        return relu_grad, scattered


def _value_lines(kernel: CpuKernel) -> list[str]:
    body = kernel.source.split("\ndef rows(")[1].split("\ndef chunk(")[0]
    return [ln.strip() for ln in body.splitlines() if ln.strip().startswith("v_")]


def test_a_where_whose_branches_stay_in_bounds_is_a_select(target: CPUTarget) -> None:
    g = torch.Generator().manual_seed(0)
    args = (torch.randn(8, 64, generator=g), torch.randn(8, 64, generator=g))
    selects = []
    for graph, group, kernel, env in _kernels(Wheres(), args, target):
        if isinstance(kernel, CpuKernel):
            selects += [ln for ln in _value_lines(kernel) if "sel(" in ln]
            got = kernel(env)
            for k, v in reference_group(graph, group.ops, env).items():
                torch.testing.assert_close(got[k], v)
    assert len(selects) == 2, selects  # no branch per element left
    assert not [ln for ln in selects if " if " in ln]


def test_a_where_with_a_read_that_may_leave_bounds_keeps_its_branch(target: CPUTarget) -> None:
    # x[i - 2] is out of bounds for i < 2: only the condition may decide to read it
    g = parse_graph(
        """
        input m: float32[64]
        input x: float32[64]
        tensor y: float32[64]
        y[i] = where(gt(m[i], 0.5), x[i - 2], 0.0)
        output y
        """
    )
    kernel = CpuKernel(g, analyze(g, ["y"]))
    (line,) = [ln for ln in _value_lines(kernel) if ln.startswith("v_y")]
    assert "sel(" not in line and " if " in line
    m = (torch.arange(64) >= 2).float()
    x = torch.randn(64)
    want = torch.where(m == 1.0, torch.roll(x, 2), torch.zeros(()))
    torch.testing.assert_close(kernel({"m": m, "x": x})["y"], want)


class SwiGLU(torch.nn.Module):
    """SwiGLU on GEMM outputs, whose reshapes the graph also returns (saved for a backward)."""

    def forward(self, g: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, ...]:
        g3, u3 = g.view(4, 8, 48), u.view(4, 8, 48)
        return g3, u3, torch.nn.functional.silu(g3) * u3


def test_returned_reshapes_of_a_kernels_inputs_are_views_not_copies(target: CPUTarget) -> None:
    g = torch.Generator().manual_seed(0)
    args = (torch.randn(32, 48, generator=g), torch.randn(32, 48, generator=g))
    (kernel,) = [k for *_, k, _ in _kernels(SwiGLU(), args, target) if isinstance(k, CpuKernel)]
    assert len(kernel._views) == 2
    assert kernel.source.count("out_") == kernel.source.count("out_mul") > 0  # one output
    got = Stitched(SwiGLU(), target)(*args)
    for out, src in zip(got[:2], args, strict=True):
        assert out.data_ptr() == src.data_ptr()
    with torch.no_grad():
        for a, b in zip(got, SwiGLU()(*args), strict=True):
            torch.testing.assert_close(a, b)


def test_strided_inputs_are_read_in_place_by_a_variant(target: CPUTarget) -> None:
    # attention's gradients arrive transposed, a rotary embedding's halves sliced: the kernel
    # reads them with their strides (a variant compiled for them), no contiguous copy first
    class AddCat(torch.nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return torch.cat((a + 1.0, b * 2.0), dim=-1).sum(0)

    g = torch.Generator().manual_seed(0)
    args = (torch.randn(6, 4, 16, generator=g), torch.randn(6, 4, 8, generator=g))
    stitched = Stitched(AddCat(), target)
    _, planned = stitched.prepare(*args)
    (kernel,) = [k for k in planned.kernels if isinstance(k, CpuKernel)]
    base_a = torch.randn(4, 6, 16, generator=g)
    strided = (base_a.transpose(0, 1), torch.randn(6, 4, 20, generator=g)[..., 3:11])
    copies = []
    real = torch.Tensor.contiguous

    def contiguous(x: torch.Tensor, *a: object, **k: object) -> torch.Tensor:
        if not x.is_contiguous():
            copies.append(x.shape)
        return real(x, *a, **k)  # type: ignore[arg-type]

    torch.Tensor.contiguous = contiguous  # type: ignore[method-assign]
    try:
        got = stitched(*strided)
    finally:
        torch.Tensor.contiguous = real  # type: ignore[method-assign]
    with torch.no_grad():
        torch.testing.assert_close(got, AddCat()(*strided))
    assert not copies
    assert len(kernel._variants) == 2  # contiguous (built with the plan) and this signature
    torch.testing.assert_close(stitched(*args), AddCat()(*args))
    # a transpose of the last two dims would be gathered element by element: copied instead
    columns = (torch.randn(6, 16, 4, generator=g).transpose(1, 2), args[1])
    torch.testing.assert_close(stitched(*columns), AddCat()(*columns))
    assert len(kernel._variants) == 2


def test_kernels_compile_ahead_in_worker_processes(
    target: CPUTarget, tmp_path, monkeypatch, caplog
):
    # a plan's kernels numba's cache lacks compile in fresh interpreters, one per core; this
    # process then loads them from the cache and they compute what the reference does
    from fusekit.stitch.codegen import compiling, render

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # a cold cache, the workers' too
    monkeypatch.setattr(render, "_MODULES", {})  # none loaded in this process either
    monkeypatch.setenv(compiling.WORKERS_ENV, "0")  # planning compiles nothing ahead
    cases = []
    for name in ("bias_gelu", "layernorm_fwd"):
        w = load_workload(name, small=True)
        cap, planned = Stitched(w.module, target).prepare(*w.args)
        env = dict(cap.values(*w.args))
        for group, kernel in zip(planned.plan.groups, planned.kernels, strict=True):
            want = reference_group(planned.plan.graph, group.ops, env)
            if isinstance(kernel, CpuKernel):
                cases.append((kernel, dict(env), want))
            env.update(want)
    jobs = [(k.source, k.interleave) for k, _, _ in cases]
    assert len(set(jobs)) >= 2 and not any(compiling.is_cached(s) for s, _ in jobs)
    monkeypatch.setenv(compiling.WORKERS_ENV, "2")
    assert compiling.precompile(jobs) == len(set(jobs))
    assert all(compiling.is_cached(s) for s, _ in jobs)
    assert compiling.precompile(jobs) == 0  # all cached now: no workers
    for kernel, env, want in cases:
        got = kernel(env)
        for k, v in want.items():  # erf's approximation: 1e-6 absolute
            torch.testing.assert_close(got[k], v, rtol=1e-4, atol=1e-5)
    check_pool_reuse_and_failures(compiling, caplog)
    monkeypatch.setenv(compiling.WORKERS_ENV, "0")
    assert compiling.precompile([("x = 1\n", 0), ("x = 2\n", 0)]) == 0  # workers off


def check_pool_reuse_and_failures(compiling, caplog) -> None:
    """One pool of workers for the process: a later plan's kernels go to the same workers; a
    kernel that fails to compile is named in a warning and the others still compile; a pool
    that lost a worker is replaced (and the old one closed)."""

    def kernel(i: int) -> str:
        head = 'import numba\n\n@numba.njit("float64(float64)", cache=True)\n'
        return head + f"def k(x):\n    return x + {i}\n"

    first = compiling.pool()
    assert first is not None and first.size == 2
    pids = [p.pid for p in first.procs]
    broken = "def k(:\n"
    with caplog.at_level(logging.WARNING, logger=compiling.__name__):
        assert compiling.precompile([(kernel(3), 0), (broken, 0), (kernel(4), 0)]) == 3
    assert compiling.pool() is first and [p.pid for p in first.procs] == pids
    assert compiling.is_cached(kernel(3)) and compiling.is_cached(kernel(4))
    assert not compiling.is_cached(broken)
    failed = [m for r in caplog.records if "compile worker failed" in (m := r.getMessage())]
    assert len(failed) == 1 and "SyntaxError" in failed[0]
    # a worker that dies compiling: its exit status and last stderr line name why
    crash = "import os, sys\nsys.stderr.write('LLVM ERROR: out of memory\\n')\nos._exit(3)\n"
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=compiling.__name__):
        assert compiling.precompile([(crash, 0), (kernel(7), 0)]) == 2
    died = [m for r in caplog.records if "compile worker failed" in (m := r.getMessage())]
    assert len(died) == 1
    assert "exited with status 3: LLVM ERROR: out of memory" in died[0], died[0]
    assert first.size == 1 and compiling.is_cached(kernel(7))
    assert compiling.precompile([(kernel(5), 0), (kernel(6), 0)]) == 2
    second = compiling.pool()
    assert second is not first and second is not None and second.size == 2
    assert compiling.is_cached(kernel(5)) and compiling.is_cached(kernel(6))
    assert all(p.poll() is not None for p in first.procs)


class RelativePositionBuckets(torch.nn.Module):
    """T5's relative position buckets (bidirectional): integer and float casts in one chain."""

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        rel = k[None, :] - q[:, None]
        buckets = (rel > 0).to(torch.int64) * 16
        n = rel.abs()
        big = 8 + (torch.log(n.float() / 8) / 2.772588722239781 * 8).to(torch.int64)
        big = torch.min(big, torch.full_like(big, 15))
        return buckets + torch.where(n < 8, n, big)


class Casts(torch.nn.Module):
    """Casts whose value later ops read: truncation, wrap to int32, bool, and back to float."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        t = ((x * 3.7).to(torch.int64).to(torch.float32) * 0.5 + x).sum(-1)
        h = (x * 3.7).to(torch.int32) // 2 + 1
        b = torch.where((x * 2 - 1).to(torch.bool), x, -x) * 2
        return t, h, b


class NarrowInts(torch.nn.Module):
    """Arithmetic on uint8 and int8 wraps as torch's does (254 + 3 is 1)."""

    def forward(self, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        u = (y.to(torch.uint8) + 3).to(torch.int64) * 2
        i = ((y.to(torch.int8) * 9) + 100).to(torch.int64) + 1
        return u, i


@pytest.mark.parametrize(
    ("module", "args"),
    [
        (NarrowInts(), (torch.arange(-40, 40).reshape(4, 20),)),
        (RelativePositionBuckets(), (torch.arange(40), torch.arange(40))),
        (Casts(), (torch.cat([torch.randn(6, 64), torch.full((1, 64), 0.5)]),)),
    ],
    ids=["narrow_ints", "t5_buckets", "casts"],
)
def test_casts_convert_where_the_graph_casts(target: CPUTarget, module, args) -> None:
    """A cast inside a kernel converts its value for the ops that read it (``(x * 3.7).long()``
    truncates before ``* 0.5``); kept as a float, the buckets and sums were off."""
    want = module(*args)
    stitched = Stitched(module, target)
    got = stitched(*args)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple)
                    else (want,), strict=True):  # fmt: skip
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-5)
    _, planned = stitched.prepare(*args)
    casts = {o.name for o in planned.plan.graph.ops if planned.plan.graph.is_cast(o.name)}
    fused = [g for g in planned.plan.groups if g.layout is not None and len(g.ops) > 2]
    assert any(casts & set(g.ops) for g in fused)  # the casts run inside stitched kernels


class Transcendentals(torch.nn.Module):
    """Every function the CPU kernels approximate in float32, fused with a row reduction."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = torch.nn.functional
        y = f.gelu(x) + f.gelu(x, approximate="tanh") + torch.sigmoid(x) + f.silu(x)
        y = y + torch.tanh(x) + torch.log(x.abs() + 0.5) + torch.special.erf(x)
        return torch.softmax(y, dim=-1) * x.exp()


def test_float64_kernels_compute_in_float64(target: CPUTarget) -> None:
    """A float64 graph is not computed with the float32 approximations (fexp, ferf, flog,
    ftanh) or float32 constants: gradcheck-style users compare at 1e-12."""
    x = torch.randn(16, 40, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    module = Transcendentals()
    got = Stitched(module, target)(x)
    torch.testing.assert_close(got, module(x), rtol=1e-12, atol=1e-14)
    got32 = Stitched(module, target)(x.float())  # float32 keeps the approximations
    torch.testing.assert_close(got32, module(x.float()), rtol=1e-5, atol=1e-6)


def test_canonical_names_replace_graph_names_in_order_of_appearance() -> None:
    from fusekit.stitch.codegen.render import canonical

    source = "v_add_1 = in_x[i] + in_y[i]\nout_add_1[i] = v_add_1\np_part_s_0 = args[2]\nv_add = 1"
    got = canonical(source, ["x", "y", "add_1", "s"])
    assert got == "v_n0 = in_n1[i] + in_n2[i]\nout_n0[i] = v_n0\np_part_n3_0 = args[2]\nv_add = 1"
    # a graph name spelled like a prefixed one ("v_x" beside "x") would merge two identifiers
    clash = "v_x = in_v_x[0] + in_x[0]\nv_v_x = v_x"
    assert len(set(canonical(clash, ["x", "v_x"]).split())) == len(set(clash.split()))


class _TwoLayers(torch.nn.Module):
    """The same RMSNorm-like block twice: two groups of one structure, other graph names."""

    def forward(
        self, x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, m: torch.Tensor
    ) -> torch.Tensor:
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w1
        y = y @ m  # a GEMM between: two groups
        return y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6) * w2


def test_groups_of_one_structure_compile_one_module(target: CPUTarget) -> None:
    g = torch.Generator().manual_seed(0)
    args = (torch.randn(8, 64, generator=g), torch.randn(64, generator=g),
            torch.randn(64, generator=g), torch.randn(64, 64, generator=g))  # fmt: skip
    kernels = [k for _, _, k, _ in _kernels(_TwoLayers(), args, target) if isinstance(k, CpuKernel)]
    assert len(kernels) == 2
    assert kernels[0].source != kernels[1].source  # spelled with their graph names
    assert kernels[0].code == kernels[1].code  # compiled once
    with torch.no_grad():
        torch.testing.assert_close(Stitched(_TwoLayers(), target)(*args), _TwoLayers()(*args))


class _Rotated(torch.nn.Module):
    """Reads ``x`` at other elements than it writes (a rotary embedding's halves swapped)."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.cat((x[..., 20:], x[..., :20]), dim=-1) * 2.0 + y


class _Scaled(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x * 2.0 + y


@pytest.mark.parametrize(("module", "accepted"), [(_Scaled(), True), (_Rotated(), False)])
def test_an_output_is_written_into_an_input_only_where_read(
    target: CPUTarget, module: torch.nn.Module, accepted: bool
) -> None:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 40, generator=g), torch.randn(8, 40, generator=g)
    (found,) = [(gr, k, env) for gr, _, k, env in _kernels(module, (x, y), target)
                if isinstance(k, CpuKernel)]  # fmt: skip
    graph, kernel, env = found
    (out,) = kernel.layout.outputs
    into = graph.inputs[0]
    assert into in kernel.layout.inputs
    assert kernel.write_into({out: into}) == ({out: into} if accepted else {})
    want = module(x, y)
    got = kernel(env)[out]
    torch.testing.assert_close(got, want)
    assert (got is env[into]) is accepted
    if accepted:
        assert "out_" in kernel._inplace.source and kernel._inplace.code in kernel.codes
