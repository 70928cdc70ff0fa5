"""Running work: the worker loop, device leases, frame launch and usage sampling."""
