"""The actor-critic recipe family (IAC, MAAC): its config and loop (`recipe`) and its trainer object (`trainer`)."""
