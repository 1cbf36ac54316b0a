"""The four sparse convolutions against spconv 2.3.8 on the CPU, over spconv's own test grid.

spconv's ``test/test_conv.py`` runs ``SparseConv3d`` (``test_spconv3d``) and
``SparseConvTranspose3d`` (``test_spdeconv3d``) over these parameter lists, on a
``[19, 18, 17]`` grid with 1500 (1000 for the transposed test) random voxels per batch,
skipping stride and dilation both above 1. The lists are written out here; ``SubMConv3d`` runs
over the same kernel sizes and dilations (spconv refuses even submanifold kernels, and so
do we) and ``SparseInverseConv3d`` inverts every regular case.

Forward: per output coordinate, against spconv run on one thread (its CPU kernels race with
more). Backward: spconv's CPU build has no backward for regular and transposed convolutions
(it asks for a CUDA stream), so the gradients are checked as spconv's test checks its own: against
a dense ``conv3d`` / ``conv_transpose3d`` on the densified grid, read at the voxels.

Tolerance (float32): ``|ours - ref| <= 1e-5 max(1, max |ref|)`` (sums of up to
``V C_in`` products in another order, relative to the output's scale).

The default run takes one batch size and one width (a representative subset); the full grid
is marked ``slow``.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fusekit.nn as fnn
from fusekit.gms.kmap.geometry import Geometry
from fusekit.nn import SparseTensor, SubMConv3d

spconv = pytest.importorskip("spconv.pytorch")

# ---- spconv test_conv.py's parameter lists ----
SHAPE = (19, 18, 17)
BATCH_SIZES = [1, 2]
OUT_CHANNELS = [32, 48, 64]
KSIZES = [2, 3]
STRIDES = [1, 2, 3]
PADDINGS = [0, 1, 2]
DILATIONS = [1, 2, 3]
DECONV_STRIDES = [2, 3]
CONV_IN, DECONV_IN = 32, 64
CONV_POINTS, DECONV_POINTS = 1500, 1000


def _grid(*lists):
    """spconv's ``params_grid`` with its skip: no case with stride and dilation both > 1."""
    return [p for p in itertools.product(*lists) if not (p[-2] > 1 and p[-1] > 1)]


def _split(cases, representative):
    """The representative cases by default, the rest under ``slow``."""
    return [c if representative(c) else pytest.param(*c, marks=pytest.mark.slow) for c in cases]


CONV = _split(
    _grid(BATCH_SIZES, OUT_CHANNELS, KSIZES, PADDINGS, STRIDES, DILATIONS),
    lambda c: c[0] == 2 and c[1] == 48,
)
DECONV = _split(
    _grid(BATCH_SIZES, OUT_CHANNELS, KSIZES, PADDINGS, DECONV_STRIDES, DILATIONS),
    lambda c: c[0] == 2 and c[1] == 48,
)
SUBM = _split(
    list(itertools.product(BATCH_SIZES, OUT_CHANNELS, [k for k in KSIZES if k % 2], DILATIONS)),
    lambda c: c[1] == 48,
)


