from cuectl.cli.main import run

run()
