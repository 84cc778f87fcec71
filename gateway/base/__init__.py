"""Base types every part of the gateway may use: its core errors, option declarations, registries, ids."""
