"""The whole ``cuectl`` command tree: the root (``cuectl.cli.root``) with every sub-command.

Help, shell completion, tests (``CliRunner(app)``) and any invocation ``cuectl.cli.entry``
does not answer more directly use it.
"""

from __future__ import annotations

import typer

from cuectl.cli.root import AppState, CuectlGroup, new_app, root  # noqa: F401  (re-exported)

app = new_app()


def _completion(shell: str = typer.Argument(..., metavar="bash|zsh|fish", help="The shell to complete for.")) -> None:
    """Print the shell completion script for bash, zsh or fish.

    Job ids and names, frame ids, hosts, states and sub-commands then complete on <TAB>.
    bash: eval "$(cuectl completion bash)" in ~/.bashrc; zsh: eval "$(cuectl completion zsh)"
    in ~/.zshrc; fish: cuectl completion fish > ~/.config/fish/completions/cuectl.fish
    (docs/completion.md)."""
    from cuectl.cli.complete import completion_script

    typer.echo(completion_script(shell), nl=False)


def _register(app: typer.Typer) -> None:
    from cuectl.cli import admin_cmd, gpu_cmd, host_cmd, job_cmd, lease_cmds, serve_cmd, top_cmd, worker_cmd

    job_cmd.register(app)
    host_cmd.register(app)
    top_cmd.register(app)
    serve_cmd.register(app)
    worker_cmd.register(app)
    admin_cmd.register(app)
    gpu_cmd.app.command("leases", help="Who holds which local device (worker frames, `cuectl run`, the Python API).")(
        lease_cmds.leases_cmd
    )
    app.add_typer(gpu_cmd.app, name="gpu", help="This machine's GPUs and their leases (no store needed).")
    app.command(
        "run",
        context_settings={"allow_interspersed_args": False},
        help="Run a command with an exclusive lease on local GPUs (ad-hoc work beside queued frames).",
    )(lease_cmds.run_cmd)
    app.command("completion")(_completion)


_register(app)
