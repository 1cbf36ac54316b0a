import pytest

from fusekit.accel import attention, gemm_layernorm, gemm_softmax, make_problem
from fusekit.accel.problem import load_problem, problem_from_dict
from fusekit.errors import ConfigError


def test_softmax_splits_into_simd_ops():
    p = gemm_softmax(256, 256, 128)
    assert [s.kind for s in p.stages] == ["gemm", "simd", "simd", "simd", "simd"]
    assert dict(p.stages[2].simd_ops) == {"exp": 1, "add": 1}
    assert p.stages[1].simd_ops == (("row_max", 1),)
    assert (p.row, p.col, p.inputs, p.output) == ("m", "n", ("A", "B"), "Y")
    assert p.macs == 256 * 256 * 128


def test_outputs_are_the_results_nobody_reads():
    p = gemm_softmax(8, 16, 4)
    assert p.outputs == ("Y",) and p.intermediates == ("S", "X", "E", "Z")
    assert not p.independent()
    two = make_problem("two", ["S[m,n] += A[m,k] * B[k,n]", "T[m,n] = exp(C[m,n])"],
                       {"m": 8, "n": 8, "k": 8})  # fmt: skip
    assert two.outputs == ("S", "T") and two.intermediates == () and two.independent()


def test_layernorm_and_attention():
    ln = gemm_layernorm(8, 16, 4)
    assert dict(ln.stages[4].simd_ops) == {"sqrt": 1, "div": 1, "add": 1}
    assert ln.stages[1].per_out_ops == (("mul", 1),)
    at = attention(8, 16, 4)
    assert at.stages[-1].kind == "gemm" and at.stages[-1].reduced_vars == ("n",)
    assert at.macs == 2 * 8 * 16 * 4


def test_custom_chain():
    p = make_problem(
        "gelu_chain", ["S[m,n] += A[m,k] * B[k,n]", "Y[m,n] = S[m,n] * S[m,n]"],
        {"m": 4, "n": 4, "k": 2},
    )  # fmt: skip
    assert p.stages[1].simd_ops == (("mul", 1),)


@pytest.mark.parametrize(
    ("ops", "extents", "match"),
    [
        (["S[m,n] += A[m,k] * B[k,n]"], {"m": 4, "n": 4}, "extent of 'k'"),
        (["S[m] = sum_n A[m,n]"], {"m": 4, "n": 4}, "two output variables"),
        (["S[m,n] += A[m,k] * B[k,n]", "Y[m,n] = tanh(S[m,n])"], {"m": 1, "n": 1, "k": 1},
         "function"),
        (["S[m,n] += A[m,k] * B[k,n]", "Y[m,n] = S[n,m]"], {"m": 1, "n": 1, "k": 1}, "indexed"),
    ],
)  # fmt: skip
def test_bad_problems(ops, extents, match):
    with pytest.raises(ValueError, match=match):
        make_problem("bad", ops, extents)


def test_yaml_forms(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("kind: attention\nM: 8\nN: 16\nK: 4\n")
    assert load_problem(f).name == "attention"
    f.write_text("name: c\ndims: {m: 4, n: 4, k: 2}\nops: ['S[m,n] += A[m,k] * B[k,n]']\n")
    assert load_problem(f).macs == 32
    f.write_text("kind: attention\nM: -1\nN: 16\nK: 4\n")
    with pytest.raises(ConfigError, match=r"p.yaml: M: "):
        load_problem(f)
    with pytest.raises(ConfigError, match="ops"):
        problem_from_dict({"dims": {"m": 1}, "ops": ["S[m] = exp(A[m])"]}, "x.yaml")
