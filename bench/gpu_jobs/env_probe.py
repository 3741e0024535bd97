"""The GPU check's environment probe: versions, and what one process's CUDA context costs
beyond what PyTorch's allocator reserved (CUDA and cuBLAS up, one matmul done). Prints one
JSON object."""

import json
import os

import torch

result = {
    "torch": torch.__version__,
    "cuda": torch.version.cuda,
    "cuda_available": torch.cuda.is_available(),
}
if torch.cuda.is_available():
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    before = pynvml.nvmlDeviceGetMemoryInfo(handle).used
    a = torch.randn(1024, 1024, device="cuda")
    (a @ a).sum().item()
    torch.cuda.synchronize()
    reserved = torch.cuda.memory_reserved()
    after = pynvml.nvmlDeviceGetMemoryInfo(handle).used
    processes = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    mine = [p.usedGpuMemory for p in processes if p.pid == os.getpid()]
    result.update(
        gpu=torch.cuda.get_device_name(0),
        reserved=reserved,
        device_used_delta=after - before,
        nvml_pids=[p.pid for p in processes],
        nvml_process_used=mine[0] if mine else None,
    )
    used = mine[0] if mine and mine[0] is not None else None
    if used is None and len(processes) == 1:  # another pid namespace: the one process is us
        used = processes[0].usedGpuMemory
    result["context_bytes"] = None if used is None else used - reserved
    result["context_bytes_by_delta"] = after - before - reserved
print(json.dumps(result))
