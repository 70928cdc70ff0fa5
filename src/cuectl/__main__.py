from cuectl.cli.entry import run

run()
