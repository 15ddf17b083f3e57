from types import SimpleNamespace

import pytest

from vkgraph.errors import DeviceNotFoundError
from vkgraph.runtime.device import is_icd_path, select_physical_device
from vkgraph.runtime.instance import MemoryHeap, MemoryType, PhysicalDevice
from vkgraph.runtime.memory import MemoryKind, select_memory_type

DL, HV, HC, HCACHED = 0x1, 0x2, 0x4, 0x8


def fake_physical(types, heaps):
    p = SimpleNamespace(
        memory_types=[MemoryType(i, f, h) for i, (f, h) in enumerate(types)],
        memory_heaps=[MemoryHeap(i, size, local) for i, (size, local) in enumerate(heaps)],
    )
    p.host_visible_memory_type = PhysicalDevice._host_visible_device_local_type(p)
    p.host_visible_device_local = p.host_visible_memory_type is not None
    return p


# A discrete GPU: VRAM, system RAM, and a 256 MiB BAR window (DEVICE_LOCAL|HOST_VISIBLE).
DISCRETE = fake_physical(
    [(DL, 0), (HV | HC, 1), (HV | HC | HCACHED, 1), (DL | HV | HC, 2)],
    [(16 << 30, True), (32 << 30, False), (256 << 20, True)],
)
# lavapipe / mobile: one heap, everything host-visible.
UMA = fake_physical([(DL | HV | HC | HCACHED, 0)], [(2 << 30, True)])
ALL = 0xFFFFFFFF


def test_discrete_gpu_choices():
    assert not DISCRETE.host_visible_device_local  # the BAR window does not count
    assert select_memory_type(DISCRETE, ALL, MemoryKind.DEVICE).index == 0
    assert select_memory_type(DISCRETE, ALL, MemoryKind.UPLOAD).index == 1
    assert select_memory_type(DISCRETE, ALL, MemoryKind.READBACK).index == 2
    # Respect memoryTypeBits.
    assert select_memory_type(DISCRETE, 0b1000, MemoryKind.DEVICE).index == 3
    assert select_memory_type(DISCRETE, 0b1000, MemoryKind.UPLOAD).index == 3


def test_uma_choices():
    assert UMA.host_visible_device_local
    for kind in MemoryKind:
        assert select_memory_type(UMA, ALL, kind).index == 0


def test_resizable_bar_makes_device_local_host_visible():
    rebar = fake_physical([(DL, 0), (HV | HC, 1), (DL | HV | HC, 0)], [(16 << 30, True), (32 << 30, False)])
    assert rebar.host_visible_device_local
    assert select_memory_type(rebar, ALL, MemoryKind.DEVICE).index == 2


def test_no_host_visible_memory_for_staging():
    from vkgraph.errors import OutOfDeviceMemoryError

    with pytest.raises(OutOfDeviceMemoryError, match="no host-visible coherent memory type for a upload buffer"):
        select_memory_type(DISCRETE, 0b0001, MemoryKind.UPLOAD)


def _devs(*named, bundled=()):
    inst = SimpleNamespace(bundled_renderers=list(bundled))
    return [SimpleNamespace(name=n, renderer=r, instance=inst) for n, r in named]


def test_select_physical_device():
    devs = _devs(("NVIDIA GeForce RTX 4090", "NVIDIA"), ("llvmpipe (LLVM 15.0.6, 256 bits)", "lavapipe"))
    assert select_physical_device(devs, None) is devs[0]
    assert select_physical_device(devs, "LLVMPIPE") is devs[1]
    assert select_physical_device(devs, "lavapipe") is devs[1]
    assert select_physical_device(devs, "/usr/share/vulkan/icd.d/lvp_icd.x86_64.json") is devs[0]
    with pytest.raises(DeviceNotFoundError, match="'swiftshader'.*'NVIDIA GeForce RTX 4090' \\(NVIDIA\\), 'llvmpipe"):
        select_physical_device(devs, "swiftshader")
    with pytest.raises(DeviceNotFoundError, match="no Vulkan device found"):
        select_physical_device([], None)


def test_devices_of_bundled_icds_come_last_unless_asked_for():
    devs = _devs(("SwiftShader Device (Subzero)", "swiftshader"), ("llvmpipe (LLVM 15.0.6, 256 bits)", "lavapipe"),
                 bundled=["swiftshader"])
    assert select_physical_device(devs, None) is devs[1]
    assert select_physical_device(devs, "swiftshader") is devs[0]
    assert select_physical_device(devs[:1], None) is devs[0]  # the only device


