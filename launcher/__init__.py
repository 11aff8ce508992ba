"""The ELFES orchestrator (job specs, executors, in-job runtime). Arrives with its own issues."""
