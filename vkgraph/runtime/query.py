"""Timestamp query pools: GPU time of command-buffer spans, and the offset that puts device
timestamps on the host's clock."""

from __future__ import annotations

from ..errors import UnsupportedFeatureError
from ._vk import call, ffi, vk
from .command import Stage
from .device import Device
from .handle import VkObject
from .submit import OneShot
from .sync import DEFAULT_TIMEOUT_S


class TimestampQueryPool(VkObject):
    """``count`` timestamp queries. Reset them in a command buffer (``reset_query_pool``) before
    writing; read them with :meth:`results_ns` once that work has completed."""

    def __init__(self, device: Device, count: int):
        phys = device.physical
        if not phys.timestamps_supported:
            raise UnsupportedFeatureError("timestampValidBits", f"{device.name} has no timestamps on its compute queue")
        if count <= 0:
            raise ValueError(f"a query pool needs count > 0, got {count}")
        self.device = device
        self.count = count
        self.period_ns = phys.timestamp_period_ns
        bits = phys.timestamp_valid_bits
        self._mask = (1 << bits) - 1 if bits < 64 else (1 << 64) - 1
        info = vk.VkQueryPoolCreateInfo(queryType=vk.VK_QUERY_TYPE_TIMESTAMP, queryCount=count)
        dev = device.handle
        self.handle = handle = call(vk.vkCreateQueryPool, dev, info, None)
        self._own(device, lambda: vk.vkDestroyQueryPool(dev, handle, None))

    def results_ns(self, first: int = 0, count: int | None = None) -> list[float]:
        """Timestamps in nanoseconds (device clock; only differences are meaningful). Waits
        for the queries to be available."""
        count = self.count - first if count is None else count
        if first < 0 or count <= 0 or first + count > self.count:
            raise ValueError(f"queries [{first}, {first + count}) are outside the pool's {self.count}")
        out = ffi.new("uint64_t[]", count)
        flags = vk.VK_QUERY_RESULT_64_BIT | vk.VK_QUERY_RESULT_WAIT_BIT
        call(vk.vkGetQueryPoolResults, self.device.handle, self.handle, first, count, 8 * count, out, 8, flags)
        return [(int(t) & self._mask) * self.period_ns for t in out]


def host_clock_offset_ns(device: Device, timeout_s: float = DEFAULT_TIMEOUT_S) -> float:
    """Host ``perf_counter_ns`` minus device timestamp nanoseconds, measured once per device with
    one timestamp written between a submit and its fence (error below half that round trip)."""
    if device.clock_offset_ns is None:
        with TimestampQueryPool(device, 1) as qp:
            shot = OneShot(device, timeout_s)
            with shot as cmd:
                cmd.reset_query_pool(qp)
                cmd.write_timestamp(qp, 0, Stage.BOTTOM_OF_PIPE)
            (dev_ns,) = qp.results_ns()
        device.clock_offset_ns = (shot.submitted_ns + shot.completed_ns) / 2 - dev_ns
    return device.clock_offset_ns
