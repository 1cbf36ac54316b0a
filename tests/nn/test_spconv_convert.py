"""spconv's surface around the convolutions: SparseTensor, SparseSequential, from_spconv, fp16.

Converted networks are compared with spconv 2.3.8 run on one thread (its CPU kernels race with
more), per output coordinate. Tolerance (float32): ``|ours - spconv| <= 1e-5 max(1, max |ref|)``;
float16: ``1e-2`` on the same scale (both round each layer's output to float16; spconv's CPU
GEMM and scatter round partial sums too, fusekit sums in float32).
"""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
from torch import nn

import fusekit.nn as fnn
from fusekit.data.voxels import lidar_scan
from fusekit.nn import (
    SparseConv3d,
    SparseInverseConv3d,
    SparseModule,
    SparseSequential,
    SparseTensor,
    SubMConv3d,
    from_spconv,
)

spconv = pytest.importorskip("spconv.pytorch")

SHAPE = (9, 8, 10)


def voxels(n: int = 300, batches: int = 2, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    b = torch.randint(0, batches, (n, 1), generator=gen)
    zyx = torch.stack([torch.randint(0, s, (n,), generator=gen) for s in SHAPE], 1)
    idx = torch.unique(torch.cat([b, zyx], 1), dim=0).int()
    return idx[torch.randperm(len(idx), generator=gen)]


def one_thread(fn, *args):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            return fn(*args)
    finally:
        torch.set_num_threads(threads)


def assert_same(got, want, tol: float = 1e-5) -> None:
    """Same grid and voxels; features equal per voxel within ``tol`` of the output's scale."""
    assert tuple(got.spatial_shape) == tuple(want.spatial_shape)

    def ordered(t):
        i = t.indices.long()
        order = torch.argsort(((i[:, 0] * 4096 + i[:, 1]) * 4096 + i[:, 2]) * 4096 + i[:, 3])
        return t.indices[order].int(), t.features[order].detach().float()

    (ig, fg), (iw, fw) = ordered(got), ordered(want)
    assert torch.equal(ig, iw)
    scale = max(1.0, float(fw.abs().max())) if fw.numel() else 1.0
    assert float((fg - fw).abs().max()) <= tol * scale


def spconv_eval(module: nn.Module) -> nn.Module:
    """``module.eval()``, its spconv convolutions left in training mode: spconv's CPU build
    refuses a bias at inference ("cpu don't support act and bias"); in training mode it adds
    the bias after the convolution, the same maths."""
    module.eval()
    for m in module.modules():
        if isinstance(m, spconv.conv.SparseConvolution):
            m.train()
    return module


def randomise_batch_norms(module: nn.Module) -> None:
    gen = torch.Generator().manual_seed(7)
    for m in module.modules():
        if isinstance(m, nn.BatchNorm1d):
            n = m.num_features
            m.running_mean.copy_(torch.rand(n, generator=gen) * 0.4 - 0.2)
            m.running_var.copy_(torch.rand(n, generator=gen) + 0.5)
            m.weight.data.copy_(torch.rand(n, generator=gen) + 0.5)
            m.bias.data.copy_(torch.rand(n, generator=gen) * 0.4 - 0.2)


def assert_same_state(ours: nn.Module, theirs: nn.Module) -> None:
    a, b = ours.state_dict(), theirs.state_dict()
    assert list(a) == list(b)
    assert all(torch.equal(a[k], b[k]) for k in a)


# ---- SparseTensor ----


@pytest.mark.parametrize("channels_first", [True, False])
def test_dense_equals_spconv(channels_first):
    idx = voxels()
    x = SparseTensor(torch.randn(len(idx), 3), idx, SHAPE, 2)
    got = x.dense(channels_first=channels_first)
    want = x.to_spconv().dense(channels_first=channels_first)
    assert got.shape == want.shape == ((2, 3, *SHAPE) if channels_first else (2, *SHAPE, 3))
    assert torch.equal(got, want)


def test_dense_is_differentiable():
    idx = voxels()
    f = torch.randn(len(idx), 3, requires_grad=True)
    SparseTensor(f, idx, SHAPE, 2).dense().sum().backward()
    assert torch.equal(f.grad, torch.ones_like(f))


def test_replace_feature_keeps_voxels_and_maps():
    idx = voxels()
    x = SparseTensor(torch.randn(len(idx), 3), idx, SHAPE, 2)
    y = SubMConv3d(3, 5, indice_key="a")(x)
    z = y.replace_feature(torch.relu(y.features))
    assert z.indices is y.indices and z.indice_dict is x.indice_dict and "a" in z.indice_dict
    assert z.find_indice_pair("a") is x.maps["a"] and z.find_indice_pair("b") is None
    with pytest.raises(ValueError, match=r"'features'.*rows"):
        y.replace_feature(torch.randn(3, 5))
    with pytest.raises(TypeError, match="'features'"):
        y.replace_feature(torch.ones(len(idx), 5, dtype=torch.long))


def test_layers_take_an_spconv_tensor():
    idx = voxels()
    f = torch.randn(len(idx), 4)
    peer = spconv.SparseConv3d(4, 6, 3, 2, 1)
    ours = SparseConv3d(4, 6, 3, 2, 1)
    ours.load_state_dict(peer.state_dict())
    theirs = spconv.SparseConvTensor(f, idx, list(SHAPE), 2)
    got = ours(theirs)
    assert isinstance(got, SparseTensor)
    assert_same(got, one_thread(peer, theirs))


# ---- SparseSequential ----


def test_sequential_runs_sparse_layers_on_the_tensor_and_others_on_features():
    idx = voxels()
    f = torch.randn(len(idx), 4)
    parts = lambda lib: OrderedDict(  # noqa: E731
        conv=lib.SubMConv3d(4, 8, 3, indice_key="s"),
        bn=nn.BatchNorm1d(8),
        act=nn.ReLU(),
        drop=nn.Dropout(0.5),
        lin=nn.Linear(8, 8),
        down=lib.SparseConv3d(8, 8, 2, 2),
    )
    theirs = spconv_eval(spconv.SparseSequential(parts(spconv)))
    randomise_batch_norms(theirs)
    ours = SparseSequential(parts(fnn)).eval()
    ours.load_state_dict(theirs.state_dict())
    assert_same_state(ours, theirs)
    assert (
        len(ours) == 6
        and isinstance(ours[-1], SparseConv3d)
        and isinstance(ours[1], nn.BatchNorm1d)
    )
    x = SparseTensor(f, idx, SHAPE, 2)
    assert_same(ours(x), one_thread(theirs, x.to_spconv()))
    assert_same(ours(x.to_spconv()), one_thread(theirs, x.to_spconv()))  # spconv's tensor in


def test_sequential_names_and_errors():
    seq = SparseSequential(SubMConv3d(2, 2), nn.ReLU(), last=nn.Identity())
    assert list(dict(seq.named_children())) == ["0", "1", "last"]
    seq.add(nn.Identity())
    assert list(dict(seq.named_children()))[-1] == "3"
    with pytest.raises(IndexError, match="idx"):
        seq[4]
    with pytest.raises(TypeError, match="module"):
        seq.add("relu")
    with pytest.raises(ValueError, match="name"):
        seq.add(nn.ReLU(), "last")


def test_sequential_skips_feature_modules_on_no_voxels():
    # BatchNorm1d in training refuses a batch of no rows; spconv skips it, and so does fusekit
    empty = SparseTensor(torch.zeros(0, 3), torch.zeros(0, 4, dtype=torch.int32), SHAPE, 1)
    seq = SparseSequential(nn.BatchNorm1d(3).train(), nn.ReLU())
    assert seq(empty).features.shape == (0, 3)


def test_a_sparse_module_of_your_own_takes_the_tensor():
    class Residual(SparseModule):
        def __init__(self):
            super().__init__()
            self.conv = SubMConv3d(3, 3, indice_key="r")

        def forward(self, x):
            return x.replace_feature(x.features + self.conv(x).features)

    idx = voxels()
    x = SparseTensor(torch.randn(len(idx), 3), idx, SHAPE, 2)
    seq = SparseSequential(Residual(), nn.ReLU())
    block = seq[0]
    torch.testing.assert_close(seq(x).features, torch.relu(block(x).features))


# ---- from_spconv ----


def _block(lib, cin, cout, key, **regular):
    conv = (
        lib.SparseConv3d(cin, cout, 3, bias=False, indice_key=key, **regular)
        if regular
        else lib.SubMConv3d(cin, cout, 3, bias=False, indice_key=key)
    )
    return lib.SparseSequential(conv, nn.BatchNorm1d(cout), nn.ReLU())


class Backbone8x(nn.Module):
    """SECOND's VoxelBackBone8x in small widths: SubM blocks, stride-2 downsamples with padding,
    and a (3, 1, 1) kernel of stride (2, 1, 1) at the end; its forward speaks spconv."""

    def __init__(self) -> None:
        super().__init__()
        sp = spconv
        self.conv_input = _block(sp, 4, 8, "subm1")
        self.conv1 = sp.SparseSequential(_block(sp, 8, 8, "subm1"))
        self.conv2 = sp.SparseSequential(
            _block(sp, 8, 16, "spconv2", stride=2, padding=1), _block(sp, 16, 16, "subm2")
        )
        self.conv3 = sp.SparseSequential(
            _block(sp, 16, 16, "spconv3", stride=2, padding=1), _block(sp, 16, 16, "subm3")
        )
        self.conv4 = sp.SparseSequential(
            _block(sp, 16, 32, "spconv4", stride=2, padding=(0, 1, 1)),
            _block(sp, 32, 32, "subm4"),
        )
        self.conv_out = sp.SparseSequential(
            sp.SparseConv3d(32, 64, (3, 1, 1), (2, 1, 1), bias=False, indice_key="spconv_down2"),
            sp.SparseBatchNorm(64),
            sp.SparseReLU(),
        )

    def forward(self, features, indices, shape, batch_size):
        x = spconv.SparseConvTensor(features, indices, shape, batch_size)
        for stage in (self.conv_input, self.conv1, self.conv2, self.conv3, self.conv4):
            x = stage(x)
        return self.conv_out(x)


def test_converted_backbone_equals_spconv_on_a_lidar_scan():
    scan = lidar_scan()
    torch.manual_seed(0)
    theirs = Backbone8x().eval()
    randomise_batch_norms(theirs)
    ours = from_spconv(theirs)
    assert isinstance(ours.conv2, SparseSequential) and isinstance(ours.conv2[0][0], SparseConv3d)
    assert type(ours.conv_out[1]) is nn.BatchNorm1d and type(ours.conv_out[2]) is nn.ReLU
    assert_same_state(ours, theirs)
    f = torch.randn(scan.num_voxels, 4)
    args = (f, scan.coords, list(scan.spatial_shape), 1)
    want = one_thread(theirs, *args)
    with torch.no_grad():
        got = ours(*args)
    assert want.indices.shape[0] > 0
    assert_same(got, want)
    # the spconv model itself is left as it was
    assert isinstance(theirs.conv2[0][0], spconv.SparseConv3d)


class UNetBlock(nn.Module):
    """An encoder level and its decoder: SparseInverseConv3d back to the skip's voxels."""

    def __init__(self) -> None:
        super().__init__()
        sp = spconv
        self.enc = _block(sp, 4, 8, "subm1")
        self.down = _block(sp, 8, 16, "down1", stride=2, padding=1)
        self.mid = _block(sp, 16, 16, "subm2")
        self.up = sp.SparseSequential(
            sp.SparseInverseConv3d(16, 8, 3, indice_key="down1", bias=False),
            nn.BatchNorm1d(8),
            nn.ReLU(),
        )
        self.dec = sp.SubMConv3d(16, 5, 3, indice_key="subm1")

    def forward(self, x):
        skip = self.enc(x)
        up = self.up(self.mid(self.down(skip)))
        return self.dec(up.replace_feature(torch.cat([up.features, skip.features], 1)))


def test_converted_unet_block_with_inverse_conv_equals_spconv():
    idx = voxels(600)
    torch.manual_seed(0)
    theirs = spconv_eval(UNetBlock())
    randomise_batch_norms(theirs)
    ours = from_spconv(theirs)
    assert isinstance(ours.up[0], SparseInverseConv3d)
    assert_same_state(ours, theirs)
    x = SparseTensor(torch.randn(len(idx), 4), idx, SHAPE, 2)
    want = one_thread(theirs, x.to_spconv())
    with torch.no_grad():
        got = ours(x)
    assert torch.equal(got.indices, idx) and torch.equal(want.indices, idx)
    assert_same(got, want)


def test_spconv_checkpoints_load_into_the_converted_model():
    theirs, other = UNetBlock(), UNetBlock()
    ours = from_spconv(other)
    ours.load_state_dict(theirs.state_dict())
    assert_same_state(ours, theirs)


def test_from_spconv_refuses_what_it_has_no_twin_for():
    with pytest.raises(TypeError, match=r"'pool'.*SparseMaxPool3d"):
        from_spconv(nn.Sequential(OrderedDict(pool=spconv.SparseMaxPool3d(2))))
    with pytest.raises(TypeError, match="'module'"):
        from_spconv("model")


# ---- float16 (spconv's CPU layers run it) ----


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [("SubMConv3d", {"kernel_size": 3}), ("SparseConv3d", {"kernel_size": 2, "stride": 2})],
)
def test_float16_equals_spconv(name, kwargs):
    idx = voxels()
    peer = getattr(spconv, name)(8, 8, **kwargs).half()
    ours = getattr(fnn, name)(8, 8, **kwargs).half()
    ours.load_state_dict(peer.state_dict())
    x = SparseTensor(torch.randn(len(idx), 8).half(), idx, SHAPE, 2)
    got = ours(x)
    assert got.features.dtype == torch.float16
    assert_same(got, one_thread(peer, x.to_spconv()), tol=1e-2)
    # and differentiable: float16 gradients of the float32 computation
    f = x.features.clone().requires_grad_()
    ours(x.replace_feature(f)).features.float().sum().backward()
    assert f.grad.dtype == torch.float16 and ours.weight.grad.dtype == torch.float16


