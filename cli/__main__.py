"""`python -m cli …`: the `tucano` console script."""
from cli.main import main

main()
