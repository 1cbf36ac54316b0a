import pytest

from fusekit.ir import Format, Level, Tensor, TensorStats


def test_dense_format_is_filled_in_from_the_shape():
    t = Tensor("x", (2, "N", 4))
    assert t.format == Format.dense(3)
    assert t.rank == 3 and not t.is_sparse and not t.is_static


def test_sparse_formats_follow_taco_levels():
    assert Format.csr().levels == (Level.DENSE, Level.COMPRESSED)
    assert Format.csc().order == (1, 0)
    assert Format.coo(3).levels == (Level.COMPRESSED, Level.SINGLETON, Level.SINGLETON)
    adj = Tensor("adj", (6, 6), format=Format.csr(), stats=TensorStats(nnz=7))
    assert adj.is_sparse and adj.stats is not None and adj.stats.nnz == 7
    assert Format((Level.DENSE, Level.DENSE), (0, 1)).order is None  # identity order dropped


def test_numel_of_static_and_symbolic_shapes():
    assert Tensor("x", (2, 3, 4)).numel() == 24
    assert Tensor("s", ()).numel() == 1
    with pytest.raises(ValueError, match="static"):
        Tensor("x", (2, "N")).numel()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"name": "sum_x", "shape": (2,)}, "'name'"),
        ({"name": "inf", "shape": (2,)}, "'name'"),
        ({"name": "None", "shape": (2,)}, "'name'"),
        ({"name": "1x", "shape": (2,)}, "'name'"),
        ({"name": "x", "shape": (-1,)}, "'shape'"),
        ({"name": "x", "shape": ("2n",)}, "'shape'"),
        ({"name": "x", "shape": (2,), "dtype": "float"}, "'dtype'"),
        ({"name": "x", "shape": (2, 2), "format": Format.dense(3)}, "'format'"),
    ],
)
def test_bad_tensors_name_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Tensor(**kwargs)


def test_bad_formats_and_stats():
    with pytest.raises(ValueError, match="'order'"):
        Format((Level.DENSE, Level.COMPRESSED), (0, 0))
    with pytest.raises(ValueError, match="singleton"):
        Format((Level.SINGLETON, Level.DENSE))
    with pytest.raises(ValueError, match="'nnz'"):
        TensorStats(nnz=-1)
    with pytest.raises(ValueError, match="'segment_sizes'"):
        TensorStats(segment_sizes=(1, -2))
