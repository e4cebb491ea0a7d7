"""The GPU Timekeeper sidecar: samples its pod's GPUs through NVML and reports numbered intervals.

Standard library plus pynvml (NVIDIA's `nvidia-ml-py`) and gpuaccounting only: it runs in every GPU pod,
so it stays small and starts fast.
"""
