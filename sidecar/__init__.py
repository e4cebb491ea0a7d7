"""The GPU Timekeeper sidecar: samples its pod's GPUs through NVML and reports numbered intervals. It runs in
every GPU pod, so it imports the standard library, pynvml and gpuaccounting only."""
