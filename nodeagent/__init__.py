"""The node agent: one per GPU node, it tells each pod's sidecar which GPUs are the pod's and what the
pod's own processes do on them (kubelet PodResources, NVML, /proc/<pid>/cgroup)."""
