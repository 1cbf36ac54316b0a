"""``SparseSequential``: spconv's container, for fusekit's sparse tensors.

Each module in turn: a :class:`~fusekit.nn.sparse_tensor.SparseModule` (the sparse
convolutions, a nested ``SparseSequential``) takes the :class:`SparseTensor` itself; any other
module (``BatchNorm1d``, ``ReLU``, ``Dropout``, ``Linear``, ...) runs on its ``[N, C]`` features,
which :meth:`~fusekit.nn.sparse_tensor.SparseTensor.replace_feature` puts back on the same
voxels. As in spconv, a tensor of no voxels skips the feature-wise modules (``BatchNorm1d``
refuses an empty batch in training).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch

from fusekit.errors import expected
from fusekit.nn.sparse_tensor import SparseModule, SparseTensor, is_spconv_tensor


class SparseSequential(SparseModule):
    """A sequence of sparse and feature-wise modules (spconv's ``SparseSequential``).

    .. code-block:: python

        block = SparseSequential(
            SubMConv3d(16, 32, 3, indice_key="subm1"),
            torch.nn.BatchNorm1d(32),
            torch.nn.ReLU(),
        )

    Args:
        *args: the modules, in order, or one ``OrderedDict`` of named modules.
        **kwargs: more named modules, after those.

    Raises:
        TypeError: an argument that is not a ``torch.nn.Module``.
        ValueError: a name given twice.
    """

    def __init__(self, *args: Any, **kwargs: torch.nn.Module) -> None:
        super().__init__()
        named: list[tuple[str, Any]]
        if len(args) == 1 and isinstance(args[0], OrderedDict):
            named = list(args[0].items())
        else:
            named = [(str(i), m) for i, m in enumerate(args)]
        for name, module in named + list(kwargs.items()):
            if name in self._modules:
                raise ValueError(expected("SparseSequential", name, "a new name", "taken"))
            self.add(module, name)

    def add(self, module: torch.nn.Module, name: str | None = None) -> None:
        """Append ``module`` (named ``name``, by default its position)."""
        if not isinstance(module, torch.nn.Module):
            raise TypeError(
                expected("SparseSequential", "module", "a torch.nn.Module", type(module).__name__)
            )
        name = str(len(self._modules)) if name is None else name
        if name in self._modules:
            raise ValueError(expected("SparseSequential", "name", "a new name", repr(name)))
        self.add_module(name, module)

    def __len__(self) -> int:
        return len(self._modules)

    def __getitem__(self, idx: int) -> torch.nn.Module:
        """The module at position ``idx`` (negative counts from the end)."""
        n = len(self)
        if not -n <= idx < n:
            raise IndexError(expected("SparseSequential", "idx", f"in [{-n}, {n})", idx))
        return list(self._modules.values())[idx]  # type: ignore[return-value]

    def forward(self, x: SparseTensor | Any) -> Any:
        """Run the modules in order (see the class docstring).

        Args:
            x: a :class:`SparseTensor`, spconv's ``SparseConvTensor`` (converted at the first
                feature-wise module; the sparse layers convert it themselves), or what the first
                module takes.

        Returns:
            What the last module returns: a :class:`SparseTensor` for sparse layers.
        """
        for module in self._modules.values():
            if module is None:  # a child deleted through ``seq[name] = None``
                continue
            if isinstance(module, SparseModule):
                x = module(x)
                continue
            if is_spconv_tensor(x):
                x = SparseTensor.from_spconv(x)
            if isinstance(x, SparseTensor):
                if x.indices.shape[0] != 0:
                    x = x.replace_feature(module(x.features))
            else:
                x = module(x)
        return x