def voxels(points: int, batches: int, shape=SHAPE, seed: int = 0) -> torch.Tensor:
    """``points`` distinct random voxels per batch (spconv's ``generate_sparse_data``), shuffled."""
    gen = torch.Generator().manual_seed(seed)
    cells = shape[0] * shape[1] * shape[2]
    rows = []
    for b in range(batches):
        flat = torch.randperm(cells, generator=gen)[:points]
        z, rest = flat // (shape[1] * shape[2]), flat % (shape[1] * shape[2])
        rows.append(torch.stack([torch.full_like(z, b), z, rest // shape[2], rest % shape[2]], 1))
    idx = torch.cat(rows).int()
    return idx[torch.randperm(len(idx), generator=gen)]


def by_coordinate(indices: torch.Tensor, features: torch.Tensor):
    key = ((indices[:, 0].long() * 512 + indices[:, 1]) * 512 + indices[:, 2]) * 512 + indices[:, 3]
    order = torch.argsort(key)
    return indices[order], features[order]


def assert_close(got: torch.Tensor, want: torch.Tensor, tol: float = 1e-5) -> None:
    got, want = got.detach(), want.detach()
    scale = max(1.0, float(want.abs().max())) if want.numel() else 1.0
    err = float((got - want).abs().max()) if want.numel() else 0.0
    assert err <= tol * scale, (err, scale)


def peer_forward(peer, x: SparseTensor):
    """spconv's forward on one thread (its CPU kernels race with more)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return peer(x.to_spconv())
    finally:
        torch.set_num_threads(threads)


def twins(name: str, cin: int, cout: int, **kwargs):
    """An spconv layer with a random bias and the fusekit layer loaded from its state."""
    torch.manual_seed(1)
    peer = getattr(spconv, name)(cin, cout, **kwargs)
    torch.nn.init.uniform_(peer.weight, -1, 1)  # spconv's test's filters
    if peer.bias is not None:
        torch.nn.init.normal_(peer.bias)
    ours = getattr(fnn, name)(cin, cout, **kwargs)
    ours.load_state_dict(peer.state_dict())
    return peer, ours


def assert_same_output(got: SparseTensor, want) -> None:
    """Same grid, same set of output voxels, equal features per voxel."""
    assert got.spatial_shape == tuple(want.spatial_shape)
    i_got, f_got = by_coordinate(got.indices, got.features)
    i_ref, f_ref = by_coordinate(want.indices, want.features)
    assert torch.equal(i_got.int(), i_ref.int())
    assert_close(f_got, f_ref)


def dense_grad_check(layer, x: SparseTensor, out: SparseTensor, dense) -> None:
    """Input and weight gradients against ``dense`` (torch's conv on the densified grid)."""
    feats = x.features.detach().clone().requires_grad_()
    weight = layer.weight.detach().clone().requires_grad_()
    grid = SparseTensor(feats, x.indices, x.spatial_shape, x.batch_size).dense()
    y = dense(grid, weight)
    o = out.indices.long()
    ref = y[o[:, 0], :, o[:, 1], o[:, 2], o[:, 3]]
    if layer.bias is not None:
        ref = ref + layer.bias.detach()
    assert_close(out.features.detach(), ref.detach())
    grad = torch.randn_like(ref)
    (ref * grad).sum().backward()
    xg = x.features.detach().clone().requires_grad_()
    layer.weight.grad = None
    ours = layer(SparseTensor(xg, x.indices, x.spatial_shape, x.batch_size))
    (ours.features * grad).sum().backward()
    assert_close(xg.grad, feats.grad)
    assert_close(layer.weight.grad, weight.grad)


@pytest.mark.parametrize(("batches", "cout", "k", "p", "s", "d"), CONV)
def test_sparse_conv3d_grid(batches, cout, k, p, s, d):
    peer, ours = twins(
        "SparseConv3d",
        CONV_IN,
        cout,
        kernel_size=k,
        stride=s,
        padding=p,
        dilation=d,
        indice_key="down",
    )
    idx = voxels(CONV_POINTS, batches)
    x = SparseTensor(torch.randn(len(idx), CONV_IN), idx, SHAPE, batches)
    out = ours(x)
    spconv_out = peer_forward(peer, x)
    assert_same_output(out, spconv_out)

    def dense(grid, weight):
        w = weight.permute(0, 4, 1, 2, 3)  # [out, in, kz, ky, kx]
        return torch.nn.functional.conv3d(grid, w, stride=s, padding=p, dilation=d)

    dense_grad_check(ours, x, out, dense)
    # the inverse convolution of the same key, on the output: back to the input voxels
    inv_peer, inv = twins("SparseInverseConv3d", cout, 16, kernel_size=k, indice_key="down")
    with torch.no_grad():
        back = inv(out)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        want = inv_peer(spconv_out.replace_feature(by_key(out, spconv_out)))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(back.indices, idx) and torch.equal(want.indices, idx)
    assert back.spatial_shape == SHAPE
    assert_close(back.features, want.features)


def by_key(ours: SparseTensor, theirs) -> torch.Tensor:
    """Our output features in the row order of spconv's output voxels."""
    z, y, x = ours.spatial_shape

    def key(i):
        i = i.long()
        return ((i[:, 0] * z + i[:, 1]) * y + i[:, 2]) * x + i[:, 3]

    mine, order = torch.sort(key(ours.indices))
    at = torch.searchsorted(mine, key(theirs.indices))
    return ours.features.detach()[order[at]]


@pytest.mark.parametrize(("batches", "cout", "k", "p", "s", "d"), DECONV)
def test_sparse_conv_transpose3d_grid(batches, cout, k, p, s, d):
    peer, ours = twins(
        "SparseConvTranspose3d", DECONV_IN, cout, kernel_size=k, stride=s, padding=p, dilation=d
    )
    idx = voxels(DECONV_POINTS, batches)
    x = SparseTensor(torch.randn(len(idx), DECONV_IN), idx, SHAPE, batches)
    out = ours(x)
    assert_same_output(out, peer_forward(peer, x))

    def dense(grid, weight):
        w = weight.permute(4, 0, 1, 2, 3)  # [in, out, kz, ky, kx]
        return torch.nn.functional.conv_transpose3d(grid, w, stride=s, padding=p, dilation=d)

    dense_grad_check(ours, x, out, dense)


@pytest.mark.parametrize(("batches", "cout", "k", "d"), SUBM)
def test_subm_conv3d_grid(batches, cout, k, d):
    peer, ours = twins("SubMConv3d", CONV_IN, cout, kernel_size=k, dilation=d)
    idx = voxels(CONV_POINTS, batches)
    x = SparseTensor(torch.randn(len(idx), CONV_IN), idx, SHAPE, batches)
    out = ours(x)
    want = peer_forward(peer, x)
    assert torch.equal(out.indices, want.indices)  # the inputs, in their order
    assert_close(out.features, want.features)

    def dense(grid, weight):
        w = weight.permute(0, 4, 1, 2, 3)
        return torch.nn.functional.conv3d(grid, w, padding=(k // 2) * d, dilation=d)

    dense_grad_check(ours, x, out, dense)


def test_even_submanifold_kernels_are_refused_as_spconv_refuses_them():
    idx = voxels(50, 1)
    x = SparseTensor(torch.randn(len(idx), 4), idx, SHAPE, 1)
    with pytest.raises(RuntimeError, match="odd"):
        peer_forward(spconv.SubMConv3d(4, 4, 2), x)
    for size in (2, (3, 2, 3), 4):
        with pytest.raises(ValueError, match=r"'kernel_size'.*odd"):
            SubMConv3d(4, 4, size)


# ---- every geometry on random voxel sets (hypothesis) ----

AXIS = st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 3))


@st.composite
def geometries(draw):
    kind = draw(
        st.sampled_from(
            ["SubMConv3d", "SparseConv3d", "SparseConvTranspose3d", "SparseInverseConv3d"]
        )
    )
    kernel = draw(st.tuples(*(st.integers(1, 4),) * 3))
    stride, padding = draw(AXIS), draw(st.tuples(*(st.integers(0, 2),) * 3))
    dilation = draw(AXIS)
    if kind == "SubMConv3d":
        kernel = tuple(k | 1 for k in kernel)  # odd
        return kind, {"kernel_size": kernel, "dilation": dilation}
    if any(s > 1 for s in stride):  # spconv's transposed grid leaves dilation out
        dilation = (1, 1, 1) if kind == "SparseConvTranspose3d" else dilation
    if kind == "SparseInverseConv3d" and kernel == (1, 1, 1) and stride != (1, 1, 1):
        # spconv inverts a strided 1x1x1 convolution by its conv1x1 shortcut: one GEMM left on
        # the strided layer's output voxels, not a return to its inputs (its source marks
        # "ksize == 1 but stride != 1" for deprecation); test_inverse_of_a_strided_pointwise_conv
        stride = (1, 1, 1)
    return kind, {"kernel_size": kernel, "stride": stride, "padding": padding, "dilation": dilation}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    geometry=geometries(),
    shape=st.tuples(*(st.integers(1, 7),) * 3),
    points=st.integers(1, 40),
    seed=st.integers(0, 2**16),
)
def test_every_geometry_equals_spconv(geometry, shape, points, seed):
    kind, kwargs = geometry
    forward_kind = "SparseConv3d" if kind == "SparseInverseConv3d" else kind
    pointwise = kwargs["kernel_size"] == (1, 1, 1) and kwargs.get("stride", (1,) * 3) == (1,) * 3
    if pointwise and forward_kind != "SubMConv3d" and kwargs["padding"] != (0, 0, 0):
        with pytest.raises(ValueError, match="'padding'"):  # spconv asserts it too
            getattr(fnn, forward_kind)(3, 2, **kwargs)
        return
    cells = shape[0] * shape[1] * shape[2]
    idx = voxels(min(points, cells), 2, shape, seed)
    x = SparseTensor(torch.randn(len(idx), 3), idx, shape, 2)
    grid = Geometry.create(
        subm=forward_kind == "SubMConv3d",
        transposed=forward_kind == "SparseConvTranspose3d",
        **kwargs,
    ).output_shape(shape)
    if min(grid) < 1:  # no output grid: spconv refuses it too ("reach zero")
        with pytest.raises(ValueError, match="'padding'"):
            getattr(fnn, forward_kind)(3, 2, **kwargs)(x)
        return
    peer, ours = twins(forward_kind, 3, 2, indice_key="k", **kwargs)
    out = ours(x)  # empty outputs included: a window reaching no voxel
    want = peer_forward(peer, x)
    if forward_kind == "SubMConv3d":
        assert torch.equal(out.indices, want.indices)
    assert_same_output(out, want)
    if kind == "SparseInverseConv3d":
        inv_peer, inv = twins(kind, 2, 3, kernel_size=kwargs["kernel_size"], indice_key="k")
        back = inv(out)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            back_ref = inv_peer(want.replace_feature(by_key(out, want)))
        finally:
            torch.set_num_threads(threads)
        assert torch.equal(back.indices, back_ref.indices) and torch.equal(back.indices, idx)
        assert_close(back.features, back_ref.features)


def test_inverse_of_a_strided_pointwise_conv():
    """1x1x1 with stride (1, 1, 2), then its inverse: the encoder's voxels, in their order."""
    idx = torch.tensor([[1, 0, 0, 3], [0, 0, 0, 2], [0, 0, 0, 0]], dtype=torch.int32)
    x = SparseTensor(torch.randn(3, 3), idx, (1, 1, 5), 2)
    conv = fnn.SparseConv3d(3, 2, kernel_size=1, stride=(1, 1, 2), indice_key="k")
    inv = fnn.SparseInverseConv3d(2, 3, kernel_size=1, indice_key="k")
    out = conv(x)
    back = inv(out)
    assert torch.equal(back.indices, idx)  # x = 3 (odd) reaches no output: zero input, bias
    o = {tuple(v): f for v, f in zip(out.indices.tolist(), out.features, strict=True)}
    w = inv.weight.reshape(3, 2)
    for row, v in enumerate(idx.tolist()):
        source = (v[0], v[1], v[2], v[3] // 2)
        got = o[source] @ w.T if v[3] % 2 == 0 and source in o else torch.zeros(3)
        torch.testing.assert_close(back.features[row], got + inv.bias)


@pytest.mark.parametrize("kind", ["SparseConv3d", "SparseInverseConv3d"])
def test_a_map_of_no_output_voxels(kind):
    # kernel 2, stride 2 on a 5-wide axis covers x in [0, 4): a voxel at x = 4 reaches nothing
    idx = torch.tensor([[0, 1, 1, 4], [1, 0, 2, 4]], dtype=torch.int32)
    x = SparseTensor(torch.randn(2, 3), idx, (5, 5, 5), 2)
    peer, ours = twins("SparseConv3d", 3, 4, kernel_size=2, stride=2, indice_key="k")
    out = ours(x)
    want = peer_forward(peer, x)
    assert out.indices.shape == (0, 4) and want.indices.shape[0] == 0
    assert out.features.shape == (0, 4) and out.spatial_shape == (2, 2, 2)
    assert_same_output(out, want)
    if kind == "SparseInverseConv3d":  # back to the two voxels, which receive only the bias
        _, inv = twins(kind, 4, 3, kernel_size=2, indice_key="k")
        back = inv(out)
        assert torch.equal(back.indices, idx)
        torch.testing.assert_close(back.features, inv.bias.detach().expand(2, 3))
