import glob
import json
import os

import pytest

from vkgraph import cli
from vkgraph.errors import DeviceNotFoundError
from vkgraph.paths import bundled_icds
from vkgraph.runtime import Buffer, CommandPool, Device, Fence, live_objects


def test_device_facts(device):
    assert device.queue is not None
    assert device.limits["maxStorageBufferRange"] > 0
    assert len(device.limits["maxComputeWorkGroupSize"]) == 3
    if "llvmpipe" in device.name:
        assert device.host_visible_device_local
        assert device.has_external_memory_host
        assert device.has_timeline_semaphore


def test_a_cpu_renderer_knows_its_worker_threads(device, monkeypatch):
    """One per CPU the process may run on, as the renderers start them; lavapipe's LP_NUM_THREADS
    where set (0: the queue's thread alone, counted as one); 0 on a GPU."""
    if not device.is_cpu:
        assert device.cpu_threads == 0
        return
    monkeypatch.delenv("LP_NUM_THREADS", raising=False)
    assert device.cpu_threads == len(os.sched_getaffinity(0))
    if device.renderer == "lavapipe":
        for value, threads in (("3", 3), ("0", 1)):
            monkeypatch.setenv("LP_NUM_THREADS", value)
            assert device.cpu_threads == threads


def test_select_by_name_substring_is_case_insensitive(device):
    with Device(device.name[:4].swapcase(), validation=True) as other:
        assert other.name == device.name


def test_select_unknown_name_lists_devices(device):
    with pytest.raises(DeviceNotFoundError, match="no Vulkan device matches 'no-such-gpu'.*available"):
        Device("no-such-gpu")


def test_select_by_env(device, monkeypatch):
    monkeypatch.setenv("VKGRAPH_DEVICE", "no-such-gpu")
    with pytest.raises(DeviceNotFoundError, match="no-such-gpu"):
        Device()


def _icd_of(device):
    files = os.environ.get("VK_DRIVER_FILES") or os.environ.get("VK_ICD_FILENAMES")
    if files:
        return files.split(os.pathsep)[0]
    if device.physical.renderer == "lavapipe":
        found = glob.glob("/usr/share/vulkan/icd.d/lvp_icd*.json")
        return found[0] if found else None
    icd = bundled_icds().get(device.physical.renderer)
    return str(icd) if icd else None


def test_select_by_icd_json(device):
    icd = _icd_of(device)
    if icd is None:
        pytest.skip("the ICD file of this device is unknown (set VK_DRIVER_FILES)")
    env_before = dict(os.environ)
    with Device(icd, validation=True) as other:
        assert other.name == device.name
    assert dict(os.environ) == env_before  # the loader override is temporary


def test_missing_icd_file():
    with pytest.raises(DeviceNotFoundError, match="ICD file /nonexistent/icd.json does not exist"):
        Device("/nonexistent/icd.json")


def test_teardown_destroys_children_newest_first(device):
    baseline = live_objects()
    dev = Device(validation=True)
    bufs = [Buffer(dev, 256 * (i + 1)) for i in range(3)]
    (cmd,) = CommandPool(dev).allocate()
    fence = Fence(dev)
    assert dev.allocated_nbytes >= 256 * 6
    dev.destroy()
    assert not any(o.alive for o in (*bufs, cmd, cmd.pool, fence, dev, dev.instance))
    assert live_objects() == baseline
    assert dev.allocated_nbytes == 0
    dev.destroy()  # idempotent
    bufs[0].destroy()


def test_info_json_shape(device, capsys):
    assert cli.main(["info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    names = [d["name"] for d in info["devices"]]
    assert device.name in names
    d = info["devices"][names.index(device.name)]
    for key in ("name", "driver", "api_version", "host_visible_device_local", "extensions", "limits"):
        assert key in d
    assert d["limits"]["maxStorageBufferRange"] == device.limits["maxStorageBufferRange"]
    assert "maxComputeWorkGroupSize" in d["limits"]
    if "llvmpipe" in device.name:
        assert d["host_visible_device_local"] is True
        assert "VK_EXT_external_memory_host" in d["extensions"]


def test_smoke_command(device, capsys):
    assert cli.main(["smoke", "-n", "5000", "--device", device.name, "--validation"]) == 0
    out = capsys.readouterr().out
    assert device.name in out and "-> OK" in out
