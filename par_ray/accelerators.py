"""GPU types a trial may ask Ray for, and their memory: a registry as data (read by validation, the planner and the
paper preset's choice of GPU type)."""

from par_ray.hardware import DEVICES, GPU_TYPES

GPU_MEMORY_GB = {name: DEVICES[name].memory_gb for name in GPU_TYPES}
"""Ray accelerator type → GB per GPU (decimal, the product figure; read from the one device table,
``par_ray.hardware.DEVICES``, which also holds each type's peak and prices), for ``train.accelerator_type`` and the paper
preset's ``--gpu-types``. The keys are the strings Ray 2.60 uses in a node's ``accelerator_type:<type>`` resource
(``ray.util.accelerators``): on NVIDIA nodes Ray derives the type from the NVML device name
(``ray/_private/accelerators/nvidia_gpu.py``, the first model token: "NVIDIA L40S" → L40S, "NVIDIA H100 80GB HBM3"
→ H100, "NVIDIA A100-SXM4-80GB" → A100), and a cluster config may declare it for nodes not yet started. Both A100
sizes read "A100", so that key counts the 40 GB card; "A100-40G" / "A100-80G" are labels Ray never adds itself: a
node type must declare them (``resources: {"accelerator_type:A100-80G": 1}``). H100 counts the 80 GB SXM/PCIe card
(the 94 GB H100 NVL reads "H100" too); H200 is the 141 GB card. Cards without bf16 (T4, V100) are left out: the
paper preset trains in bf16."""
