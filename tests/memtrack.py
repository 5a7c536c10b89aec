"""Live tensor memory of a block of code on the CPU, for memory tests that need no GPU (``torch.cuda``-free).

:class:`LiveBytes` is a ``TorchDispatchMode``: every tensor an aten op creates under it counts from its creation until
the last tensor viewing its storage is freed (tensors made before the block, e.g. parameters, are not counted).
``peak`` is the largest sum of live storages seen, in bytes. A view of a storage made before the block (a parameter
transposed by ``linear``) allocates nothing and is not counted. Kernels' internal scratch buffers that never reach an
op's output are not seen; for comparing two runs of the same code that share them, that does not matter.
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveBytes(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.live = 0
        self.peak = 0
        self.largest = 0
        """Bytes of the largest single storage created."""
        self._refs: dict[int, int] = {}

    def _release(self, key: int, nbytes: int) -> None:
        self._refs[key] -= 1
        if self._refs[key] == 0:
            del self._refs[key]
            self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        # a view or in-place op returns (an alias of) its input: nothing new unless that input was counted
        aliases = any(r.alias_info is not None for r in func._schema.returns)
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                continue
            storage = t.untyped_storage()
            key, nbytes = storage.data_ptr(), storage.nbytes()
            if key == 0 or (key not in self._refs and aliases):
                continue
            if key not in self._refs:
                self._refs[key] = 0
                self.live += nbytes
                self.peak = max(self.peak, self.live)
                self.largest = max(self.largest, nbytes)
            self._refs[key] += 1
            weakref.finalize(t, self._release, key, nbytes)
        return out
