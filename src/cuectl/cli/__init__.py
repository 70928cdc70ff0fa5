"""The typer command layer: parse, call the library, render, map errors to exit codes."""
