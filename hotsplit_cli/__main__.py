from hotsplit_cli.cli import run_main

run_main()
