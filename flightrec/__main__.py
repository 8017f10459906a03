from flightrec.cli.commands import main

main()
