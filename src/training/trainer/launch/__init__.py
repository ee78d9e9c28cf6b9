"""From a command line or a recipe to a started run: the flags to a checked `RunConfig` (`params`, `config`,
`tool_flags` for the tools), the named recipes (`recipes`), the checks before any work (`startup`), resuming
from a checkpoint (`resume`), the run folder as a launch sets it up (`folder`), and the run itself, one object
built from the `RunConfig` that owns it from start to summary (`trainer.Trainer`)."""