# ---- geometry errors name the argument ----


@pytest.mark.parametrize(
    ("make", "argument"),
    [
        (lambda: SparseConv3d(2, 2, 0), "kernel_size"),
        (lambda: SparseConv3d(2, 2, 8), "kernel_size"),
        (lambda: SparseConv3d(2, 2, (3, 3)), "kernel_size"),
        (lambda: SubMConv3d(2, 2, (3, 2, 3)), "kernel_size"),
        (lambda: SparseConv3d(2, 2, 3, padding=-1), "padding"),
        (lambda: SparseConv3d(2, 2, 3, dilation=0), "dilation"),
        (lambda: SparseConv3d(2, 2, 1, padding=1), "padding"),
        (lambda: SparseInverseConv3d(2, 2, 3, indice_key=None), "indice_key"),
    ],
)
def test_bad_geometry_names_the_argument(make, argument):
    with pytest.raises((ValueError, TypeError), match=f"'{argument}'"):
        make()


def test_inverse_conv_errors_name_the_argument():
    idx = voxels()
    x = SparseTensor(torch.randn(len(idx), 2), idx, SHAPE, 2)
    with pytest.raises(ValueError, match="'indice_key'"):
        SparseInverseConv3d(2, 2, 3, indice_key="nowhere")(x)
    down = SparseConv3d(2, 2, 3, 2, 1, indice_key="d")(x)
    with pytest.raises(ValueError, match="'kernel_size'"):
        SparseInverseConv3d(2, 2, 2, indice_key="d")(down)
    with pytest.raises(ValueError, match=r"'x\.indices'"):
        SparseInverseConv3d(2, 2, 3, indice_key="d")(
            SparseTensor(down.features[1:], down.indices[1:], down.spatial_shape, 2, x.maps)
        )
    sub = SubMConv3d(2, 2, indice_key="s")(x)
    with pytest.raises(ValueError, match="'indice_key'"):  # a submanifold map has no inverse
        SparseInverseConv3d(2, 2, 3, indice_key="s")(sub)
    with pytest.raises(ValueError, match="'indice_key'"):  # one key, another geometry
        SubMConv3d(2, 2, 5, indice_key="s")(sub)
