"""MARLHF: a joint reward model fit on reward-gap pairs, then an RL recipe on its reward."""