def test_is_icd_path():
    assert is_icd_path("lvp_icd.x86_64.json")
    assert is_icd_path("/opt/icd/vk_swiftshader_icd.json")
    assert not is_icd_path("llvmpipe")


def test_lavapipe_runs_512_bits_wide_on_avx512_hosts_unless_the_user_says(monkeypatch, tmp_path):
    """On a host with full-width AVX-512 vkgraph sets LP_NATIVE_VECTOR_WIDTH=512 and gives those
    shaders a Mesa cache of their own (its directory made, parents too), as it does a width other
    than Mesa's 256 that the user set; a width, cache directory or disabled cache the user set
    stays as set, and a host without such AVX-512 is otherwise left alone."""
    from vkgraph.runtime import instance

    keys = ("LP_NATIVE_VECTOR_WIDTH", "MESA_SHADER_CACHE_DIR", "MESA_GLSL_CACHE_DIR", "MESA_SHADER_CACHE_DISABLE")
    for k in keys:
        monkeypatch.delenv(k, raising=False)
    cache = tmp_path / "home" / ".cache" / "vkgraph"  # none of it there yet: a fresh machine
    monkeypatch.setenv("VKGRAPH_CACHE_DIR", str(cache))
    monkeypatch.setattr(instance, "_wide_avx512", lambda: True)
    instance.configure_lavapipe()
    assert instance.os.environ["LP_NATIVE_VECTOR_WIDTH"] == "512"
    assert instance.os.environ["MESA_SHADER_CACHE_DIR"] == str(cache / "mesa-lavapipe-512")
    assert (cache / "mesa-lavapipe-512").is_dir()  # Mesa makes only the last directory itself

    monkeypatch.setenv("LP_NATIVE_VECTOR_WIDTH", "256")
    monkeypatch.setenv("MESA_SHADER_CACHE_DIR", "/elsewhere")
    instance.configure_lavapipe()
    assert (instance.os.environ["LP_NATIVE_VECTOR_WIDTH"], instance.os.environ["MESA_SHADER_CACHE_DIR"]) == ("256", "/elsewhere")

    monkeypatch.delenv("LP_NATIVE_VECTOR_WIDTH")
    monkeypatch.delenv("MESA_SHADER_CACHE_DIR")
    monkeypatch.setenv("MESA_SHADER_CACHE_DISABLE", "true")
    instance.configure_lavapipe()
    assert instance.os.environ["LP_NATIVE_VECTOR_WIDTH"] == "512" and "MESA_SHADER_CACHE_DIR" not in instance.os.environ

    for k in keys:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(instance, "_wide_avx512", lambda: False)
    instance.configure_lavapipe()
    assert not any(k in instance.os.environ for k in keys)

    # a width the user asks for: its own cache too, unless it is Mesa's default
    monkeypatch.setenv("LP_NATIVE_VECTOR_WIDTH", "512")
    instance.configure_lavapipe()
    assert instance.os.environ["MESA_SHADER_CACHE_DIR"] == str(cache / "mesa-lavapipe-512")
    monkeypatch.delenv("MESA_SHADER_CACHE_DIR")
    monkeypatch.setenv("LP_NATIVE_VECTOR_WIDTH", "256")
    instance.configure_lavapipe()
    assert "MESA_SHADER_CACHE_DIR" not in instance.os.environ


@pytest.mark.parametrize("vendor, family, flags, wide", [
    ("AuthenticAMD", 26, "fma avx2 avx512f avx512bw", True),  # Zen 5: 512-bit units
    ("GenuineIntel", 6, "fma avx2 avx512f avx512bw", True),
    ("AuthenticAMD", 25, "fma avx2 avx512f avx512bw", False),  # Zen 4: AVX-512 in 256-bit halves
    ("AuthenticAMD", 25, "fma avx2", False),  # Zen 3
    ("GenuineIntel", 6, "fma avx2 avx512_vnni", False),  # no avx512f
])
def test_wide_avx512_reads_the_processor(tmp_path, vendor, family, flags, wide):
    """lavapipe goes to 512 bits only where the processor runs AVX-512 at full width
    (instance.HALF_WIDTH_AVX512: Zen 4 decoded and packed faster at 256); the first processor's
    lines count, and a missing /proc/cpuinfo means no."""
    from vkgraph.runtime import instance

    cpu = f"vendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: 17\nflags\t\t: fpu {flags}\n"
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\n{cpu}\nprocessor\t: 1\nvendor_id\t: Other\nflags\t\t: avx512f\n")
    assert instance._wide_avx512(str(path)) is wide
    assert not instance._wide_avx512(str(tmp_path / "none"))
