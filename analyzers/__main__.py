"""`python -m analyzers analyze DIR` / `python -m analyzers show DIR --rank R` without the flightrec CLI."""

from .cli import main

if __name__ == "__main__":
    main()
