"""The `flightrec` command (commands.py) and what only commands need: the demo, the notebook copy, and
where the parts beyond the recorder live (components.py). Analysis commands load lazily, so that
`dump-now` needs neither torch nor pandas."""
