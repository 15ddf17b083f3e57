"""Device memory of a graph's tensors: allocated when a tensor needs it, freed with the graph.

Weights get memory just before their packing dispatch (or from the packed-weight cache),
intermediates and the host staging of inputs and outputs when execute is encoded.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from ..runtime import Buffer, Device, Image3D, MemoryKind, OneShot
from .values import Tensor


class TensorMemory:
    """Owns every buffer and image it gives a graph's tensors."""

    def __init__(self, device: Device, timeout_s: float):
        self.device = device
        self.timeout_s = timeout_s
        self._resources: list[Buffer | Image3D] = []

    def allocate(self, tensor: Tensor) -> Buffer | Image3D:
        """Device memory for ``tensor``: a buffer, or an image for texture storage."""
        if tensor.storage == "texture3d":
            res: Buffer | Image3D = Image3D(self.device, tensor.extents(), name=tensor.name)
            tensor.image = res
        else:
            res = tensor.buffer = Buffer(self.device, tensor.nbytes, MemoryKind.DEVICE, name=tensor.name)
        self._resources.append(res)
        return res

    def adopt(self, tensor: Tensor, buffer: Buffer) -> None:
        """Give ``tensor`` a buffer made elsewhere (an imported cache region); freed with the rest."""
        tensor.buffer = buffer
        self._resources.append(buffer)

    def staging(self, nbytes: int, kind: MemoryKind, name: str) -> Buffer:
        """Host-visible memory for a graph input or output."""
        buf = Buffer(self.device, nbytes, kind, name=name)
        self._resources.append(buf)
        return buf

    def upload(self, tensor: Tensor, data: np.ndarray) -> None:
        """Give ``tensor`` a device buffer holding ``data``: written in place when device memory
        is host-visible, else copied through a staging buffer."""
        buf = Buffer(self.device, tensor.nbytes, MemoryKind.DEVICE, name=tensor.name)
        try:
            if buf.host_visible:
                buf.write(data)
            else:
                with Buffer(self.device, tensor.nbytes, MemoryKind.UPLOAD) as up:
                    up.write(data)
                    with OneShot(self.device, self.timeout_s) as cmd:
                        cmd.copy_buffer(up, buf, tensor.nbytes)
                        cmd.compute_barrier()
        except BaseException:
            buf.destroy()
            raise
        self.adopt(tensor, buf)

    def read(self, tensor: Tensor) -> np.ndarray:
        """A copy of ``tensor``'s bytes (a texture's raw texels: RGBA32F, x fastest)."""
        if tensor.buffer is not None and tensor.buffer.host_visible:
            return tensor.buffer.read(np.uint8, tensor.nbytes)
        with Buffer(self.device, tensor.nbytes, MemoryKind.READBACK) as rb:
            with OneShot(self.device, self.timeout_s) as cmd:
                cmd.compute_barrier()
                if tensor.image is not None:
                    cmd.copy_image_to_buffer(tensor.image, rb)
                else:
                    cmd.copy_buffer(tensor.buffer, rb, tensor.nbytes)
                cmd.host_read_barrier()
            return rb.read(np.uint8, tensor.nbytes)

    def free(self, tensors: Iterable[Tensor]) -> None:
        """Free the memory of ``tensors`` (a failed load's packed weights)."""
        for t in tensors:
            if t.resource is not None:
                t.resource.destroy()
                t.buffer = t.image = None
        self._resources = [r for r in self._resources if r.alive]

    def destroy(self, tensors: Iterable[Tensor]) -> None:
        """Free everything; ``tensors`` (all of the graph's) forget their memory."""
        for res in self._resources:
            res.destroy()
        self._resources.clear()
        for t in tensors:
            t.buffer = t.image = None
