"""`onceflow pipeline`: placeholder, replaced by its owner."""
