"""Device discovery: NVIDIA GPUs through NVML (a GPU in MIG mode contributes its instances
instead), else one ``cpu`` device sized from psutil; or N emulated devices
(``--cpu-devices N``), so that a GPU-less node schedules several devices for real, for
tests and demos."""

from __future__ import annotations

from dataclasses import dataclass

from gq import defaults


@dataclass(frozen=True)
class Device:
    name: str  # "cpu", "gpu0", "gpu1", "gpu0-mig1", ..., or "cpu0", "cpu1", ... when emulated
    kind: str  # "cpu" | "cuda" | "emulated"
    index: int | None  # the device's place among the whole devices jobs ask for
    memory_total: int
    model: str
    uuid: str | None = None  # NVML's; a MIG instance is addressed by it
    gpu: int | None = None  # the physical GPU (a MIG instance's parent)
    # NVML's topology level to every other GPU, by GPU number (0 same board, 10 one PCIe
    # switch, ... 50 across sockets; lower is closer); empty where unknown.
    links: tuple[int, ...] = ()

    @property
    def whole(self) -> bool:
        """A device jobs ask for by number (-G N): a GPU, or an emulated one."""
        return self.kind in ("cuda", "emulated")

    @property
    def mig(self) -> bool:
        return self.kind == "cuda" and self.uuid is not None and self.uuid.startswith("MIG-")


def cpu_device() -> Device:
    import platform

    import psutil

    return Device(
        name="cpu",
        kind="cpu",
        index=None,
        memory_total=psutil.virtual_memory().total,
        model=platform.processor() or platform.machine(),
    )


def discover() -> tuple[list[Device], str | None]:
    """The node's GPUs (or their MIG instances), then the ``cpu`` device; the note says why
    no GPU was found."""
    try:
        import pynvml
    except ImportError:
        return [
            cpu_device()
        ], "no NVIDIA GPU found: nvidia-ml-py is not installed (pip install 'gq[gpu]')"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return [cpu_device()], f"no NVIDIA GPU found (NVML: {exc}); jobs run on the cpu device"
    try:
        gpus = nvml_devices(pynvml)
    finally:
        pynvml.nvmlShutdown()
    if not gpus:
        return [
            cpu_device()
        ], "no NVIDIA GPU found (NVML sees 0 devices); jobs run on the cpu device"
    return gpus + [cpu_device()], None


def nvml_devices(nvml) -> list[Device]:
    """What an initialised NVML reports: each GPU, or each MIG instance of a GPU in MIG mode,
    numbered in that order."""
    count = nvml.nvmlDeviceGetCount()
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    links = [tuple(_link(nvml, handles[i], handles[j]) for j in range(count)) for i in range(count)]
    devices: list[Device] = []
    for number, handle in enumerate(handles):
        model = _text(nvml.nvmlDeviceGetName(handle))
        instances = _mig_instances(nvml, handle)
        if not instances:
            devices.append(
                Device(
                    name=f"gpu{number}",
                    kind="cuda",
                    index=len(devices),
                    memory_total=int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
                    model=model,
                    uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                    gpu=number,
                    links=links[number],
                )
            )
            continue
        for slot, instance in instances:
            devices.append(
                Device(
                    name=f"gpu{number}-mig{slot}",
                    kind="cuda",
                    index=len(devices),
                    memory_total=int(nvml.nvmlDeviceGetMemoryInfo(instance).total),
                    model=f"{model} MIG {slot}",
                    uuid=_text(nvml.nvmlDeviceGetUUID(instance)),
                    gpu=number,
                )
            )
    return devices


def _mig_instances(nvml, handle) -> list[tuple[int, object]]:
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
    except nvml.NVMLError:  # not a MIG-capable GPU
        return []
    if current != nvml.NVML_DEVICE_MIG_ENABLE:
        return []
    instances = []
    for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            instances.append((slot, nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)))
        except nvml.NVMLError:  # an empty slot
            continue
    return instances


def _link(nvml, first, second) -> int:
    if first is second:
        return 0
    try:
        return int(nvml.nvmlDeviceGetTopologyCommonAncestor(first, second))
    except nvml.NVMLError:
        return 0


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def emulated(count: int, memory_total: int, model: str | None = None) -> list[Device]:
    """``count`` devices that stand in for GPUs on the cpu, sharing ``memory_total``;
    ``model`` names them for ``--gpus TYPE:N`` (tests, demos of a typed node)."""
    return [
        Device(
            name=f"cpu{i}",
            kind="emulated",
            index=i,
            memory_total=memory_total // count,
            model=model or f"emulated device {i + 1} of {count}",
        )
        for i in range(count)
    ]


def _letters(text: str) -> str:
    return "".join(c for c in text.lower() if c.isalnum())


def of_type(devices: list[Device], gpu_type: str) -> list[Device]:
    """The whole devices whose model names the type, as Slurm's gres types name models
    (``a100`` is an "NVIDIA A100-SXM4-80GB"): letters and digits, case ignored."""
    wanted = _letters(gpu_type)
    return [d for d in devices if d.whole and wanted and wanted in _letters(d.model)]


def types(devices: list[Device]) -> list[str]:
    """The models of the node's whole devices, each once, for messages."""
    return sorted({d.model for d in devices if d.whole})


def gpu_capacity(devices: list[Device]) -> int:
    """How many devices a job may ask for: the GPUs (or emulated devices), or 1 where the
    cpu device stands in."""
    return sum(1 for d in devices if d.whole) or 1


def environment(devices: list[Device]) -> dict[str, str]:
    """The job's view of its devices: GQ_DEVICE is a torch device string;
    GQ_VISIBLE_DEVICES names its devices' indices (GPUs or emulated ones).
    CUDA_VISIBLE_DEVICES names its GPUs by UUID (``GPU-...``, ``MIG-...``), which no
    ``CUDA_DEVICE_ORDER`` of the user's can make mean another GPU."""
    gpus = [d for d in devices if d.kind == "cuda"]
    visible = ",".join(str(d.index) for d in devices if d.whole)
    if not gpus:
        return {"GQ_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": "", "GQ_VISIBLE_DEVICES": visible}
    cuda = ",".join(d.uuid or str(d.gpu if d.gpu is not None else d.index) for d in gpus)
    return {"GQ_DEVICE": "cuda:0", "CUDA_VISIBLE_DEVICES": cuda, "GQ_VISIBLE_DEVICES": visible}


def context_memory(device: Device) -> int:
    """What each job resident on the device holds beyond its figure: a CUDA context on a
    GPU (admission counts it in the job's persistent memory), nothing elsewhere."""
    return defaults.CUDA_CONTEXT if device.kind == "cuda" else 0
