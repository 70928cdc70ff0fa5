"""What ``cuectl submit --dry-run`` prints: a validated ``JobSpec`` in the shape of
``job show --json`` (docs/json.md), without the keys only a stored job has (``id``,
``created_at``, ``state``, frame ids). Each job and layer carries ``frames``: how many
frames (chunks) submitting it would create."""

from __future__ import annotations

from typing import Any

from cuectl.sched.model import JobSpec


def spec_json(spec: JobSpec) -> dict[str, Any]:
    layers = []
    for layer, chunks in zip(spec.layers, spec.chunks or ((),) * len(spec.layers)):
        layers.append(
            {
                "name": layer.name,
                "command": layer.command if isinstance(layer.command, str) else list(layer.command),
                "range": layer.range,
                "chunk": layer.chunk,
                "frames": len(chunks),
                "gpus": layer.gpus,
                "gpu_vendor": layer.gpu_vendor,
                "gpu_models": list(layer.gpu_models),
                "gpu_memory_min_bytes": layer.gpu_memory_min_bytes,
                "gpu_capability_min": layer.gpu_capability_min,
                "gpu_driver_min": layer.gpu_driver_min,
                "gpu_cuda_min": layer.gpu_cuda_min,
                "cores": layer.cores,
                "memory_bytes": layer.memory_bytes,
                "retries": layer.retries,
                "timeout_s": layer.timeout_s,
                "tags": list(layer.tags),
                "depends": [{"layer": d.on, "type": d.type} for d in layer.depends],
                "env": dict(layer.env),
                "log_limit_bytes": layer.log_limit_bytes,
                "max_running": layer.max_running,
                "limits": list(layer.limits),
                "retry_delay_s": layer.retry_delay_s,
                "retry_on_gpu_oom": layer.retry_on_gpu_oom,
                "gpu_escape": layer.gpu_escape,
                "gpu_idle_limit_s": layer.gpu_idle_limit_s,
                "gpu_idle_action": layer.gpu_idle_action,
                "gpu_idle_util": layer.gpu_idle_util,
                "gpu_share_bytes": layer.gpu_share_bytes,
                "gpu_share_enforce": layer.gpu_share_enforce,
                "cwd": layer.cwd,
                # The service named (a list: the first the store has); its defaults are applied
                # when the job is submitted, not in a dry run (no store is opened).
                "service": list(layer.service) if isinstance(layer.service, tuple) else layer.service,
            }
        )
    return {
        "name": spec.name,
        "user": spec.user,
        "priority": spec.priority,
        "paused": spec.paused,
        "project": spec.project,
        "show": spec.show,
        "shot": spec.shot,
        "max_running": spec.max_running,
        "max_cores": spec.max_cores,
        "max_gpus": spec.max_gpus,
        "notify": [n.to_json() for n in spec.notify],
        "frames": sum(layer["frames"] for layer in layers),
        "layers": layers,
    }
