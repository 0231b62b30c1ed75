"""NVML mocked as scenario fixtures, each named after the failure it covers.

The fakes reuse the real pynvml error classes and constants (importable without a driver), so
the probe's error handling is exercised exactly as on a machine.
"""

from __future__ import annotations

import pynvml
import pytest
from hotsplit_probes.nvml import probe_nvml, read_link_state

from tests.fakes.machine import FakeNvml

GIB = 1 << 30


def reasons_of(gpu) -> dict[str, str]:
    return {r.field: r.why for r in gpu.reasons}


def test_healthy_two_gpus():
    fake = FakeNvml()
    r = probe_nvml(lambda: fake)
    assert r.available and r.driver_version == "550.54.15" and len(r.gpus) == 2
    g0, g1 = r.gpus
    assert g0.name == "NVIDIA H100 80GB HBM3" and g1.pci_bus_id == "00000000:3B:00.0"
    assert g0.mem_total_bytes == 80 * GIB and g0.mem_reserved_bytes == 512 << 20
    assert (g0.pcie_gen_current, g0.pcie_gen_max, g0.pcie_gen_gpu_max, g0.pcie_width_max) == (1, 5, 5, 16)
    assert g1.numa_node == 1 and g1.cpu_affinity == tuple(range(8, 16)) and g1.memory_affinity == (1,)
    assert g0.reasons == () and g0.source == "nvml"
    assert fake.shutdowns == 1


def test_library_not_found():
    r = probe_nvml(lambda: FakeNvml({"nvmlInit": pynvml.NVML_ERROR_LIBRARY_NOT_FOUND}))
    assert not r.available and r.gpus == ()
    assert r.reason == "NVML library not found (no NVIDIA driver installed)"


def test_driver_not_loaded():
    r = probe_nvml(lambda: FakeNvml({"nvmlInit": pynvml.NVML_ERROR_DRIVER_NOT_LOADED}))
    assert not r.available and r.reason == "NVIDIA driver not loaded"


def test_bindings_not_installed():
    def load():
        raise ImportError("No module named 'pynvml'")

    r = probe_nvml(load)
    assert not r.available and "nvidia-ml-py" in r.reason


def test_not_supported_per_field():
    fake = FakeNvml({
        "nvmlDeviceGetGpuMaxPcieLinkGeneration": pynvml.NVML_ERROR_NOT_SUPPORTED,
        "nvmlDeviceGetNumaNodeId": pynvml.NVML_ERROR_NOT_SUPPORTED,
        "nvmlDeviceGetMemoryInfo_v2": pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        "nvmlDeviceGetCpuAffinity:1": pynvml.NVML_ERROR_NO_PERMISSION,
    })
    g0, g1 = probe_nvml(lambda: fake).gpus
    # The failing fields are None with a reason; everything else is intact.
    assert g0.pcie_gen_gpu_max is None and g0.numa_node is None and g0.mem_reserved_bytes is None
    assert g0.mem_total_bytes == 80 * GIB and g0.mem_free_bytes == 79 * GIB and g0.pcie_gen_max == 5
    why = reasons_of(g0)
    assert why["pcie_gen_gpu_max"] == "not supported by this GPU or driver"
    assert "driver too old" in why["mem_reserved_bytes"]
    assert g0.cpu_affinity is not None and g1.cpu_affinity is None
    assert reasons_of(g1)["cpu_affinity"].startswith("no permission")


def test_memory_unreadable_marks_every_memory_field():
    fake = FakeNvml({"nvmlDeviceGetMemoryInfo_v2": pynvml.NVML_ERROR_NOT_SUPPORTED,
                     "nvmlDeviceGetMemoryInfo": pynvml.NVML_ERROR_NO_PERMISSION})
    g0 = probe_nvml(lambda: fake).gpus[0]
    assert g0.mem_total_bytes is None and g0.mem_free_bytes is None
    assert {"mem_total_bytes", "mem_used_bytes", "mem_free_bytes", "mem_reserved_bytes"} <= set(reasons_of(g0))


def test_gpu_lost_keeps_the_other_gpus():
    fake = FakeNvml({"nvmlDeviceGetHandleByIndex:1": pynvml.NVML_ERROR_GPU_IS_LOST})
    g0, g1 = probe_nvml(lambda: fake).gpus
    assert g0.name is not None
    assert g1.index == 1 and g1.name is None and "GPU is lost" in reasons_of(g1)["mem_free_bytes"]


def test_function_missing_from_old_bindings():
    class OldBindings(FakeNvml):
        def __getattribute__(self, name):
            if name == "nvmlDeviceGetNumaNodeId":
                raise AttributeError(name)
            return super().__getattribute__(name)

    g0 = probe_nvml(lambda: OldBindings()).gpus[0]
    assert g0.numa_node is None and "nvidia-ml-py" in reasons_of(g0)["numa_node"]
    assert g0.name is not None


def test_no_gpus():
    r = probe_nvml(lambda: FakeNvml(count=0))
    assert not r.available and r.reason == "NVML sees no GPU"


def test_link_state_sampling():
    assert read_link_state("00000000:19:00.0", lambda: FakeNvml()) == (1, 16, None)
    s = read_link_state("x", lambda: FakeNvml({"nvmlInit": pynvml.NVML_ERROR_DRIVER_NOT_LOADED}))
    assert (s.gen, s.width) == (None, None) and "driver not loaded" in s.reason


class BrokenInitNvml(FakeNvml):
    """nvmlInit fails with something other than an NVMLError (a half-installed library)."""

    def nvmlInit(self):
        raise OSError("libnvidia-ml.so.1: cannot open shared object file")


def test_link_state_keeps_the_reason_of_any_failure():
    s = read_link_state("x", BrokenInitNvml)
    assert (s.gen, s.width) == (None, None) and "libnvidia-ml.so.1: cannot open" in s.reason

    def no_module():
        raise ImportError("No module named 'pynvml'")

    s = read_link_state("x", no_module)
    assert (s.gen, s.width) == (None, None) and "No module named 'pynvml'" in s.reason
    s = read_link_state("x", lambda: FakeNvml({"nvmlDeviceGetCurrPcieLinkWidth": pynvml.NVML_ERROR_NOT_SUPPORTED}))
    assert s.gen == 1 and s.width is None and s.reason == "width: not supported by this GPU or driver"


@pytest.mark.parametrize("code, text", [
    (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, "versions differ"),
    (pynvml.NVML_ERROR_UNKNOWN, "NVML error"),
])
def test_other_init_failures_are_reasons(code, text):
    r = probe_nvml(lambda: FakeNvml({"nvmlInit": code}))
    assert not r.available and text in r.reason
