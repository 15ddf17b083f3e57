"""Submitting work and waiting for it: the one one-shot submission every caller uses."""

from __future__ import annotations

import time
from typing import Sequence

from .command import CommandBuffer, CommandPool
from .device import Device
from .sync import DEFAULT_TIMEOUT_S, Fence


def submit_and_wait(device: Device, cmds: Sequence[CommandBuffer], fence: Fence,
                    timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Submit ``cmds`` signalling ``fence`` (unsignalled) and block until it signals;
    :class:`~vkgraph.errors.FenceTimeoutError` after ``timeout_s`` seconds."""
    device.submit(cmds, fence)
    fence.wait(timeout_s)


class OneShot:
    """A command buffer recorded, submitted and waited for once, then freed::

        with OneShot(device) as cmd:
            cmd.copy_buffer(src, dst)

    Leaving the block normally ends the recording, submits it and waits for its fence (raising
    FenceTimeoutError after ``timeout_s``); leaving it with an error submits nothing. The pool,
    the command buffer and the fence are destroyed either way. ``submitted_ns`` and
    ``completed_ns`` are the host's ``perf_counter_ns`` just before the submit and just after the
    wait."""

    def __init__(self, device: Device, timeout_s: float = DEFAULT_TIMEOUT_S):
        self.device = device
        self.timeout_s = timeout_s
        self.submitted_ns = self.completed_ns = 0

    def __enter__(self) -> CommandBuffer:
        self._pool = CommandPool(self.device, transient=True)
        try:
            (self._cmd,) = self._pool.allocate()
            self._fence = Fence(self.device)
            self._cmd.begin(one_time=True)
        except BaseException:
            self._pool.destroy()
            raise
        return self._cmd

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                self._cmd.end()
                self.submitted_ns = time.perf_counter_ns()
                submit_and_wait(self.device, [self._cmd], self._fence, self.timeout_s)
                self.completed_ns = time.perf_counter_ns()
        finally:
            self._fence.destroy()
            self._pool.destroy()
