"""Fakes shared by the tests of several packages: a fake machine (sysfs tree, NVML, CUDA,
timings) and tiny Hugging Face checkpoints built offline."""
