"""GPU discovery and sampling backends (nvml, smi, apple, amd, fake)."""
