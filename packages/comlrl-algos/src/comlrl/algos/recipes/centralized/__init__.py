"""The centralized recipes: one joint policy plays every role of a task (its run configs
and end-to-end runs in `run`)."""
