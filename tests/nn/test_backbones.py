"""nn.backbones: VoxelBackBone8x built from fusekit's and from spconv's layers."""

from __future__ import annotations

import pytest
import torch

from fusekit.nn import SparseTensor, from_spconv, voxel_backbone_8x

spconv = pytest.importorskip("spconv.pytorch")
SHAPE = [41, 48, 40]  # OpenPCDet's z extent, a small y-x window


def test_the_two_builds_have_one_state_dict_layout():
    ours = voxel_backbone_8x(4)
    theirs = voxel_backbone_8x(4, layers=spconv)
    assert [(k, v.shape) for k, v in ours.state_dict().items()] == [
        (k, v.shape) for k, v in theirs.state_dict().items()
    ]
    convs = [m for m in ours.modules() if hasattr(m, "indice_key")]
    assert [m.out_channels for m in convs] == [16, 16, 32, 32, 32, 64, 64, 64, 64, 64, 64, 128]
    assert convs[-1].kernel_size == (3, 1, 1) and convs[-1].stride == (2, 1, 1)


def test_converted_equals_spconv_per_voxel():
    gen = torch.Generator().manual_seed(0)
    zyx = torch.stack([torch.randint(0, s, (3000,), generator=gen) for s in SHAPE], 1)
    idx = torch.unique(torch.cat([torch.zeros(3000, 1, dtype=torch.long), zyx], 1), dim=0).int()
    feats = torch.randn(len(idx), 4, generator=gen)
    net = voxel_backbone_8x(4, layers=spconv).eval()
    ours = from_spconv(net).eval()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # spconv's CPU kernels race on several threads
    try:
        with torch.no_grad():
            want = net(spconv.SparseConvTensor(feats, idx, SHAPE, 1))
    finally:
        torch.set_num_threads(threads)
    with torch.no_grad():
        got = ours(SparseTensor(feats, idx, SHAPE, 1))
    assert tuple(got.spatial_shape) == tuple(want.spatial_shape) == (2, 6, 5)

    def ordered(t):
        i = t.indices.long()
        order = torch.argsort(((i[:, 0] * 64 + i[:, 1]) * 64 + i[:, 2]) * 64 + i[:, 3])
        return t.indices[order].int(), t.features[order]

    (gi, gf), (wi, wf) = ordered(got), ordered(want)
    assert len(gi) > 0 and torch.equal(gi, wi)
    torch.testing.assert_close(gf, wf, atol=1e-5 * max(1.0, float(wf.abs().max())), rtol=0)


@pytest.mark.parametrize("bad", [0, -4, 2.5, True])
def test_in_channels_is_checked(bad):
    with pytest.raises(ValueError, match="in_channels"):
        voxel_backbone_8x(bad)
