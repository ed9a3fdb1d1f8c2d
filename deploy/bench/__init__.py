"""`tucano bench …`: the performance and learning benchmarks, one module each (`rewards`,
`gateway`, `train`, `learn`), every result written by `results.write` as JSON and Markdown under
`<data dir>/bench/`."""
