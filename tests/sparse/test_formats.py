import numpy as np
import pytest
import scipy.sparse as sp
import torch

from fusekit.sparse.formats import (
    FORMATS,
    LevelKind,
    SparseTensor,
    StoredLevel,
    from_dense,
    from_scipy,
    from_torch,
)


def _matrix(seed: int = 0) -> sp.csr_matrix:
    return sp.random(8, 12, density=0.3, random_state=seed, format="csr")


@pytest.mark.parametrize("fmt", ["dense", "csr", "csc", "dcsr", "coo"])
def test_formats_round_trip(fmt: str) -> None:
    m = _matrix()
    t = from_dense("A", m.toarray(), fmt) if fmt == "dense" else from_scipy("A", m, fmt)
    np.testing.assert_allclose(t.to_dense(), m.toarray())
    assert t.format == fmt


def test_format_levels() -> None:
    m = _matrix()
    assert [lv.kind for lv in from_scipy("A", m, "csr").levels] == [
        LevelKind.DENSE,
        LevelKind.COMPRESSED,
    ]
    assert from_scipy("A", m, "csc").order == (1, 0)
    dcsr = from_scipy("A", m, "dcsr")
    assert [lv.kind for lv in dcsr.levels] == [LevelKind.COMPRESSED] * 2
    coo = from_scipy("A", m, "coo")
    assert coo.levels[1].kind is LevelKind.SINGLETON
    assert coo.nnz == m.nnz


def test_bcsr_blocks() -> None:
    dense = np.kron(np.array([[1, 0], [1, 1]]), np.arange(1, 17).reshape(4, 4)).astype(float)
    t = from_scipy("M", sp.csr_matrix(dense), "bcsr", block=4)
    assert t.shape == (2, 2, 4, 4)
    assert [lv.kind for lv in t.levels] == [
        LevelKind.DENSE,
        LevelKind.COMPRESSED,
        LevelKind.DENSE,
        LevelKind.DENSE,
    ]
    back = t.to_dense().transpose(0, 2, 1, 3).reshape(8, 8)
    np.testing.assert_allclose(back, dense)


@pytest.mark.parametrize("layout", ["coo", "csr", "csc", "strided"])
def test_from_torch_layouts(layout: str) -> None:
    d = torch.tensor(_matrix(1).toarray())
    t = {
        "coo": d.to_sparse_coo(),
        "csr": d.to_sparse_csr(),
        "csc": d.to_sparse_csc(),
        "strided": d,
    }[layout]
    s = from_torch("T", t)
    np.testing.assert_allclose(s.to_dense(), d.numpy())
    assert s.format == ("dense" if layout == "strided" else layout)


def test_unsorted_coordinates_rejected() -> None:
    levels = (
        StoredLevel(LevelKind.DENSE, 2),
        StoredLevel(LevelKind.COMPRESSED, 4, np.array([0, 2, 3]), np.array([3, 1, 0])),
    )
    with pytest.raises(ValueError, match=r"sparse tensor A level 1.*'crd' to be sorted"):
        SparseTensor("A", (2, 4), (0, 1), levels, np.ones(3))


def test_non_monotone_segments_rejected() -> None:
    levels = (
        StoredLevel(LevelKind.DENSE, 2),
        StoredLevel(LevelKind.COMPRESSED, 4, np.array([0, 2, 1]), np.array([0, 1, 2])),
    )
    with pytest.raises(ValueError, match=r"sparse tensor A level 1.*'seg' to be non-decreasing"):
        SparseTensor("A", (2, 4), (0, 1), levels, np.ones(3))


def test_shape_mismatch_rejected() -> None:
    levels = (StoredLevel(LevelKind.DENSE, 3), StoredLevel(LevelKind.DENSE, 4))
    with pytest.raises(ValueError, match=r"sparse tensor A level 0.*'size'"):
        SparseTensor("A", (2, 4), (0, 1), levels, np.ones(8))
    ok = (StoredLevel(LevelKind.DENSE, 2), StoredLevel(LevelKind.DENSE, 4))
    with pytest.raises(ValueError, match=r"sparse tensor A.*'values' to be 8 values"):
        SparseTensor("A", (2, 4), (0, 1), ok, np.ones(7))


def test_out_of_range_and_unsupported_format() -> None:
    levels = (
        StoredLevel(LevelKind.DENSE, 2),
        StoredLevel(LevelKind.COMPRESSED, 4, np.array([0, 1, 2]), np.array([0, 9])),
    )
    with pytest.raises(ValueError, match=r"level 1.*'crd' to be in \[0, 4\)"):
        SparseTensor("A", (2, 4), (0, 1), levels, np.ones(2))
    with pytest.raises(ValueError, match="'fmt' to be one of"):
        from_scipy("A", _matrix(), "ell")
    with pytest.raises(ValueError, match="'block'"):
        from_scipy("A", _matrix(), "bcsr", block=5)
    assert "bcsr" in FORMATS
