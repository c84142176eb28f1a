"""`onceflow outbox`: placeholder, replaced by its owner."""
