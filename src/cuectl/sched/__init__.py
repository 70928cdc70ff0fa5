"""Scheduling: the job model, frame ranges, job specs, device matching and the stores."""
