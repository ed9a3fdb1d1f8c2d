"""The `tucano` command line, one module per command group: `main` (the console script and the
root commands), `serve` (bootstrap, serve), `train`, `evaluate` (eval, eval-set), `rounds`,
`adapters` (list, promote, rollback, canary), `bench` (every benchmark), and `shared` (the
console, settings, store and progress display they all use); `python -m cli` runs `__main__`. It sits above every other package:
it imports `deploy`, `bench`, `trainer` and `demo`, and nothing imports it."""
