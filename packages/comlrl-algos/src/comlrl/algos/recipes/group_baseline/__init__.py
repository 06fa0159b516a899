"""The group-baseline recipe family (MAGRPO, MARLOO, MAReMax, MAREINFORCE): its config and loop (`recipe`) and its trainer object (`trainer`)."""
