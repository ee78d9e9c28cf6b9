"""From a command line or a recipe to a started run: the flags to a checked `RunConfig` (`params`, `config`,
`tool_flags` for the tools), the named recipes (`recipes`), the checks before any work (`startup`), resuming
from a checkpoint (`resume`, `resume_changes`) and the run folder as a launch sets it up (`folder`)."""
