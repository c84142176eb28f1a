from onceflow.cli.entry import main

main()
