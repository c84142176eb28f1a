from onceflow.cli.app import main

main()
