"""The typer command layer: parse, call the library, render, map errors to exit codes.

``entry`` (the console script and its typer-free fast paths), ``root`` (the root command,
global options), ``guard`` (errors to ``error:`` lines and exit codes, in one place),
``main`` (the whole command tree), ``term`` (all terminal output); one module per command
group: ``job_cmd`` (submit, job, frame), ``worker_cmd``, ``host_cmd``, ``gpu_cmd``,
``lease_cmds`` (run, gpu leases), ``admin_cmd``, ``migrate_cmd``, ``report_cmd`` with
``report_view``, ``serve_cmd``, ``top_cmd``; ``submit_flags`` (the flag-form job, typer-free)
and ``complete`` (shell completion).
"""
