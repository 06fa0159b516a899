"""SFT and DPO of one model on fixed rows (Rafailov et al. 2023 for DPO)."""
