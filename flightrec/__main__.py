from flightrec.cli import main

main()
