"""Device discovery: NVIDIA GPUs through NVML, else one ``cpu`` device sized from psutil."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Device:
    name: str  # "cpu", "gpu0", "gpu1", ...
    kind: str  # "cpu" | "cuda"
    index: int | None
    memory_total: int
    model: str

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


def gpu_capacity(devices: list[Device]) -> int:
    """How many GPUs a job may ask for: the GPUs, or 1 where the cpu device stands in."""
    return sum(1 for d in devices if d.kind == "cuda") or 1


def environment(devices: list[Device]) -> dict[str, str]:
    """The job's view of its devices: GQ_DEVICE is a torch device string."""
    gpus = [d for d in devices if d.kind == "cuda"]
    if not gpus:
        return {"GQ_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": ""}
    return {"GQ_DEVICE": "cuda:0", "CUDA_VISIBLE_DEVICES": ",".join(str(d.index) for d in gpus)}
