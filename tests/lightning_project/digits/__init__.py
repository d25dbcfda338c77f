"""digits: a Lightning-style project (Hydra configs, a data module, torchmetrics) on plait."""
