"""Device discovery: NVIDIA GPUs through NVML, else one ``cpu`` device sized from psutil;
or N emulated devices (``--cpu-devices N``), so that a GPU-less node schedules several
devices for real, for tests and demos."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Device:
    name: str  # "cpu", "gpu0", "gpu1", ..., or "cpu0", "cpu1", ... when emulated
    kind: str  # "cpu" | "cuda" | "emulated"
    index: int | None
    memory_total: int
    model: str

    @property
    def whole(self) -> bool:
        """A device jobs ask for by number (-G N): a GPU, or an emulated one."""
        return self.kind in ("cuda", "emulated")

    def as_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind, "index": self.index,
                "memory_total": self.memory_total, "model": self.model}


def cpu_device() -> Device:
    import platform

    import psutil

    return Device(name="cpu", kind="cpu", index=None,
                  memory_total=psutil.virtual_memory().total,
                  model=platform.processor() or platform.machine())


def discover() -> tuple[list[Device], str | None]:
    """The node's GPUs, then the ``cpu`` device; the note says why no GPU was found."""
    try:
        import pynvml
    except ImportError:
        return [cpu_device()], "no NVIDIA GPU found: nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return [cpu_device()], f"no NVIDIA GPU found (NVML: {exc}); jobs run on the cpu device"
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            gpus.append(Device(
                name=f"gpu{index}", kind="cuda", index=index,
                memory_total=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
                model=name.decode() if isinstance(name, bytes) else str(name),
            ))
    finally:
        pynvml.nvmlShutdown()
    if not gpus:
        return [cpu_device()], "no NVIDIA GPU found (NVML sees 0 devices); jobs run on the cpu device"
    return gpus + [cpu_device()], None


def emulated(count: int, memory_total: int) -> list[Device]:
    """``count`` devices that stand in for GPUs on the cpu, sharing ``memory_total``."""
    return [Device(name=f"cpu{i}", kind="emulated", index=i, memory_total=memory_total // count,
                   model=f"emulated device {i + 1} of {count}") for i in range(count)]


def gpu_capacity(devices: list[Device]) -> int:
    """How many devices a job may ask for: the GPUs (or emulated devices), or 1 where the
    cpu device stands in."""
    return sum(1 for d in devices if d.whole) or 1


def environment(devices: list[Device]) -> dict[str, str]:
    """The job's view of its devices: GQ_DEVICE is a torch device string;
    GQ_VISIBLE_DEVICES names its devices' indices (GPUs or emulated ones), as
    CUDA_VISIBLE_DEVICES does for GPUs."""
    gpus = [d for d in devices if d.kind == "cuda"]
    visible = ",".join(str(d.index) for d in devices if d.whole)
    if not gpus:
        return {"GQ_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": "", "GQ_VISIBLE_DEVICES": visible}
    return {"GQ_DEVICE": "cuda:0", "CUDA_VISIBLE_DEVICES": visible, "GQ_VISIBLE_DEVICES": visible}
