"""The preference recipes (SFT, DPO, MADPO, MARLHF): configs and loops (`recipe`) and trainer objects (`trainers`)."""
