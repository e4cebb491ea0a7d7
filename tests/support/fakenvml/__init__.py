"""A fake `libnvidia-ml.so.1` built from C against NVIDIA's nvml.h, driven by a scenario file."""
