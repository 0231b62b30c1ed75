"""NVML (nvidia-ml-py, imported lazily): what the driver says about each GPU, field by field.

Every field is read on its own: "not supported" on one field (common on consumer cards and in
VMs) leaves that field None with a reason and the rest of the GPU intact. A failed `nvmlInit`
(no library, driver not loaded) gives an unavailable report, never an exception.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from .common import DriverReport, GpuDevice, Reason, mask_to_ids

MIB = 1 << 20

# Affinity masks are read in 64-bit words; 16 words cover 1024 CPUs / NUMA nodes.
_MASK_WORDS = 16


def nvml_reason(nvml: Any, exc: BaseException) -> str:
    """A short, actionable reason for an NVML error (by code, so no library call is needed)."""
    if isinstance(exc, AttributeError):
        return "not available in this nvidia-ml-py version"
    value = getattr(exc, "value", None)
    known = {
        "NVML_ERROR_NOT_SUPPORTED": "not supported by this GPU or driver",
        "NVML_ERROR_NO_PERMISSION": "no permission (run as a user allowed to query the GPU)",
        "NVML_ERROR_FUNCTION_NOT_FOUND": "not in this driver's NVML (driver too old)",
        "NVML_ERROR_LIBRARY_NOT_FOUND": "NVML library not found (no NVIDIA driver installed)",
        "NVML_ERROR_DRIVER_NOT_LOADED": "NVIDIA driver not loaded",
        "NVML_ERROR_GPU_IS_LOST": "GPU is lost (fell off the bus)",
        "NVML_ERROR_LIB_RM_VERSION_MISMATCH": "NVML library and kernel driver versions differ (reboot or reload)",
        "NVML_ERROR_UNINITIALIZED": "NVML not initialised",
    }
    for const, text in known.items():
        if value is not None and value == getattr(nvml, const, object()):
            return text
    return f"NVML error {value}" if value is not None else f"{type(exc).__name__}: {exc}"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class _FieldReader:
    """Calls one NVML getter per field, turning NVMLError into (None, Reason)."""

    def __init__(self, nvml: Any):
        self.nvml = nvml
        self.reasons: list[Reason] = []

    def read(self, field: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except (self.nvml.NVMLError, AttributeError) as exc:
            self.reasons.append(Reason(field, nvml_reason(self.nvml, exc)))
            return None


def _read_gpu(nvml: Any, index: int) -> GpuDevice:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    f = _FieldReader(nvml)
    name = f.read("name", lambda: _text(nvml.nvmlDeviceGetName(handle)))
    uuid = f.read("uuid", lambda: _text(nvml.nvmlDeviceGetUUID(handle)))
    bus_id = f.read("pci_bus_id", lambda: _text(nvml.nvmlDeviceGetPciInfo(handle).busId))
    total = used = free = reserved = None
    try:
        # v2 adds `reserved` (driver/firmware memory); older drivers only have v1.
        mem = nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2)
        total, used, free, reserved = int(mem.total), int(mem.used), int(mem.free), int(mem.reserved)
    except (nvml.NVMLError, AttributeError, TypeError) as exc_v2:
        try:
            mem = nvml.nvmlDeviceGetMemoryInfo(handle)
            total, used, free = int(mem.total), int(mem.used), int(mem.free)
            f.reasons.append(Reason("mem_reserved_bytes", f"memory info v2 {nvml_reason(nvml, exc_v2)}"))
        except nvml.NVMLError as exc:
            why = nvml_reason(nvml, exc)
            f.reasons.extend(Reason(k, why) for k in ("mem_total_bytes", "mem_used_bytes", "mem_free_bytes",
                                                      "mem_reserved_bytes"))
    gen_cur = f.read("pcie_gen_current", lambda: int(nvml.nvmlDeviceGetCurrPcieLinkGeneration(handle)))
    gen_max = f.read("pcie_gen_max", lambda: int(nvml.nvmlDeviceGetMaxPcieLinkGeneration(handle)))
    gen_gpu = f.read("pcie_gen_gpu_max", lambda: int(nvml.nvmlDeviceGetGpuMaxPcieLinkGeneration(handle)))
    width_cur = f.read("pcie_width_current", lambda: int(nvml.nvmlDeviceGetCurrPcieLinkWidth(handle)))
    width_max = f.read("pcie_width_max", lambda: int(nvml.nvmlDeviceGetMaxPcieLinkWidth(handle)))
    numa = f.read("numa_node", lambda: int(nvml.nvmlDeviceGetNumaNodeId(handle)))
    if numa is not None and numa < 0:
        f.reasons.append(Reason("numa_node", "driver reports no NUMA affinity (-1)"))
        numa = None
    cpus = f.read("cpu_affinity", lambda: mask_to_ids(nvml.nvmlDeviceGetCpuAffinity(handle, _MASK_WORDS)))
    nodes = f.read("memory_affinity", lambda: mask_to_ids(
        nvml.nvmlDeviceGetMemoryAffinity(handle, _MASK_WORDS, nvml.NVML_AFFINITY_SCOPE_NODE)))
    return GpuDevice(index, name, uuid, bus_id, total, used, free, reserved, gen_cur, gen_max, gen_gpu,
                     width_cur, width_max, numa, cpus or None, nodes or None, "nvml", tuple(f.reasons))


def import_pynvml() -> Any:
    import pynvml

    return pynvml


def probe_nvml(load: Callable[[], Any] = import_pynvml) -> DriverReport:
    """Every GPU NVML sees. `load` returns the pynvml module (tests pass a scenario fake)."""
    try:
        nvml = load()
    except ImportError:
        return DriverReport("nvml", False, None, (), "nvidia-ml-py is not installed (pip install nvidia-ml-py)")
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        return DriverReport("nvml", False, None, (), nvml_reason(nvml, exc))
    try:
        driver = _FieldReader(nvml).read("driver_version", lambda: _text(nvml.nvmlSystemGetDriverVersion()))
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as exc:
            return DriverReport("nvml", False, driver, (), f"cannot count GPUs: {nvml_reason(nvml, exc)}")
        gpus = []
        for i in range(count):
            try:
                gpus.append(_read_gpu(nvml, i))
            except nvml.NVMLError as exc:
                # A GPU whose handle cannot be opened is still listed, every field with the reason.
                why = f"cannot open GPU {i}: {nvml_reason(nvml, exc)}"
                gpus.append(GpuDevice.unreadable(i, why, "nvml"))
        reason = None if gpus else "NVML sees no GPU"
        return DriverReport("nvml", bool(gpus), driver, tuple(gpus), reason)
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass


class LinkState(NamedTuple):
    """The PCIe link of one GPU at one moment; `reason` says why a field is None."""

    gen: int | None
    width: int | None
    reason: str | None = None


def read_link_state(pci_bus_id: str, load: Callable[[], Any] = import_pynvml) -> LinkState:
    """Current PCIe generation and width of one GPU, e.g. while a copy keeps the link busy."""
    try:
        nvml = load()
    except Exception as exc:  # noqa: BLE001 - any failure means "cannot sample", never a crash
        return LinkState(None, None, f"cannot load nvidia-ml-py ({type(exc).__name__}: {exc})")
    try:
        nvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - as above; the reason is kept
        return LinkState(None, None, f"nvmlInit: {nvml_reason(nvml, exc)}")
    try:
        handle = nvml.nvmlDeviceGetHandleByPciBusId(pci_bus_id)
        f = _FieldReader(nvml)
        gen = f.read("generation", lambda: int(nvml.nvmlDeviceGetCurrPcieLinkGeneration(handle)))
        width = f.read("width", lambda: int(nvml.nvmlDeviceGetCurrPcieLinkWidth(handle)))
        return LinkState(gen, width, "; ".join(f"{r.field}: {r.why}" for r in f.reasons) or None)
    except nvml.NVMLError as exc:
        return LinkState(None, None, f"GPU {pci_bus_id}: {nvml_reason(nvml, exc)}")
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass
