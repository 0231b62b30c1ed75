"""Measure the platform: one module per source, each returning frozen dataclasses, never printing.

nvml, nvidia_smi, sysfs, numastat, host, cuda (what the machine says about itself);
placement and bandwidth (what it actually does); platform (the assembled report, platform.json).
A field that cannot be read is None with a `Reason`, never an exception that sinks the report.
"""
