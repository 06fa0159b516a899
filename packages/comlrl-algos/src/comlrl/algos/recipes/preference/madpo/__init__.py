"""Multi-agent DPO (MADPO): reward-gap pairs of joint actions and a DPO step per agent."""
