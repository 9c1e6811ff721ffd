"""The wiring: the `parley` command (`launch.cli`) and the one-machine supervisor behind
`make run` (`launch.dev`). Imports every layer, so nothing in the product imports it."""
